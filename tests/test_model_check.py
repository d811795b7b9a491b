"""The protocol model-checked: every interleaving of workers, an operator, a reconcile hook,
forged proofs, lost replies and the database clock, up to a bound, on the real ``decide``
(``effectgate.verify.model`` / ``explore``). Zero violations on main; each of the five fixes of
the kernel issue reverted in turn is found, with a shortest, readable schedule that becomes a
regression test. States explored and time per bound are printed (``-s``) and recorded as
properties (``--junitxml``)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest

from effectgate import decide
from effectgate.states import Outcome, State
from effectgate.store.rows import EffectHead
from effectgate.verify.explore import (
    BOUNDS,
    MUTATIONS,
    Exploration,
    Trace,
    emit_regression_test,
    explore,
    mutation,
    run_schedule,
    sample_schedules,
)
from effectgate.verify.model import (
    Config,
    Model,
    report_standing,
    reported_vendor_attempt,
    resolved_vendor_attempt,
)

# Which config of the 2-worker bound each reverted fix shows up in (the schedule it needs: a
# second namespace, a forger in the same one, an operator, a slow holder, a second type).
_MUTANT_BOUND = {
    "live-resolve": "2 workers, one namespace, an operator",
    "grace": "2 workers, one namespace, lost replies",
    "effect-type": "2 workers, two effect types",
    "adopt-by-secret": "2 workers, two effect types",
    "inferred-moves-key": "2 workers, a holder unsure of its outcome",
}
_EXPECTED = {
    "live-resolve": "EXCLUSIVE",
    "grace": "RECONCILED FAILED IS TRUE",
    "effect-type": "IDENTITY",
    "adopt-by-secret": "EXECUTE ONLY ON IN_FLIGHT",
    "inferred-moves-key": "AT MOST ONCE",
}


def _config(name: str) -> Config:
    return next(c for c in BOUNDS["2-worker"] if c.name == name)


_EXPLORED: dict[tuple[Config, str | None], Exploration] = {}


def _explore(config: Config, mutant: str | None = None) -> Exploration:
    """``explore(config)`` (with fix ``mutant`` reverted), once per test process: the tests
    that read one exploration share it (each is grouped with the others on its config, so
    that they run in one xdist worker)."""
    key = (config, mutant)
    if key not in _EXPLORED:
        if mutant is None:
            _EXPLORED[key] = explore(config)
        else:
            with mutation(mutant):
                _EXPLORED[key] = explore(config)
    return _EXPLORED[key]


def _by_config(configs: Any) -> list[Any]:
    return [pytest.param(c, id=c.name, marks=pytest.mark.xdist_group(f"model: {c.name}"))
            for c in configs]


def _by_mutant(names: Any) -> list[Any]:
    return [pytest.param(n, id=n, marks=pytest.mark.xdist_group(f"mutant: {n}"))
            for n in names]


def _report(record_property: Any, bound: str, found: Any) -> None:
    print(f"\n[model check {bound}] {found.summary()}")
    record_property(f"{found.config.name}: states", found.states)
    record_property(f"{found.config.name}: seconds", round(found.seconds, 2))


@pytest.mark.parametrize("config", _by_config(BOUNDS["2-worker"]))
def test_every_interleaving_of_the_two_worker_bound_keeps_every_invariant(
        config: Config, record_property: Any) -> None:
    found = _explore(config)
    _report(record_property, "2-worker", found)
    assert found.violation is None, found.violation.format()
    assert found.states > 1000  # the bound really branches


@pytest.mark.parametrize("config", _by_config(c for c in BOUNDS["2-worker"]
                                             if c.policy_rule()))
def test_the_governed_bounds_in_the_postgres_shape_keep_every_invariant(
        config: Config, record_property: Any) -> None:
    """On Postgres a governed begin's first store call is one move that reads first, then
    charges and inserts (no read before it): the same invariants hold in that shape too."""
    shaped = replace(config, one_call=True, name=f"{config.name}, one-call begin")
    found = explore(shaped)
    _report(record_property, "2-worker", found)
    assert found.violation is None, found.violation.format()
    if config.budget and not config.approval:  # (an approval rule asks a human first: not
        # a one-call move, so a bound with approvals keeps its interleavings)
        assert found.states != _explore(config).states  # the shape changes the interleavings


@pytest.mark.slow
@pytest.mark.parametrize("config", BOUNDS["3-worker"], ids=lambda c: c.name)
def test_every_interleaving_of_the_three_worker_bound_keeps_every_invariant(
        config: Config, record_property: Any) -> None:
    found = explore(config)
    _report(record_property, "3-worker", found)
    assert found.violation is None, found.violation.format()


@pytest.mark.parametrize("name", _by_mutant(sorted(MUTATIONS)))
def test_each_reverted_fix_is_found_with_a_shortest_readable_trace(
        name: str, record_property: Any) -> None:
    config = _config(_MUTANT_BOUND[name])
    found = _explore(config, name)
    _report(record_property, f"mutant {name}", found)
    assert found.violation is not None, f"reverting {name!r} went unnoticed"
    trace = found.violation
    text = trace.format()
    print(text)
    assert any(v.startswith(_EXPECTED[name]) for v in trace.violations), text
    lines = text.splitlines()
    assert lines[1].startswith("   1. ") and "VIOLATED" in lines[-1]
    assert len(trace.actions) <= 10  # breadth first: the shortest schedule
    # The same schedule on main breaks nothing.
    assert run_schedule(config, trace.actions) == []


@pytest.mark.parametrize("name", _by_mutant(sorted(MUTATIONS)))
def test_a_counter_example_becomes_a_regression_test_that_fails_on_the_mutant(
        name: str, tmp_path: Any) -> None:
    config = _config(_MUTANT_BOUND[name])
    found = _explore(config, name)
    assert found.violation is not None
    source = emit_regression_test(found.violation, mutation_name=name, name=name.replace("-", "_"))
    path = tmp_path / f"test_regression_{name.replace('-', '_')}.py"
    path.write_text(source)
    code = compile(source, str(path), "exec")  # valid Python
    space: dict[str, Any] = {}
    exec(code, space)
    test = space[f"test_{name.replace('-', '_')}"]
    test()  # passes on main
    with mutation(name), pytest.raises(AssertionError):
        test()  # and fails with the fix reverted
    assert "VIOLATED" in source and "SCHEDULE = [" in source


def test_the_model_decides_with_the_real_decide_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the real begin_step and the model breaks with it: no decision of its own."""
    calls: list[int] = []
    real = decide.begin_step

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decide, "begin_step", counting)
    small = BOUNDS["replay"][0]
    assert explore(small).violation is None and calls

    def wrong(row: Any, req: Any, approval: Any = None, *, reconcilable: bool = False) -> Any:
        return decide.Answer(decide.Decision.EXECUTE) if row is not None else real(row, req)

    monkeypatch.setattr(decide, "begin_step", wrong)
    found = explore(small)
    assert found.violation is not None  # "execute" for everyone: caught
    assert any("EXCLUSIVE" in v or "ONCE PER ATTEMPT" in v for v in found.violation.violations)


