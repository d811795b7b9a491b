"""The saga pages: recent groups, one group's steps — each marked with what undid it (the
compensation's effect, or why it was not undone) — and Unwind, in two steps.

Unwind runs compensators (real side effects), so it is never one click: the group's page
carries what the operator saw (:func:`effectgate.sagas.unwind_plan`'s digest of the steps and
their undos) to a confirmation page (a GET, writing nothing) that names exactly which undos
will run, and only its button unwinds. If the saga moved in between (a step settled, an undo
ran, a step was added), the confirmation or the unwind is refused and the operator reviews
again. The unwind then runs only the undos the confirmation named (``confirmed``): one the
saga gains after that check is listed unresolved, not begun, and holds back the older steps.

Unwind answers with a redirect to the group's page (reloading it runs nothing), with a
message that says what *this* unwind did: the steps it compensated now, apart from those
compensated earlier (by an earlier unwind or an agent), and what is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..states import State

if TYPE_CHECKING:
    from ..principals import Principal
    from ..records import EffectRecord
    from ..sagas import UnwindReport
    from .app import Console

__all__ = ["Step", "confirm_unwind", "group", "groups", "steps_of", "summary", "unwind"]


class Step(NamedTuple):
    """A saga step as its page shows it: the step, its undo (if one was begun), whether that
    undo committed, and otherwise why the step is not undone."""

    e: EffectRecord
    undo: EffectRecord | None
    undone: bool
    note: str


def _why_not(c: Console, record: EffectRecord) -> str:
    state = record.state
    if state in (State.AMBIGUOUS, State.IN_FLIGHT, State.PENDING_APPROVAL):
        return f"not undone: the step is {state.value}; resolve it first"
    if state is not State.COMMITTED:
        return f"nothing to undo: the step is {state.value}"
    if record.compensation is None:
        return "irreversible: no compensation declared"
    if c.gate.compensator_for(record.effect_type) is None:
        return f"not undone; no compensator for {record.effect_type} is registered here"
    return "not undone"


def steps_of(c: Console, group_key: str) -> list[Step]:
    """The group's steps, newest first, each with its undo (one read for all of them, then,
    for each undo that committed, both histories: :func:`~effectgate.sagas.ran_before`)."""
    from ..registry import UNDO_SUFFIX
    from ..sagas import compensation_request, is_undo, ran_before, undo_keys
    from ..store.queue import compensations_of
    from ..translate import effect_record

    records = c.gate.group_steps(group_key)
    store = c.gate.store
    undos = {step: effect_record(row, store.secret, with_history=False)
             for step, row in compensations_of(store.engine, c.gate.namespace, {
                 key: (r.effect_id, r.effect_type + UNDO_SUFFIX) for r in records
                 if r.compensation is not None
                 for key in undo_keys(r)}).items()}
    out = []
    for r in records:
        undo = undos.get(r.effect_id)
        if undo is not None and not is_undo(undo, compensation_request(r)):
            out.append(Step(r, None, False, "not undone: its undo's key is taken by another "
                                            f"effect ({undo.effect_type}, #{undo.effect_id})"))
            continue
        undone = undo is not None and undo.state is State.COMMITTED
        if undo is not None and undone and ran_before(c.gate.get(undo.key), c.gate.get(r.key)):
            out.append(Step(r, undo, False, "not undone: its undo began before the step "
                                            "committed (a person must check the step)"))
            continue
        out.append(Step(r, undo, undone, "" if undo is not None else _why_not(c, r)))
    return out


def summary(report: UnwindReport) -> tuple[str, str]:
    """The message (kind, text) for what one unwind did."""
    now, earlier = len(report.compensated_now), len(report.compensated_earlier)
    left = [f"{len(getattr(report, name))} {name}" for name in
            ("unresolved", "failed", "irreversible") if getattr(report, name)]
    if now:
        text = f"Unwound {report.group_key}: {now} compensated"
        if earlier:
            text += f" ({earlier} compensated earlier)"
    elif earlier:
        text = (f"Unwind of {report.group_key} did nothing new: {earlier} "
                f"step{'s were' if earlier != 1 else ' was'} compensated earlier")
    else:
        text = f"Unwind of {report.group_key} compensated nothing"
    if left:
        text += "; left: " + ", ".join(left) + " (see each step below)"
    return ("ok" if report.complete else "error"), text


async def groups(c: Console, request: Request, who: Principal) -> Response:
    """The groups among recent effects."""
    recent = await run_in_threadpool(lambda: c.gate.list_effects(limit=500))
    seen: list[str] = []
    for e in recent:
        if e.group_key and e.group_key not in seen:
            seen.append(e.group_key)
    return c.page(request, "groups", title="Sagas", groups=seen[:100])


async def group(c: Console, request: Request, who: Principal) -> Response:
    """One group's steps, each marked with its undo, and Unwind (to its confirmation)."""
    from ..sagas import unwind_plan

    key = request.query_params.get("group") or ""
    found = await run_in_threadpool(steps_of, c, key)
    seen = (await run_in_threadpool(unwind_plan, c.gate, key))[1] if found else ""
    return c.page(request, "group", title=f"Saga {key}", group=key, steps=found, seen=seen)


