"""The record of what operators did: who approved, denied, resolved, reconciled or unwound
what, who added or revoked a principal, who signed in and out of the console — and when.

Each effect's history and each approval already say who moved *it*; nothing said what a
person did across them, nor who managed principals or signed in. This is that record, one
append-only table (``effectgate_audit``, schema version 5). The console and the ``effectgate``
CLI append an entry once an action has succeeded (``via`` says which); an action made in code
through the Gate API is in the history of what it changed, not here. Entries carry names and
ids, and a detail (an outcome, a note, a reason) that passes the gate's text redactor, as
every stored note does.
"""

from __future__ import annotations

import datetime
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from . import validate
from .errors import ConfigError

if TYPE_CHECKING:
    from .gate import Gate
    from .store.audit import AuditRow

__all__ = ["ACTIONS", "AuditEntry", "list_actions", "record_action"]

ACTIONS = ("approve", "deny", "login", "logout", "principal.add", "principal.revoke",
           "reconcile", "resolve", "unwind")
_VIA = re.compile(r"[a-z][a-z0-9-]{0,15}")
_MAX_DETAIL = 2 * validate.MAX_TEXT
"""Room for the longest note or reason an act takes with what the caller says around it:
an act done must never go unaudited for the length of its free text."""


class AuditEntry(NamedTuple):
    """One operator's action: ``actor`` did ``action`` to ``subject`` (a key, an approval id,
    a saga group, a principal's name) through ``via`` (``console``, ``cli``) at ``at``."""

    entry_id: int
    at: datetime.datetime
    actor: str
    action: str
    subject: str | None
    effect_id: int | None
    via: str
    detail: str | None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        out = self._asdict()
        out["at"] = self.at.isoformat().replace("+00:00", "Z")
        return out


def _entry(row: AuditRow) -> AuditEntry:
    at = datetime.datetime.fromtimestamp(row.at, datetime.UTC)
    return AuditEntry(row.id, at, row.actor, row.action, row.subject, row.effect_id, row.via,
                      row.detail)


def _action(action: object) -> str:
    if action not in ACTIONS:
        raise ConfigError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}"[:300])
    assert isinstance(action, str)
    return action


def record_action(gate: Gate, actor: str, action: str, *, via: str,
                  subject: str | None = None, effect_id: int | None = None,
                  detail: str | None = None) -> AuditEntry:
    """Append that ``actor`` did ``action`` (one of :data:`ACTIONS`) in the gate's namespace;
    the entry as stored (its time is the store's clock). Call it once the action succeeded."""
    from .store.audit import insert_audit

    name = validate.text(actor, "actor", 256, required=True) or ""
    what = _action(action)
    if not isinstance(via, str) or not _VIA.fullmatch(via):
        raise ConfigError(f"via is a short lower-case name (console, cli), not {via!r}"[:200])
    about = validate.text(subject, "subject", 512)
    if effect_id is not None:
        effect_id = validate.whole(effect_id, "effect_id", minimum=1)
    said = gate._redact(validate.text(detail, "detail", _MAX_DETAIL))
    row = insert_audit(gate.store.engine, namespace=gate.namespace, actor=name, action=what,
                       subject=about, effect_id=effect_id, via=via, detail=said)
    return _entry(row)


def list_actions(gate: Gate, *, actor: str | None = None, action: str | None = None,
                 subject: str | None = None, before_id: int | None = None,
                 limit: int = 50) -> list[AuditEntry]:
    """The namespace's entries newest first, each filter an exact match; ``before_id`` pages
    on (the ``entry_id`` of the last entry of the page before). At most 500 a page."""
    from .store.audit import audit_page

    limit = validate.whole(limit, "limit", minimum=1)
    if limit > 500:
        raise ConfigError("limit is at most 500")
    if before_id is not None:
        before_id = validate.whole(before_id, "before_id", minimum=1)
    rows = audit_page(gate.store.engine, gate.namespace,
                      actor=validate.text(actor, "actor", 256),
                      action=None if action is None else _action(action),
                      subject=validate.text(subject, "subject", 512),
                      before_id=before_id, limit=limit)
    return [_entry(r) for r in rows]