def test_a_schedule_skips_what_the_state_does_not_enable() -> None:
    config = BOUNDS["replay"][0]
    assert run_schedule(config, [("report", 0, "committed", False), ("tick",), ("land", 1,
                                                                                 "executed")]) == []
    schedule = sample_schedules(config, 1, seed=3)[0]
    assert run_schedule(config, schedule) == []


@pytest.mark.xdist_group("mutant: adopt-by-secret")
def test_traces_are_numbered_human_steps() -> None:
    config = BOUNDS["replay"][0]
    model = Model(config)
    s = model.initial()
    actions = [("begin", 0), ("step", 0, False, None), ("send", 0)]
    texts = []
    for a in actions:
        step = model.transition(s, a)
        texts.append(step.text)
        s = step.state
    text = Trace(config, tuple(actions), tuple(texts), ("X: example",)).format()
    assert text.splitlines()[1:] == [
        "   1. worker 0 (a/refund) calls begin: begin starts: reserve",
        "   2. worker 0 (a/refund)'s begin makes its next store call: reserved: execute "
        "(attempt 1, token 1, in_flight)",
        "   3. worker 0 (a/refund) sends the request to the vendor: sent under vendor key #1",
        "  VIOLATED X: example",
    ]
    found = _explore(_config("2 workers, two effect types"), "adopt-by-secret")
    assert found.violation is not None
    assert "[reserve] reserved (reply lost) (next: fetch)" in found.violation.format()