async def confirm_unwind(c: Console, request: Request, who: Principal) -> Response:
    """The confirmation: exactly which undos Unwind will run (nothing is run here)."""
    import json
    import urllib.parse

    from ..sagas import undo_at, unwind_plan

    key = request.query_params.get("group") or ""
    runs, seen = await run_in_threadpool(unwind_plan, c.gate, key)
    at = await run_in_threadpool(lambda: [undo_at(c.gate, r)[0]["key"] for r in runs])
    problem = None
    if request.query_params.get("seen", seen) != seen:
        problem = (f"{key} changed since you reviewed it. Nothing was undone; review it "
                   "again.")
    elif not runs:
        problem = ("An unwind would run no undo now: each step is undone already, not "
                   "committed, irreversible, held back or has no compensator here (see each "
                   "step). Nothing was undone.")
    return c.page(request, "confirm_unwind", title=f"Confirm: unwind {key}", group=key,
                  undos=[(r, undo_key, json.dumps(r.compensation, ensure_ascii=False))
                         for r, undo_key in zip(runs, at, strict=True)],
                  seen=seen,
                  back="/groups/view?" + urllib.parse.urlencode({"group": key}),
                  problem=problem)


async def unwind(c: Console, request: Request, who: Principal) -> Response:
    """Unwind the group as the signed-in operator, if it is still as the confirmation showed
    it, beginning no undo it did not name; back to its page with what was done."""
    import urllib.parse

    from ..sagas import unwind_plan

    form = c.form(request)
    key = str(form.get("group") or "")
    back = "/groups/view?" + urllib.parse.urlencode({"group": key})
    runs, seen = await run_in_threadpool(unwind_plan, c.gate, key)
    if form.get("seen") != seen:
        return c.redirect(back, ("error", f"Refused: {key} changed since you reviewed it. "
                                          "Nothing was undone; review it again."))
    # the same saga as confirmed, so these are the undos the confirmation named: no other runs
    confirmed = frozenset(r.effect_id for r in runs)
    report = await run_in_threadpool(
        lambda: c.gate.acting_as(who).unwind(key, confirmed=confirmed))
    kind, text = summary(report)
    detail: dict[str, Any] = {"compensated now": len(report.compensated_now),
                              "compensated earlier": len(report.compensated_earlier)}
    for name in ("unresolved", "failed", "irreversible", "skipped"):
        detail[name] = len(getattr(report, name))
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, "unwind", subject=key,
        detail=", ".join(f"{n} {name}" for name, n in detail.items() if n) or "no steps"))
    return c.redirect(back, (kind, text + warning))
