"""The approvals pages: the queue (searchable by state, key, type, who asked and run; paged,
newest first; each row with what will execute, who asked, the run, when it was requested,
the cost and the expiry), one approval (where notifications link), and Approve / Deny."""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..errors import ConfigError, EffectGateError, Forbidden, Unauthenticated, UnknownEffect
from ..governance import dollars
from ..redact import visible
from ..states import ApprovalState
from .app import when
from .pages import AsIs

if TYPE_CHECKING:
    from ..principals import Principal
    from ..records import ApprovalRecord
    from .app import Console

__all__ = ["PAGE", "decide", "listing", "one", "view_of"]

PAGE = 50
_STATES = ("pending", "approved", "denied", "consumed", "expired", "any")
_FIELDS = {"key": 512, "type": 200, "by": 256, "run": 256}


def view_of(a: ApprovalRecord) -> dict[str, Any]:
    """What a row of the queue shows for ``a``."""
    args = a.arguments
    return {
        "approval_id": a.approval_id, "effect_id": a.effect_id,
        "effect_type": a.effect_type, "key": a.key, "payload_hash": a.payload_hash,
        "arguments_text": AsIs("(cleared once decided)" if args is None else visible(
            json.dumps(args, indent=2, ensure_ascii=False, sort_keys=True), newlines=True)),
        "requested_by": a.requested_by, "run_id": a.run_id,
        "requested_at": when(a.created_at),
        "cost": "" if a.estimated_cost_micros is None else dollars(a.estimated_cost_micros),
        "expires": when(a.expires_at), "state": a.state.value,
        "pending": a.state is ApprovalState.PENDING, "decided_by": a.decided_by,
        "reason": a.reason,
    }


def _checked(name: str, value: str, limit: int) -> str:
    """A query field as given, refused (:class:`ConfigError`) when longer than ``limit`` or
    holding a NUL (which no store column can hold: Postgres refuses it)."""
    if len(value) > limit:
        raise ConfigError(f"{name} is at most {limit} characters")
    if "\x00" in value:
        raise ConfigError(f"{name} must not contain NUL characters")
    return value


def _cursor(text: str | None) -> tuple[float, str] | None:
    """``before=<requested-at>~<id>`` as the page's cursor; None when absent."""
    if not text:
        return None
    at, sep, ident = _checked("before", text, 100).partition("~")
    try:
        stamp = float(at)
    except ValueError:
        stamp = float("nan")
    if not sep or stamp != stamp or not 0 <= stamp < 1e11 or not ident or len(ident) > 64:
        raise ConfigError("before: not a cursor of this page")
    return stamp, ident


def _query(request: Request) -> dict[str, str]:
    q = {name: _checked(name, (request.query_params.get(name) or "").strip(), limit)
         for name, limit in _FIELDS.items()}
    state = request.query_params.get("state") or "pending"
    if state not in _STATES:
        raise ConfigError(f"state must be one of {', '.join(_STATES)}")
    q["state"] = state
    return q


async def listing(c: Console, request: Request, who: Principal) -> Response:
    """The approvals queue: pending ones by default; search and paging by query string."""
    from ..store.queue import approvals_page
    from ..translate import approval_record

    q = _query(request)
    before = _cursor(request.query_params.get("before"))
    state = None if q["state"] == "any" else ApprovalState(q["state"])
    page = await run_in_threadpool(lambda: approvals_page(
        c.gate.store.engine, c.gate.namespace, state=state, key_prefix=q["key"] or None,
        effect_type=q["type"] or None, requested_by=q["by"] or None, run_id=q["run"] or None,
        before=before, limit=PAGE))
    kept = {k: v for k, v in q.items() if v and not (k == "state" and v == "pending")}
    next_query = None if page.next_before is None else urllib.parse.urlencode(
        {**kept, "before": f"{page.next_before[0]!r}~{page.next_before[1]}"})
    heading = "Pending approvals" if q["state"] == "pending" else "Approval requests"
    return c.page(request, "approvals", title="Approvals", heading=heading, q=q,
                  states=_STATES, total=page.total,
                  approvals=[view_of(approval_record(r)) for r in page.rows],
                  next_query=next_query,
                  first_query=urllib.parse.urlencode(kept) if before else None)


async def one(c: Console, request: Request, who: Principal) -> Response:
    """One approval request (the page notifications link to)."""
    approval_id = request.path_params["approval_id"]
    record = await run_in_threadpool(c.gate.approval, approval_id)
    return c.page(request, "approval", title=f"Approval {approval_id}", a=view_of(record))


async def decide(c: Console, request: Request, who: Principal) -> Response:
    """Approve or deny, as the signed-in operator; back to the queue with what was done."""
    approval_id = request.path_params["approval_id"]
    verb = request.path_params["verb"]
    form = c.form(request)
    acting = c.gate.acting_as(who)
    back = c.back(request, "/approvals")
    try:
        if verb == "approve":
            record = await run_in_threadpool(acting.approve, approval_id)
            text = f"Approved: {record.key}"
            detail = None
        elif verb == "deny":
            reason = form.get("reason") or None
            record = await run_in_threadpool(lambda: acting.deny(approval_id, reason=reason))
            text = f"Denied: {record.key}"
            detail = None if reason is None else f"reason: {reason}"
        else:
            return c.refuse(request, 404, "Not found", "no such action")
    except (ConfigError, Forbidden, Unauthenticated, UnknownEffect):
        raise  # refused as such by the console (nothing was done)
    except EffectGateError as err:
        return c.redirect(back, ("error", f"Refused: {err.message}"))
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, verb, subject=record.key, effect_id=record.effect_id,
        detail=f"approval {record.approval_id}" + (f"; {detail}" if detail else "")))
    return c.redirect(back, ("ok", text + warning))