@pytest.mark.xdist_group("mutant: adopt-by-secret")
def test_the_recovery_bug_schedule_is_a_regression_test_of_the_checker() -> None:
    """Issue 26: a reservation written, its reply lost, force-resolved FAILED by an operator,
    then the lost-reply recovery reads the row back. On main the recovery decides afresh (a
    new attempt); with ``adopts_lost_reservation`` reduced to the secret check, the checker
    finds the EXECUTE answered for a FAILED row, on this schedule and by itself."""
    config = _config("2 workers, two effect types")
    schedule = [("begin", 0), ("step", 0, True, None), ("resolve", "failed", True, False),
                ("step", 0, False, None)]
    assert run_schedule(config, schedule) == []
    with mutation("adopt-by-secret"):
        found = run_schedule(config, schedule)
    explored = _explore(config, "adopt-by-secret")
    assert any(v.startswith("EXECUTE ONLY ON IN_FLIGHT") for v in found), found
    assert explored.violation is not None
    assert len(explored.violation.actions) <= len(schedule), explored.violation.format()


def _head(**fields: Any) -> EffectHead:
    base = EffectHead(1, "a", "k", "t", "h", State.IN_FLIGHT, 1, 1, 10.0, 0.0, 0.0, None, None,
                      "generic", 1, 0.0, None, None, None, None, "s", 5.0)
    return base._replace(**fields)


def test_report_standing_is_the_holders_proof_and_nothing_else() -> None:
    assert report_standing(_head(), "a", "k", 1, "s") == "on_time"
    assert report_standing(_head(now=11.0), "a", "k", 1, "s") == "late"
    assert report_standing(_head(state=State.AMBIGUOUS, now=11.0), "a", "k", 1,
                                  "s") == "late"
    for ns, key, token, secret in (("b", "k", 1, "s"), ("a", "j", 1, "s"), ("a", "k", 2, "s"),
                                   ("a", "k", 1, "x")):
        assert report_standing(_head(), ns, key, token, secret) is None
    assert report_standing(_head(lease_secret=None), "a", "k", 1, "s") is None
    for state in (State.COMMITTED, State.FAILED, State.DENIED, State.PENDING_APPROVAL):
        assert report_standing(_head(state=state), "a", "k", 1, "s") is None
    # An AMBIGUOUS effect an operator resolved has no lease: no late report lands.
    assert report_standing(_head(state=State.AMBIGUOUS, lease_expires_at=None), "a",
                                  "k", 1, "s") is None


def test_vendor_key_rules() -> None:
    assert reported_vendor_attempt(_head(), Outcome.FAILED) == 2
    assert reported_vendor_attempt(_head(), Outcome.COMMITTED) == 1
    kept = _head(attempt=2, vendor_attempt=1)  # kept from attempt 1 (its holder may send)
    assert reported_vendor_attempt(kept, Outcome.FAILED) == 1
    # A FAILED a built-in classifier inferred keeps the key (the vendor deduplicates a retry
    # of a body whose earlier request it executed); any other FAILED moves it.
    assert reported_vendor_attempt(_head(), Outcome.FAILED, keeps_vendor_key=True) == 1
    assert reported_vendor_attempt(kept, Outcome.FAILED, keeps_vendor_key=True) == 1
    assert reported_vendor_attempt(_head(), Outcome.FAILED, keeps_vendor_key=False) == 2
    assert resolved_vendor_attempt(_head(), State.FAILED) == 1
    assert resolved_vendor_attempt(_head(vendor_attempt=2), State.COMMITTED) == 1


_UNSURE = _config("2 workers, a holder unsure of its outcome")
INFERRED_RETRY = (
    ("begin", 0), ("step", 0, False, None), ("send", 0), ("land", 0, "executed"),
    ("report", 0, "inferred", False), ("begin", 1), ("step", 1, False, None),
    ("step", 1, False, None), ("send", 1), ("land", 1, "executed"),
    ("report", 1, "committed", False))
"""The vendor executes worker 0's request, yet a built-in classifier (judging a later request
of its body that failed to connect) infers FAILED; worker 1's next attempt sends under the
vendor key worker 0's FAILED kept, and the vendor answers it from its record: executed once."""


