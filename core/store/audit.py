"""The SQL of the record of operators' actions (``effectgate_audit``): append one entry, and
read a page of them newest first (by the primary key, filtered). Entries are never updated;
every rule (which actions, what is redacted) lives in :mod:`effectgate.audit`."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Engine, select

from ..errors import StoreError
from .schema import audit, db_now

__all__ = ["AuditRow", "audit_page", "insert_audit"]


class AuditRow(NamedTuple):
    """One stored entry."""

    id: int
    namespace: str
    at: float
    actor: str
    action: str
    subject: str | None
    effect_id: int | None
    via: str
    detail: str | None


def insert_audit(engine: Engine, *, namespace: str, actor: str, action: str,
                 subject: str | None, effect_id: int | None, via: str,
                 detail: str | None) -> AuditRow:
    """Append one entry, stamped with the store's clock; the entry as stored."""
    try:
        with engine.begin() as conn:
            row = conn.execute(audit.insert().values(
                namespace=namespace, at=db_now(), actor=actor, action=action,
                subject=subject, effect_id=effect_id, via=via, detail=detail,
            ).returning(*audit.c)).one()
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return AuditRow._make(tuple(row))


def audit_page(engine: Engine, namespace: str, *, actor: str | None = None,
               action: str | None = None, subject: str | None = None,
               before_id: int | None = None, limit: int = 50) -> list[AuditRow]:
    """Entries of ``namespace`` newest first (at most ``limit``, below ``before_id``), each
    filter an exact match."""
    a = audit.c
    where: Any = a.namespace == namespace
    for column, value in (("actor", actor), ("action", action), ("subject", subject)):
        if value is not None:
            where = where & (a[column] == value)
    if before_id is not None:
        where = where & (a.id < before_id)
    stmt = select(*audit.c).where(where).order_by(a.id.desc()).limit(limit)
    try:
        with engine.connect() as conn:
            return [AuditRow._make(tuple(r)) for r in conn.execute(stmt)]
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
