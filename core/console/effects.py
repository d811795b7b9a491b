"""The effects pages: the overview, the AMBIGUOUS queue, effects search, one effect's
timeline, and settling an effect — Reconcile now, and Resolve in two steps.

A resolve records a human's verdict, so it is never one click and has no default: the form
(a GET, writing nothing) asks for an outcome and a note and leads to a confirmation page that
names exactly what will be recorded — outcome, key, effect, note, who, and whether it is
forced — and only its button writes. The form carries the state and fencing token of the
page the verdict was made on (the effect's page or the AMBIGUOUS queue), and the
confirmation carries them on: if the effect moved in between (its holder reported, someone
else resolved it, a new attempt ran), the confirmation or the resolve is refused and the
operator reviews again — a verdict about one attempt is never recorded on the next.
Resolve is offered only where the state machine allows it
(:func:`effectgate.decide.resolution`, the rule the Gate applies): on an AMBIGUOUS effect
either way, on a FAILED one as committed. A live lease is offered only as an explicit
*forced* resolve that says what it risks.
"""

from __future__ import annotations

import datetime
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .. import decide
from ..errors import (
    ConfigError,
    EffectGateError,
    Forbidden,
    InvalidTransition,
    Unauthenticated,
    UnknownEffect,
)
from ..governance import decided_next, dollars
from ..states import Outcome, State
from .app import ago, before_of, safe_next, when, whole

if TYPE_CHECKING:
    from ..principals import Principal
    from ..records import EffectRecord
    from .app import Console

__all__ = ["ambiguous", "confirm_resolve", "offer", "one", "overview", "reconcile", "resolve",
           "search"]

_PAGE = 50
_MAX_NOTE = 2000
_MEANING = {
    "committed": "it happened: a repeat of this key is answered without running it again",
    "failed": "it certainly did not happen: a new attempt may run it (under the same vendor "
              "idempotency key)",
}


async def overview(c: Console, request: Request, who: Principal) -> Response:
    """Counts by state, the oldest AMBIGUOUS age, pending approvals, spend."""
    from ..store.queue import oldest_ambiguous, pending_approvals, spend_counters

    gate = c.gate
    counts = await run_in_threadpool(gate.count_by_state)
    oldest = await run_in_threadpool(oldest_ambiguous, gate.store.engine, gate.namespace)
    _, pending = await run_in_threadpool(pending_approvals, gate.store.engine,
                                         gate.namespace, 1)
    spend = await run_in_threadpool(spend_counters, gate.store.engine, gate.namespace)
    return c.page(
        request, "overview", title="Overview",
        counts={s.value: counts.get(s, 0) for s in State},
        oldest=None if oldest is None else ago(oldest),
        pending=pending,
        spend=[{"scope": k, "spent": dollars(v), "updated": when(
            datetime.datetime.fromtimestamp(at, datetime.UTC))} for k, v, at in spend])


async def ambiguous(c: Console, request: Request, who: Principal) -> Response:
    """The AMBIGUOUS queue, a page at a time down the primary key."""
    before = before_of(request)
    found, cursor = await run_in_threadpool(
        lambda: c.gate.ambiguous_queue(before_id=before, limit=_PAGE))
    now = datetime.datetime.now(datetime.UTC)

    def age(e: EffectRecord) -> str:
        since = e.lease_expires_at if e.lease_lapsed and e.lease_expires_at else e.updated_at
        return ago((now - since).total_seconds())

    return c.page(request, "ambiguous", title="Ambiguous", effects=found,
                  next_before=cursor, before=before, age=age, seen_of=_seen)