def test_an_inferred_failed_keeps_the_vendor_key_and_the_retry_is_deduplicated() -> None:
    assert _UNSURE.inferred  # the 2-worker bound explores the action (and AT MOST ONCE)
    s, step = _walk(_UNSURE, list(INFERRED_RETRY[:5]))
    assert "report failed (inferred by a built-in classifier): written" in step.text
    assert s.rows[0].state is State.FAILED and s.rows[0].vendor_attempt == 1
    s, _ = _walk(_UNSURE, list(INFERRED_RETRY[:10]))
    assert [e[1] for e in s.ledger] == ["executed"] and s.rows[0].attempt == 2
    assert s.workers[1].reply == "executed"
    s, _ = _walk(_UNSURE, list(INFERRED_RETRY))
    assert s.rows[0].state is State.COMMITTED
    # The rule broken (the inferred FAILED moves the key): the vendor executes twice.
    with mutation("inferred-moves-key"):
        found = run_schedule(_UNSURE, INFERRED_RETRY)
    assert found and found[0].startswith("AT MOST ONCE"), found
    # A FAILED the vendor's answer proves (NotExecuted, the caller's own classifier) moves it.
    proved = [*INFERRED_RETRY[:3], ("land", 0, "refused"), ("report", 0, "failed", False)]
    s, _ = _walk(_UNSURE, proved)
    assert s.rows[0].vendor_attempt == 2


def test_a_holder_that_reported_while_its_request_travels_begins_again_once_it_landed() -> None:
    """A worker that reported the inferred FAILED while its request was on its way (so that
    a worker never has two requests in transit) begins again only once it has landed."""
    config = replace(_UNSURE, begins=(2, 1), name="inferred, worker 0 twice")
    model = Model(config)
    s = model.initial()
    for action in (("begin", 0), ("step", 0, False, None), ("send", 0)):
        s = model.transition(s, action).state
    inferred = ("report", 0, "inferred", False)
    assert inferred in model.actions(s)
    assert inferred not in Model(replace(config, inferred=False)).actions(s)  # the flag's
    s = model.transition(s, inferred).state
    assert s.workers[0].phase == "idle" and ("begin", 0) not in model.actions(s)
    assert ("begin", 1) in model.actions(s)  # the other worker may retry meanwhile
    s = model.transition(s, ("land", 0, "executed")).state
    assert ("begin", 0) in model.actions(s)


def test_the_bound_sizes_are_what_the_suite_can_afford() -> None:
    """A guard on the bound: the normal-suite configs stay small enough to run in seconds
    (the counts are printed by the exploration tests)."""
    started = time.perf_counter()
    found = explore(replace(BOUNDS["replay"][0], name="tiny"))
    assert found.violation is None and 1000 < found.states < 50_000
    assert time.perf_counter() - started < 30


