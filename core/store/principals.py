"""The SQL of principals (``effectgate_principals``): insert, the one indexed read that
authenticates a token, the last-used stamp, revocation and the list. Rows go up typed
(:class:`~effectgate.store.rows.PrincipalRow`); hashing and every rule live in
:mod:`effectgate.principals`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from ..errors import StoreError
from .rows import PrincipalRow, principal_row
from .schema import db_now, principals

__all__ = ["TOUCH_EVERY_SECONDS", "insert_principal", "list_principals", "principal_by_name",
           "principal_by_token_id", "revoke_principal", "touch_principal"]

# A principal used within this many seconds is not stamped again (no write per request).
TOUCH_EVERY_SECONDS = 60.0


def _columns() -> list[Any]:
    return [principals.c[name] for name in PrincipalRow._fields[:-1]] + [db_now().label("now")]


def insert_principal(engine: Engine, *, token_id: str, namespace: str, name: str, role: str,
                     salt: str, token_hash: str) -> PrincipalRow | None:
    """Insert a principal; None when the name (or, astronomically rarely, the token id) is
    taken in that namespace."""
    try:
        with engine.begin() as conn:
            conn.execute(principals.insert().values(
                token_id=token_id, namespace=namespace, name=name, role=role, salt=salt,
                token_hash=token_hash, created_at=db_now()))
            row = conn.execute(select(*_columns()).where(
                principals.c.token_id == token_id)).one()
            return principal_row(row)
    except IntegrityError:
        return None
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err


def principal_by_token_id(engine: Engine, token_id: str) -> PrincipalRow | None:
    """The principal whose token starts with ``token_id`` (the primary key), or None."""
    return _one(engine, principals.c.token_id == token_id)


def principal_by_name(engine: Engine, namespace: str, name: str) -> PrincipalRow | None:
    """The principal ``name`` of ``namespace``, or None."""
    return _one(engine, (principals.c.namespace == namespace) & (principals.c.name == name))


def _one(engine: Engine, where: Any) -> PrincipalRow | None:
    try:
        with engine.connect() as conn:
            row = conn.execute(select(*_columns()).where(where)).first()
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return None if row is None else principal_row(row)


def touch_principal(engine: Engine, token_id: str) -> None:
    """Stamp the last use (at most once a minute per principal, so a busy agent costs no write
    per request)."""
    p = principals.c
    now = db_now()
    stmt = principals.update().where(
        (p.token_id == token_id) & p.revoked_at.is_(None)
        & (p.last_used_at.is_(None) | (p.last_used_at < now - TOUCH_EVERY_SECONDS))
    ).values(last_used_at=now)
    try:
        with engine.begin() as conn:
            conn.execute(stmt)
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err


def revoke_principal(engine: Engine, namespace: str, name: str) -> PrincipalRow | None:
    """Revoke ``name`` (a revoked principal stays revoked; revoking again changes nothing);
    the row after it, or None when there is no such principal."""
    p = principals.c
    mine = (p.namespace == namespace) & (p.name == name)
    try:
        with engine.begin() as conn:
            conn.execute(principals.update().where(mine & p.revoked_at.is_(None))
                         .values(revoked_at=db_now()))
            row = conn.execute(select(*_columns()).where(mine)).first()
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return None if row is None else principal_row(row)


def list_principals(engine: Engine, namespace: str) -> list[PrincipalRow]:
    """Every principal of ``namespace``, by name."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(*_columns()).where(principals.c.namespace == namespace)
                                .order_by(principals.c.name))
            return [principal_row(r) for r in rows]
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