async def search(c: Console, request: Request, who: Principal) -> Response:
    """Effects by key prefix, type, state, run and agent, newest first."""
    q = {name: (request.query_params.get(name) or "").strip()
         for name in ("key", "type", "state", "run", "agent")}
    before = before_of(request)
    found = await run_in_threadpool(lambda: c.gate.list_effects(
        key_prefix=q["key"] or None, effect_type=q["type"] or None,
        state=q["state"] or None, run_id=q["run"] or None, agent_id=q["agent"] or None,
        limit=_PAGE, before_id=before))
    cursor = found[-1].effect_id if len(found) == _PAGE else None
    next_query = urllib.parse.urlencode({**{k: v for k, v in q.items() if v},
                                         "before": cursor or ""})
    return c.page(request, "effects", title="Effects", effects=found, q=q,
                  states=[s.value for s in State], next_before=cursor,
                  next_query=next_query)


def offer(c: Console, record: EffectRecord) -> dict[str, Any]:
    """What resolving ``record`` may record now, as the state machine says: the outcomes
    allowed, and whether only a forced resolve (a live lease) would be."""
    head = c.gate.store.fetch(c.gate.namespace, record.key)
    if head is None:
        return {"outcomes": (), "forced": False, "until": ""}
    for force in (False, True):
        allowed = []
        for outcome in (Outcome.COMMITTED, Outcome.FAILED):
            try:
                decide.resolution(head, outcome, force=force)
            except InvalidTransition:
                continue
            allowed.append(outcome.value)
        if allowed:
            return {"outcomes": tuple(allowed), "forced": force,
                    "until": when(record.lease_expires_at) if force else ""}
    return {"outcomes": (), "forced": False, "until": ""}


def _undo_of(c: Console, record: EffectRecord) -> Any:
    """The compensation that undid ``record`` (a saga step), or None."""
    from ..registry import UNDO_SUFFIX
    from ..sagas import undo_keys
    from ..store.queue import compensations_of
    from ..translate import effect_record

    if record.compensates_effect_id is not None or record.compensation is None:
        return None
    store = c.gate.store
    found = compensations_of(store.engine, c.gate.namespace,
                             dict.fromkeys(undo_keys(record), (
                                 record.effect_id, record.effect_type + UNDO_SUFFIX)))
    row = found.get(record.effect_id)
    return None if row is None else effect_record(row, store.secret, with_history=False)


async def one(c: Console, request: Request, who: Principal) -> Response:
    """One effect: its fields, what undid it, Resolve where allowed, and its timeline."""
    record = await run_in_threadpool(c.gate.get_by_id,
                                     whole(request.path_params["effect_id"]) or 0)
    shown = record.as_dict()
    fields = [(k, "" if v is None else (json.dumps(v, ensure_ascii=False)
                                        if isinstance(v, (dict, list)) else v))
              for k, v in shown.items() if k not in ("history", "effect_id")]
    chances = await run_in_threadpool(offer, c, record)
    undo = await run_in_threadpool(_undo_of, c, record)
    decided = await run_in_threadpool(_decided_of, c, record)
    return c.page(request, "effect", title=f"Effect #{record.effect_id}", e=record,
                  fields=fields, offer=chances, undo=undo, seen_of=_seen, decided=decided)


def _decided_of(c: Console, record: EffectRecord) -> dict[str, Any] | None:
    """The approval ``record`` still waits on once a person decided it (an approved effect a
    spend ceiling refused when the call came waits, approved, for room; its ``reason`` says
    which ceiling): who decided, when, and what the next call does, in the words
    ``effectgate ls`` uses. None while the approval is pending."""
    if record.state is not State.PENDING_APPROVAL or not record.approval_id:
        return None
    try:
        approval = c.gate.approval(record.approval_id)
    except UnknownEffect:
        return None
    state = str(approval.state)
    if state == "pending":
        return None
    return {"a": approval, "state": state, "at": when(approval.decided_at),
            "next": decided_next(state, record.reason)}


def _seen(record: EffectRecord) -> str:
    """The state and fencing token of ``record``: what a review of it saw."""
    return f"{record.state.value}:{record.lease_token}"