def test_spend_accounting_breaks_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A FAILED attempt that kept its charge (the release forgotten) is caught: the spend
    counter must equal what the effects holding a charge estimate, within the ceiling."""
    config = _config("2 workers, a spend ceiling")
    real = decide.outcome_spend_delta
    monkeypatch.setattr(decide, "outcome_spend_delta",
                        lambda outcome, est, actual: 0 if outcome is Outcome.FAILED else real(
                            outcome, est, actual))
    found = explore(config)
    assert found.violation is not None
    assert any(v.startswith("SPEND") for v in found.violation.violations), found.violation.format()


def test_approvals_execute_once_and_denials_hold() -> None:
    """The approvals config reaches both an approved execution and a denial."""
    config = _config("2 workers, approvals")
    approve = [("begin", 0), ("step", 0, False, None), ("step", 0, False, None), ("approve",),
               ("begin", 0), ("step", 0, False, None), ("step", 0, False, None),
               ("step", 0, False, None)]
    model = Model(config)
    s = model.initial()
    for action in approve:
        assert action in model.actions(s), (action, s)
        s = model.transition(s, action).state
    assert s.workers[0].phase == "held" and [c[1:] for c in s.consumed] == [("refund", "a")]
    deny = [*approve[:3], ("deny",), ("begin", 1), ("step", 1, False, None)]
    s = model.initial()
    for action in deny:
        step = model.transition(s, action)
        s = step.state
    assert step.answer[0] == "denied" and s.rows[0].state is State.DENIED


def test_the_bound_reaches_the_protocols_hard_cases() -> None:
    """Not a vacuous bound: the covering schedules of the small bound and a seeded sample of
    the 2-worker bound pass through late reports, reconcile verdicts, recovered reservations
    (a fetch after a lost reservation reply that answers execute),
    kept vendor keys, forced and refused resolutions, pruned duplicates and approvals, and a
    FAILED a built-in classifier inferred."""
    from effectgate.verify.explore import covering_schedules, trace_of

    small = BOUNDS["replay"][0]
    seen = "\n".join("\n".join(trace_of(small, schedule).texts)
                     for schedule in covering_schedules(small))
    for config in BOUNDS["2-worker"]:
        for schedule in sample_schedules(config, 400, seed=11):
            seen += "\n".join(trace_of(config, schedule).texts)
    for event in ("on_time", "late", "reconciled committed", "reconciled failed",
                  "fetched: execute", "deduplicated by vendor key", "refused: cannot",
                  "resolved ambiguous -> failed", "resolved in_flight -> committed", "pruned 1",
                  "approved apr1", "denied apr1", "inserted as pending_approval",
                  "refused (StaleLease)", "PayloadMismatch", "the caller sees StoreError",
                  "the database's date is day 1", "over the ceiling (day ceiling",
                  "report failed (inferred by a built-in classifier): written"):
        assert event in seen, event


def test_an_unknown_mutation_is_a_typed_error() -> None:
    from effectgate.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown mutation"), mutation("no-such-fix"):
        pass


def test_a_lying_reconcile_hook_can_commit_what_the_vendor_never_executed() -> None:
    """What the protocol cannot promise: a hook that answers ``committed`` for an effect the
    vendor never executed makes a COMMITTED row with no execution behind it (the model scopes
    the invariant that a reconciled COMMITTED is true to a truthful hook: this is that
    invariant, checked on the lying bound, reached)."""
    lying = next(c for c in BOUNDS["2-worker"] if c.hook_lies)
    with mock.patch.object(Model, "truthful", return_value=True):
        found = explore(lying)
    assert found.violation is not None
    assert "RECONCILED COMMITTED IS TRUE" in found.violation.violations[0]
    truthful = explore(replace(lying, hook_lies=False, name="the same bound, a truthful hook"))
    assert truthful.violation is None, truthful.violation.format()


_DAY = _config("2 workers, two keys under a per-day ceiling, a midnight")
_FIRST = [("begin", 0), ("step", 0, False, None), ("step", 0, False, None),
          ("begin", 1), ("step", 1, False, None)]
"""Worker 0 executes (60 of the day's 100); worker 1's begin is about to charge."""


def _walk(config: Config, actions: list[Any]) -> tuple[Any, Any]:
    model = Model(config)
    s, step = model.initial(), None
    for action in actions:
        assert action in model.actions(s), (action, model.actions(s))
        step = model.transition(s, action)
        assert step.violations == (), step.violations
        s = step.state
    return s, step


def test_a_per_day_ceiling_counts_each_date_apart() -> None:
    """Two calls of 60 under a per-day ceiling of 100: the second is refused on the first's
    date and executes once the database's date changed; the first's charge stays with its
    date (its release lands there, not on today's counter)."""
    s, step = _walk(_DAY, [*_FIRST, ("step", 1, False, None)])
    assert "over the ceiling (day ceiling" in step.text
    s, step = _walk(_DAY, [*_FIRST, ("step", 1, False, None), ("step", 1, False, None)])
    assert step.answer[0] == "denied" and (s.rows[1].reason or "").startswith(
        "spend ceiling reached")
    s, step = _walk(_DAY, [*_FIRST, ("midnight",), ("step", 1, False, None)])
    assert step.answer[0] == "execute"
    assert s.spend == (("a", "refund|day|d0", 60), ("a", "refund|day|d1", 60))
    assert [r.day for r in s.rows] == [0, 1]
    s, _ = _walk(_DAY, [*_FIRST, ("midnight",), ("step", 1, False, None),
                        ("report", 0, "failed", False)])
    assert s.spend == (("a", "refund|day|d0", 0), ("a", "refund|day|d1", 60))


def test_a_day_window_that_never_rolls_over_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-day ceiling whose counter is not the date's (one counter for every day) refuses
    the next day's call: the ceiling refuses only what the rows charged today leave no room
    for."""
    from effectgate import governance

    real = governance.Governance.charges
    monkeypatch.setattr(governance.Governance, "charges", lambda self, *args: tuple(
        c._replace(per_day=False) for c in real(self, *args)))
    found = explore(_DAY)
    assert found.violation is not None
    assert found.violation.violations[0].startswith("A CEILING REFUSES ONLY WHEN REACHED"), (
        found.violation.format())
    assert ("midnight",) in found.violation.actions and len(found.violation.actions) <= 8


_REPEATS = _config("2 workers, approvals, the operator's lost replies repeated")
LOST_REPEATS = (
    (("begin", 0), ("step", 0, False, None), ("step", 0, False, None), ("approve", True),
     ("again", True), ("again",)),
    (("begin", 0), ("step", 0, False, None), ("step", 0, False, None), ("approve",),
     ("begin", 1), ("step", 1, False, None), ("step", 1, False, None),
     ("step", 1, False, None), ("report", 1, "failed", False), ("prune", True),
     ("again", True), ("again",)),
)
"""A lost approve repeated, the repeat's reply lost, repeated again (refused: decided); a
lost prune likewise (the repeats prune what is left)."""


def test_a_lost_repeat_is_repeated_again_and_a_decision_is_still_made_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for schedule in LOST_REPEATS:
        s, step = _walk(_REPEATS, list(schedule))
        assert step.answer in ("refused", 0) and s.repeat == () and s.faults == 0
    # A check that lets a decided request be decided again: the lost repeat is caught.
    monkeypatch.setattr(decide, "check_approval", lambda row, *args, **kwargs: row)
    found = run_schedule(_REPEATS, LOST_REPEATS[0])
    assert found and all(v.startswith("A DECISION IS MADE ONCE") for v in found), found


def test_an_exploration_pauses_the_garbage_collector_and_restores_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cyclic collector's passes over the states kept were most of a large bound's time:
    it is paused while exploring, and left as it was found."""
    import gc

    from effectgate.verify.symmetry import Symmetry

    during: list[bool] = []
    real = Symmetry.key
    monkeypatch.setattr(Symmetry, "key", lambda self, s: during.append(gc.isenabled())
                        or real(self, s))
    assert gc.isenabled()
    assert explore(BOUNDS["replay"][0]).violation is None
    assert during and not any(during) and gc.isenabled()
    gc.disable()
    try:
        explore(BOUNDS["replay"][0])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_request_on_its_way_under_a_vendor_key_already_answered_is_not_a_false_alarm() -> None:
    """A holder's inferred FAILED keeps vendor key #1 while its request is still on its way;
    the next attempt sends under #1, the vendor refuses it, the holder reports AMBIGUOUS and a
    truthful hook reconciles FAILED. The first request can only land deduplicated (refused):
    the reconciled FAILED is true, and the checker no longer says otherwise. It still says so
    when the vendor has not answered that key (the "grace" mutant, above)."""
    config = Config(workers=(("a", "refund"), ("a", "refund")), begins=(2, 1), faults=0,
                    ops=1, unsure=True, inferred=True, forgery=False, prune=False)
    schedule = [("begin", 0), ("begin", 1), ("step", 1, False, None), ("send", 1),
                ("report", 1, "inferred", False), ("step", 0, False, None),
                ("step", 0, False, None), ("send", 0), ("land", 0, "refused"),
                ("report", 0, "ambiguous", False), ("report", 0, "failed", False),
                ("begin", 0), ("step", 0, False, None), ("step", 0, False, "failed"),
                ("step", 0, False, None)]
    model, s = Model(config), Model(config).initial()
    for action in schedule:
        assert action in model.actions(s), action  # the schedule runs as written
        s = model.transition(s, action).state
    assert any(t[1][3] == 1 and t[2] for t in s.transit)  # the first request, still on its way
    assert any(r.state.value == "failed" and r.actor == "reconcile" for r in s.rows)
    assert run_schedule(config, [*schedule, ("land", 1, "executed")]) == []
    landed = model.transition(s, ("land", 1, "executed"))
    assert "deduplicated by vendor key #1: refused" in landed.text
