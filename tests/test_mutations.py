"""The mutation suite: single-point mutations of real protocol rules in ``decide.py``,
``flow.py``, the store's SQL (``store/statements.py``) and what a report tells the store
(``reporting.py``), each applied to a copy of the product's own source (never a model twin)
and required to be caught by the model checker
(:mod:`effectgate.verify.explore`) or by the replay of every transition of its bound on the
real store (:mod:`effectgate.verify.replay`), not only by unit tests. Each caught mutant's
shortest trace is printed (``-s``).

How: the package is copied to a temporary folder, the patch applied there (its old text must
occur exactly once in the real file), and ``tests/mutation_worker.py`` runs in a subprocess
with the copy first on ``PYTHONPATH``. Each mutation names the bounds that show it: small
configs of the 2-worker bound (so that the suite stays fast; the whole 2-worker bound runs in
tests/test_model_check.py on the unmutated product).

Every layer for every mutant, for the counts (slow; prints a table)::

    EFFECTGATE_MUTATIONS_ALL=1 .venv/bin/pytest -q -s tests/test_mutations.py -n2
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from .conftest import PG_URL, require_postgres

pytestmark = pytest.mark.slow

CORE = Path(__file__).resolve().parent.parent / "core"
WORKER = Path(__file__).resolve().parent / "mutation_worker.py"
_TWO = [["a", "refund"], ["a", "refund"]]
_QUIET = {"workers": _TWO, "begins": [1, 1], "faults": 0, "ops": 0, "forgery": False,
          "prune": False, "hook": False}


def _bound(name: str, **fields: Any) -> dict[str, Any]:
    return {**_QUIET, **fields, "name": name}


REPLAY = _bound("2 workers, one begin each, a reconcile hook", hook=True)
LOST = _bound("2 workers, a lost reply", faults=1)
OPERATOR = _bound("2 workers, an operator", ops=1)
LOST_AND_OPERATOR = _bound("2 workers, a lost reply and an operator", faults=1, ops=1)
CEILING = _bound("2 workers, a spend ceiling, an operator", ops=1, budget=True)
TWO_KEYS = _bound("2 workers, two keys under one ceiling", keys=["k", "j"], budget=True)
OVER_ALONE = _bound("2 workers, approvals, one cost alone over a per-run ceiling",
                    keys=["k", "j"], runs=["r", "r"], costs=[150, 60], begins=[2, 2], ops=1,
                    approval=True, budget=True, budget_scopes=["run"])
APPROVED_BUDGET = _bound("1 worker twice, an approval and a spend ceiling", begins=[2, 0],
                         ops=1, approval=True, budget=True)
DENIALS = _bound("2 workers, approvals, two operator actions", begins=[2, 1], ops=2,
                 approval=True)
ATTEMPTS = _bound("2 workers, max_attempts 2", begins=[2, 1], max_attempts=2, ticks=3)
ABA = _bound("2 workers, three begins", begins=[2, 1])
TYPES = _bound("2 workers, two effect types", workers=[["a", "refund"], ["a", "payout"]])
PAYLOADS = _bound("2 workers, two payloads on one key", payloads=[1, 2])
MEMO = _bound("2 workers, two payloads on one key, a memo", payloads=[1, 2], memo=True)
FORGER = _bound("2 workers, a forger", forgery=True)
NAMESPACES = _bound("2 workers, two namespaces, a forger",
                    workers=[["a", "refund"], ["b", "refund"]], forgery=True)
UNSURE = _bound("2 workers, a holder unsure of its outcome", unsure=True)
DENY = _bound("2 workers, a type the policy denies", begins=[2, 1], deny=True)
BLOCK = _bound("2 workers, on_ambiguous block, an operator", hook=True, ops=1, block=True)
SELF = _bound("2 workers on two agents, a requester approving its own request",
              agents=["bot0", "bot1"], ops=1, approval=True, self_approve=True)
AGENT = _bound("2 workers, two keys, one agent under a per-agent ceiling", keys=["k", "j"],
               agents=["bot", "bot"], budget=True, budget_scopes=["agent"])
RUN = _bound("2 workers on two agents, one run under a per-run ceiling", keys=["k", "j"],
             agents=["bot0", "bot1"], runs=["r", "r"], budget=True,
             budget_scopes=["run", "agent"])
DAY = _bound("2 workers, two keys under a per-day ceiling, a midnight", keys=["k", "j"],
             budget=True, budget_scopes=["day"], days=1)
REPEATS = _bound("2 workers, approvals, the operator's lost replies repeated", faults=1,
                 ops=2, approval=True, lost_ops=True, prune=True)
RAISES = _bound("2 workers, a reconcile hook that raises", hook=True, hook_fails=True)
INFERRED = _bound("2 workers, a built-in classifier's inferred FAILED", inferred=True)
# For the replay (every schedule replayed costs real store calls): the same bounds without the
# clock where the rule needs none, and a lapse that may be reconciled at once.
HOOKED = _bound("2 workers, a reconcile hook, a short grace", hook=True, ticks=1,
                grace_ticks=0.25)
_STILL = {"ticks": 0}


@dataclass(frozen=True)
class Mutation:
    """One rule broken at one point: ``old`` (exactly once in ``path``) becomes ``new``."""

    name: str
    path: str
    old: str
    new: str
    explore: list[dict[str, Any]] = field(default_factory=list)
    replay: list[dict[str, Any]] = field(default_factory=list)
    postgres: bool = False
    drive: str = "sync"
    """How the replay drives its begins: ``"async"`` for a mutation of the async path
    (Gate.abegin, the store's async face), which the sync flow never runs."""
    sqlite: bool = True
    """False: the mutated code runs on Postgres only (replay there alone)."""


MUTATIONS = [
    # -- decide.py ---------------------------------------------------------------------------
    Mutation("approved executions bypass the spend ceiling", "decide.py",
             "        charges = gov.charges(req.effect_type, req.run_id, req.agent_id)",
             "        charges = () if consume is not None else gov.charges(\n"
             "            req.effect_type, req.run_id, req.agent_id)", [APPROVED_BUDGET]),
    Mutation("a cost alone over its ceiling is asked for approval", "decide.py",
             "if consume is None and charges and (gov.cost or 0) > charges[0].limit:",
             "if False:", [OVER_ALONE]),
    Mutation("lease expiry read from the worker's clock", "decide.py",
             "    return row.lease_expires_at is not None and row.lease_expires_at >= row.now",
             "    return row.lease_expires_at is not None and (\n"
             "        row.lease_expires_at >= __import__('time').time())", [REPLAY]),
    Mutation("a COMMITTED effect executes again", "decide.py",
             "return _DUPLICATE_PRUNED if row.pruned_at is not None else _DUPLICATE",
             "return _govern(req, row, None, attempt_increment=1)", [REPLAY]),
    Mutation("max_attempts off by one", "decide.py",
             "if row.attempt >= req.max_attempts:", "if row.attempt > req.max_attempts:",
             [ATTEMPTS]),
    Mutation("reconcile asked without a grace period", "decide.py",
             "return row.lease_expires_at + grace - row.now",
             "return row.lease_expires_at - row.now", [REPLAY]),
    Mutation("the effect type is not part of identity", "decide.py",
             "    if row.effect_type != req.effect_type:\n        raise PayloadMismatch(",
             "    if False:\n        raise PayloadMismatch(", [TYPES]),
    Mutation("the payload is not part of identity", "decide.py",
             "if row.payload_hash != req.payload_hash:", "if False:", [PAYLOADS]),
    Mutation("a live lease resolved without force", "decide.py",
             "        if not force:\n            assert", "        if False:\n            assert",
             [OPERATOR]),
    Mutation("an operator's FAILED keeps the charge", "decide.py",
             "            delta = -row.estimated_cost_micros", "            delta = 0", [CEILING]),
    Mutation("a holder's FAILED keeps the charge", "decide.py",
             "    if outcome is Outcome.FAILED:\n        return -held",
             "    if outcome is Outcome.FAILED:\n        return 0", [CEILING]),
    Mutation("over the ceiling executes anyway", "decide.py",
             "    return Move(State.DENIED, Decision.DENIED, move.expected, "
             "move.attempt_increment,\n                reason=reason,",
             "    return Move(State.IN_FLIGHT, Decision.EXECUTE, move.expected, "
             "move.attempt_increment,\n                reason=reason,",
             [TWO_KEYS]),
    Mutation("a lost reservation reply adopted by the secret alone (the recovery bug)",
             "decide.py",
             "            and row.state is State.IN_FLIGHT and row.attempt == 1 and row.token == 1"
             "\n            and lease_live(row))", ")", [LOST_AND_OPERATOR]),
    Mutation("a lost reservation reply adopted without checking the lease secret",
             "decide.py",
             "    return (row.lease_secret is not None and row.lease_secret == secret_hash\n"
             "            and row.state", "    return (True\n            and row.state", [LOST]),
    Mutation("an approver's denial is asked again", "decide.py",
             "    if (row.reason or \"\").startswith(APPROVER_DENIED):",
             "    if False:", [DENIALS]),
    Mutation("a lapsed lease is taken over without AMBIGUOUS", "decide.py",
             "        return LAPSE\n", "        return _govern(req, row, None)\n", [REPLAY]),
    Mutation("a type the policy denies executes", "decide.py",
             "    if gov.deny:\n        return Move(State.DENIED",
             "    if False:\n        return Move(State.DENIED", [DENY]),
    Mutation("the reconcile hook asked although on_ambiguous is block", "decide.py",
             'if not reconcilable or (gov is not None and gov.on_ambiguous == "block"):',
             "if not reconcilable:", [BLOCK]),
    Mutation("a requester approves its own request", "decide.py",
             "    if approving and not approval.allow_self_approval and same_principal(",
             "    if False and same_principal(", [SELF]),
    Mutation("a decided approval request is decided again", "decide.py",
             "    if status is not ApprovalState.PENDING:\n        raise InvalidTransition(",
             "    if False:\n        raise InvalidTransition(", [REPEATS]),
    # -- governance.py -----------------------------------------------------------------------
    Mutation("a per-agent ceiling charges nothing", "governance.py",
             '                out.append(Charge(f"{pattern}|agent|{agent_id}", False, limit, '
             'label))', "                pass", [AGENT]),
    Mutation("a per-run ceiling counts each agent apart", "governance.py",
             'out.append(Charge(f"{pattern}|run|{run_id}", False, limit, label))',
             'out.append(Charge(f"{pattern}|run|{run_id}|{agent_id}", False, limit, label))',
             [RUN]),
    Mutation("a per-day ceiling charges nothing", "governance.py",
             '                out.append(Charge(f"{pattern}|day|", True, limit, label))',
             "                pass", [DAY]),
    Mutation("a per-day ceiling's window never ends (its counter is not the date's)",
             "governance.py", 'Charge(f"{pattern}|day|", True, limit, label)',
             'Charge(f"{pattern}|day|", False, limit, label)', [DAY]),
    # -- flow.py -----------------------------------------------------------------------------
    Mutation("the memo ignores the payload hash", "flow.py",
             "if payload != req.payload_hash or effect_type != req.effect_type:",
             "if effect_type != req.effect_type:", [MEMO], [{**MEMO, **_STILL}]),
    Mutation("the flow adopts any row after a lost reservation reply", "flow.py",
             "if row is not None and secret.issued and decide.adopts_lost_reservation(row, "
             "secret.hash):", "if row is not None and secret.issued:", [LOST],
             [{**LOST, **_STILL}]),
    Mutation("the flow never asks the reconcile hook", "flow.py",
             "    return row is not None and row.state is State.AMBIGUOUS",
             "    return False and row is not None and row.state is State.AMBIGUOUS",
             [REPLAY], [HOOKED]),
    Mutation("the flow does not retry a move the ceiling refused", "flow.py",
             "    if moved.over_ceiling is not None:\n        instead = decide.over_ceiling("
             "step, moved.over_ceiling)\n",
             "    if False:\n        instead = decide.over_ceiling(step, moved.over_ceiling)"
             "\n", [TWO_KEYS], [{**TWO_KEYS, **_STILL}]),
    Mutation("the hook's verdict settled as FAILED", "flow.py",
             "outcome = Outcome(found.outcome)", "outcome = Outcome.FAILED", [REPLAY],
             [HOOKED]),
    Mutation("a hook that raised is taken to answer failed", "flow.py",
             "        yield _hook_failed(parts, fn, row, answer.error)\n        return None",
             '        answer = "failed"', [RAISES]),
    Mutation("the flow reads again instead of marking a lapse", "flow.py",
             "            row = (yield from _lapse(row)) or (yield Fetch(req.namespace, req.key))",
             "            row = yield Fetch(req.namespace, req.key)", [REPLAY], [HOOKED]),
    # -- the store's SQL (store/statements.py) -----------------------------------------------
    Mutation("the fencing token removed from the compare-and-set", "store/statements.py",
             'cas = in_ns & (t.id == p("id")) & (t.token == p("token"))',
             'cas = in_ns & (t.id == p("id"))', [], [{**ABA, **_STILL}], postgres=True),
    Mutation("a report without the lease secret", "store/statements.py",
             'holder = by_key & (t.token == p("token")) & (t.lease_secret == p("lease_secret"))',
             'holder = by_key & (t.token == p("token"))', [], [{**FORGER, **_STILL}]),
    Mutation("a report not scoped to its namespace", "store/statements.py",
             'holder = by_key & (t.token == p("token"))',
             'holder = (t.key == p("key")) & (t.token == p("token"))', [],
             [{**NAMESPACES, **_STILL}]),
    Mutation("a late report lands after the holder reported AMBIGUOUS", "store/statements.py",
             "(t.state == ambiguous) & t.lease_expires_at.is_not(None))",
             "(t.state == ambiguous))", [], [{**UNSURE, **_STILL}]),
    Mutation("a resolve keeps the token", "store/statements.py",
             '                state=p("state"),\n                token=t.token + _ONE,\n'
             '                result=p("result"),',
             '                state=p("state"),\n                result=p("result"),', [],
             [{**OPERATOR, **_STILL}]),
    Mutation("a lapse writes FAILED", "store/statements.py",
             '.values(state=ambiguous, reason=literal("lease lapsed")',
             '.values(state=_state(State.FAILED), reason=literal("lease lapsed")', [],
             [HOOKED]),
    Mutation("a holder's FAILED moves a kept vendor key", "store/statements.py",
             'proved = (p("state") == _state(State.FAILED)) & (t.vendor_attempt == t.attempt)',
             'proved = p("state") == _state(State.FAILED)', [], [HOOKED]),
    Mutation("a built-in classifier's inferred FAILED moves the vendor key",
             "store/statements.py",
             '(t.vendor_attempt == t.attempt) & (\n            ~p("keeps_vendor_key", '
             'type_=Boolean))', "(t.vendor_attempt == t.attempt)", [],
             [{**INFERRED, **_STILL}], postgres=True),
    Mutation("a charge ignores the ceiling", "store/statements.py",
             'where=b.spent_micros <= p("limit", type_=BigInteger()) - p(\n'
             '                        "cost", type_=BigInteger()),',
             'where=b.spent_micros <= p("limit", type_=BigInteger()),', [],
             [{**TWO_KEYS, **_STILL}]),
    Mutation("a per-day counter not named by the database's date", "store/statements.py",
             'charge(p("scope_key") + db_day())', 'charge(p("scope_key"))', [],
             [{**DAY, **_STILL}]),
    # -- reporting.py: what the decorator's report tells the store ---------------------------
    Mutation("a built-in classifier's FAILED told to the store as a proved one",
             "reporting.py", '"keeps_vendor_key": outcome is INFERRED_FAILED,',
             '"keeps_vendor_key": False,', [], [{**INFERRED, **_STILL}]),
    # -- the async path (replayed through Gate.abegin: the sync flow never runs it) ----------
    Mutation("the async flow does not await an async reconcile hook", "_drive.py",
             "return await c.fn(c.record)", "return c.fn(c.record)", [], [HOOKED],
             drive="async"),
    Mutation("the native async report never lands late", "store/async_pg.py",
             "rows = await self.run(store.sql.report_late, late_binds(binds, note), "
             "writing=True)", "rows = []",
             [], [HOOKED], postgres=True, drive="async", sqlite=False),
]


def _mutant(m: Mutation, root: Path) -> Path:
    """A copy of the package with ``m`` applied; its folder."""
    real = (CORE / m.path).read_text()
    assert real.count(m.old) == 1, f"{m.name}: the old text occurs {real.count(m.old)} times " \
        f"in {m.path} (the product moved on: update the mutation)"
    copy = root / "effectgate"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / m.path).write_text(real.replace(m.old, m.new))
    if m.path in _RENDERED_FROM:  # both stores run texts rendered ahead: render the mutant's
        for rendered in ("sqlite_texts", "pg_texts"):
            done = subprocess.run(
                [sys.executable, "-c", "import sys; from effectgate.store.statements import "
                 f"{rendered}_source; sys.stdout.write({rendered}_source())"],
                env={**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"},
                capture_output=True, text=True, timeout=120, check=True)
            (copy / "store" / f"{rendered}.py").write_text(done.stdout)
    return root


_RENDERED_FROM = ("store/statements.py", "store/schema.py")
"""The sources ``store/sqlite_texts.py`` and ``store/pg_texts.py`` are rendered from (the
stores run those texts, not the statements): a mutant of them is rendered again, as the
files' pinning test says. (Postgres' generated functions are named by a digest of their
source, so a mutant's never replace the real ones; its replay runs in a schema of its own.)"""


def _run(m: Mutation, root: Path, *, every_layer: bool = False, pg_url: str | None = None,
         sqlite: bool | None = None) -> dict[str, Any]:
    spec = {"explore": m.explore, "replay": m.replay, "all": every_layer,
            "pg_url": pg_url or (PG_URL if (m.postgres or every_layer) and PG_URL else None),
            "drive": m.drive, "sqlite": m.sqlite if sqlite is None else sqlite}
    env = {**os.environ, "PYTHONPATH": str(_mutant(m, root)), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, str(WORKER), json.dumps(spec), str(root)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_is_caught_by_the_checker_or_the_replay(m: Mutation,
                                                               tmp_path: Path) -> None:
    assert m.explore or m.replay
    result = _run(m, tmp_path)
    assert result["caught"], f"{m.name} ({m.path}) escaped the checker and the replay"
    first = result["caught"][0]
    print(f"\n[{m.name}: caught by the {first['layer']} in {result['seconds']}s]\n"
          f"{first['trace']}")
    assert "   1. " in first["trace"]


@pytest.mark.parametrize("m", [m for m in MUTATIONS if m.path in _RENDERED_FROM],
                         ids=lambda m: m.name)
def test_each_sql_mutation_is_caught_on_postgres_alone(m: Mutation, tmp_path: Path) -> None:
    """Each mutant of the store's SQL replayed on Postgres only (the checker and SQLite left
    out), on the texts rendered from the mutant, in a schema of its own: Postgres runs texts
    rendered ahead of time too, and a mutant of ``statements.py`` that was not rendered again
    ran the real SQL there (every SQL mutant was caught on SQLite alone)."""
    require_postgres()
    from sqlalchemy import create_engine, text

    schema = f"eg_mutant_{uuid.uuid4().hex[:10]}"
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        result = _run(replace(m, explore=[]), tmp_path, sqlite=False,
                      pg_url=f"{PG_URL}?options=-csearch_path%3D{schema}")
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
    assert result["caught"], f"{m.name} escaped the replay on Postgres"
    first = result["caught"][0]
    assert "replay" in first["layer"] and first["store"] == "postgresql", first


def test_the_suite_mutates_decide_flow_and_the_sql() -> None:
    files = {m.path for m in MUTATIONS}
    assert {"decide.py", "flow.py", "store/statements.py"} <= files
    assert len(MUTATIONS) >= 20 and len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    for m in MUTATIONS:
        assert (CORE / m.path).read_text().count(m.old) == 1, m.name