async def confirm_resolve(c: Console, request: Request, who: Principal) -> Response:
    """The confirmation: exactly what Record will write (nothing is written here)."""
    record = await run_in_threadpool(c.gate.get_by_id,
                                     whole(request.path_params["effect_id"]) or 0)
    params = request.query_params
    back = safe_next(params.get("back"), f"/effects/{record.effect_id}")
    outcome = params.get("outcome") or ""
    note = (params.get("note") or "").strip()
    problem, forced = None, False
    if params.get("seen", _seen(record)) != _seen(record):
        problem = (f"{record.key} changed since you reviewed it (it is {record.state.value} "
                   f"now, attempt {record.attempt}). Nothing was recorded; review it again.")
    elif outcome not in _MEANING:
        problem = "Choose what happened — committed or failed. Nothing was recorded."
    elif len(note) > _MAX_NOTE or "\x00" in note:
        problem = f"The note is at most {_MAX_NOTE} characters, without NUL. Nothing was recorded."
    else:
        head = await run_in_threadpool(c.gate.store.fetch, c.gate.namespace, record.key)
        try:
            if head is None:
                raise UnknownEffect(f"no effect with key {record.key!r}")
            forced = decide.resolution(head, Outcome(outcome),
                                       force=params.get("force") == "1").forced
        except InvalidTransition as err:
            problem = f"{err.message}. Nothing was recorded."
    return c.page(request, "confirm", title=f"Confirm: resolve #{record.effect_id}", e=record,
                  outcome=outcome, note=note, meaning=_MEANING.get(outcome, ""),
                  forced=forced, until=when(record.lease_expires_at), seen=_seen(record),
                  back=back, problem=problem)


async def resolve(c: Console, request: Request, who: Principal) -> Response:
    """Record the confirmed verdict, as the signed-in operator, if the effect is still as the
    operator saw it."""
    effect_id = whole(request.path_params["effect_id"]) or 0
    form = c.form(request)
    record = await run_in_threadpool(c.gate.get_by_id, effect_id)
    back = c.back(request, f"/effects/{effect_id}")
    outcome = form.get("outcome")
    if outcome not in _MEANING:
        return c.redirect(back, ("error", "Refused: choose what happened — committed or "
                                          "failed. Nothing was recorded."))
    if form.get("seen") != _seen(record):
        return c.redirect(f"/effects/{effect_id}", (
            "error", f"Refused: {record.key} changed since you reviewed it (it is "
                     f"{record.state.value} now). Nothing was recorded; review it again."))
    note = str(form.get("note") or "").strip() or None
    force = form.get("force") == "1"
    try:
        done = await run_in_threadpool(lambda: c.gate.acting_as(who).resolve(
            record.key, str(outcome), note=note, force=force, expected=record))
    except (ConfigError, Forbidden, Unauthenticated, UnknownEffect):
        raise
    except EffectGateError as err:
        return c.redirect(back, ("error", f"Refused: {err.message}"))
    detail = f"outcome {done.state.value}" + ("; forced" if force else "") + (
        f"; note: {note}" if note else "")
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, "resolve", subject=done.key, effect_id=done.effect_id, detail=detail))
    return c.redirect(back, ("ok", f"Resolved {done.key}: {done.state.value}{warning}"))


async def reconcile(c: Console, request: Request, who: Principal) -> Response:
    """Ask the registered reconcile hook now."""
    effect_id = whole(request.path_params["effect_id"]) or 0
    record = await run_in_threadpool(c.gate.get_by_id, effect_id)
    back = c.back(request, f"/effects/{effect_id}")
    try:
        done = await run_in_threadpool(c.gate.acting_as(who).reconcile, record.key)
    except (Forbidden, Unauthenticated, UnknownEffect):
        raise
    except EffectGateError as err:
        return c.redirect(back, ("error", f"Refused: {err.message}"))
    told = done.state is not State.AMBIGUOUS
    text = (f"Reconciled {done.key}: {done.state.value}" if told
            else f"The reconcile hook could not tell: {done.key} stays ambiguous")
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, "reconcile", subject=done.key, effect_id=done.effect_id,
        detail=f"verdict: {done.state.value}" if told else "the hook could not tell"))
    return c.redirect(back, ("ok", text + warning))
