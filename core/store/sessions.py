"""The SQL of the console's server-side sessions (``effectgate_sessions``): start one, read it
with its principal (one indexed read of each primary key), end it, and forget old ones.

A session row names the principal by token id; the cookie carries a random secret whose
SHA-256 is the row's primary key, so the store never holds a usable cookie. Times are the
store's clock. Every rule (who may sign in, what a session may do) lives in
:mod:`effectgate.console.auth`.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Engine, delete, select

from ..errors import StoreError
from .rows import PrincipalRow, principal_row
from .schema import db_now, principals, sessions

__all__ = ["SessionRow", "end_session", "insert_session", "purge_sessions",
           "session_with_principal"]

# Ended or expired sessions are kept this long (seconds), then deleted at the next sign-in.
KEEP_ENDED_SECONDS = 86400.0


class SessionRow(NamedTuple):
    """One console session (never its secret) and the store's clock."""

    id: str
    namespace: str
    token_id: str
    name: str
    created_at: float
    expires_at: float
    ended_at: float | None
    now: float


def _fail(err: Exception) -> StoreError:
    return StoreError(f"the store failed: {type(err).__name__}")


def insert_session(engine: Engine, *, session_id: str, namespace: str, token_id: str,
                   name: str, seconds: float) -> None:
    """Start a session that lasts ``seconds`` from now (the store's clock)."""
    now = db_now()
    try:
        with engine.begin() as conn:
            conn.execute(sessions.insert().values(
                id=session_id, namespace=namespace, token_id=token_id, name=name,
                created_at=now, expires_at=now + seconds))
    except Exception as err:
        raise _fail(err) from err


def session_with_principal(engine: Engine, session_id: str,
                           ) -> tuple[SessionRow, PrincipalRow | None] | None:
    """The session ``session_id`` and its principal as stored now (None when the principal
    row is gone); None when there is no such session."""
    s, p = sessions.c, principals.c
    now = db_now().label("now")
    stmt = (select(*sessions.c, now, *[p[name] for name in PrincipalRow._fields[:-1]])
            .select_from(sessions.outerjoin(principals, p.token_id == s.token_id))
            .where(s.id == session_id))
    try:
        with engine.connect() as conn:
            row = conn.execute(stmt).first()
    except Exception as err:
        raise _fail(err) from err
    if row is None:
        return None
    values = tuple(row)
    width = len(SessionRow._fields)
    session = SessionRow._make(values[:width])
    rest = values[width:]
    if rest[0] is None:
        return session, None
    return session, principal_row((*rest, session.now))


def end_session(engine: Engine, session_id: str) -> bool:
    """End a session now (signing out); False when it had ended already or does not exist."""
    s = sessions.c
    try:
        with engine.begin() as conn:
            done = conn.execute(sessions.update().where(
                (s.id == session_id) & s.ended_at.is_(None)).values(ended_at=db_now()))
            return bool(done.rowcount)
    except Exception as err:
        raise _fail(err) from err


def purge_sessions(engine: Engine, namespace: str) -> int:
    """Delete the namespace's sessions that expired or ended over a day ago; how many."""
    s = sessions.c
    old = db_now() - KEEP_ENDED_SECONDS
    try:
        with engine.begin() as conn:
            done = conn.execute(delete(sessions).where(
                (s.namespace == namespace) & ((s.expires_at < old) | (s.ended_at < old))))
            return int(done.rowcount or 0)
    except Exception as err:
        raise _fail(err) from err
