"""Postgres: the reservation as one server-side call.

A reservation reads the key and inserts it only when absent. On SQLite the client does that
(an embedded read costs microseconds). Over a network it must be one round trip, and a single
SQL statement that both reads and may insert (a data-modifying CTE) costs a repeat — the
common refusal — twice a plain read on the server. So on Postgres the same two statements run
inside a small PL/pgSQL function: the read, and the insert only when the read found nothing.

The function is *generated* from the two statements that :class:`~effectgate.store.Statements`
compiles for the dialect, so the SQL is still written once. Its name carries a hash of its
text: each version of effectgate installs (and calls) its own, and versions sharing one
database never replace each other's. The functions are rendered ahead of time into
:mod:`effectgate.store.pg_texts` with the statements, and installed by
:func:`effectgate.store.sql.install`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.sqltypes import NullType

from .schema import effects

__all__ = ["ReserveFunction"]

_BIND = re.compile(r"%\((\w+)\)s")
# Seconds of a new lease that may pass between computing it and the insert's end (the
# statement's own work) before the lease is restarted from the clock.
_LOST_LEASE = 0.01


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'").replace("\t", "\\t")
    return "E'" + text.replace("\n", "\\n") + "'"


class ReserveFunction:
    """The generated function for one pair of (read, insert) statements.

    With ``charges`` (the statements that count a cost against one ceiling, and against a
    per-day one), the function is the governed reservation: read; else charge every ceiling
    the request falls under; else insert, with the charged counters recorded in the row. All
    of it is one statement, so one round trip and all or nothing: a ceiling that refuses its
    charge raises ``SQLSTATE EGOVR`` with the ceiling's position, which rolls back the charges
    already made (the caller then writes the refusal); an insert that finds the key taken by
    another writer since the read raises ``SQLSTATE EGDUP``, which rolls its charges back
    too (the caller reads the key again).

    With ``order`` (the names of its binds), the call takes them by position in that order
    (``%s``): the driver binds a tuple without looking each name up in a mapping."""

    def __init__(self, fetch: ClauseElement, insert: ClauseElement, dialect: Any,
                 columns: list[tuple[str, str]], *, prefix: str = "effectgate_reserve_",
                 charges: tuple[ClauseElement, ClauseElement] | None = None,
                 order: tuple[str, ...] | None = None) -> None:
        compiled: list[Any] = [fetch.compile(dialect=dialect), insert.compile(dialect=dialect)]
        if charges is not None:
            compiled += [charges[0].compile(dialect=dialect), charges[1].compile(dialect=dialect)]
        # In the governed function these are the loop's, or its own: not parameters.
        own = {"scope_key": "p_scope_keys[i]", "limit": "p_limits[i]",
               "budget_keys": "v_budget_keys"} if charges is not None else {}
        params: dict[str, str] = {}
        defaults: dict[str, Any] = {}
        for one in compiled:
            for name, bind in one.binds.items():
                if name in own:
                    continue
                if bind.value is not None and not bind.required:
                    defaults[name] = bind.value
                elif name not in params:
                    kind = bind.type
                    params[name] = "text" if isinstance(kind, NullType) else str(
                        kind.compile(dialect=dialect))

        def body(sql: str) -> str:
            def swap(match: re.Match[str]) -> str:
                name = match.group(1)
                if name in own:
                    return own[name]
                return _literal(defaults[name]) if name in defaults else f"p_{name}"
            return _BIND.sub(swap, sql)

        signature = [f"p_{name} {kind}" for name, kind in params.items()]
        declare, charge = "DECLARE\n  v_clock double precision;\n", ""
        if charges is not None:
            signature += ["p_scope_keys text[]", "p_limits bigint[]", "p_per_day boolean[]"]
            declare += ("  v_key text;\n  v_spent bigint;\n"
                        "  v_keys text[] := '{}';\n  v_budget_keys text;\n")
            charge = (
                "  FOR i IN 1 .. coalesce(array_length(p_scope_keys, 1), 0) LOOP\n"
                "    v_key := NULL;\n"
                "    IF p_cost > p_limits[i] THEN\n"
                "      v_key := NULL;\n"
                "    ELSIF p_per_day[i] THEN\n"
                f"      {body(compiled[3].string)} INTO v_key, v_spent;\n"
                "    ELSE\n"
                f"      {body(compiled[2].string)} INTO v_key, v_spent;\n"
                "    END IF;\n"
                "    IF v_key IS NULL THEN\n"
                "      RAISE EXCEPTION USING ERRCODE = 'EGOVR',\n"
                "        MESSAGE = 'effectgate: over ceiling ' || i;\n"
                "    END IF;\n"
                "    v_keys := v_keys || v_key;\n"
                "  END LOOP;\n"
                "  IF cardinality(v_keys) > 0 THEN v_budget_keys := to_json(v_keys)::text; "
                "END IF;\n"
            )
        # A governed reservation that charged and then found the key taken (another writer
        # inserted it since the read) raises, so its charges roll back: they would be
        # recorded on no effect, and never released.
        taken = ("    RAISE EXCEPTION USING ERRCODE = 'EGDUP',\n"
                 "      MESSAGE = 'effectgate: the key was taken';\n"
                 ) if charges is not None else "    RETURN;\n"
        # Postgres computes an insert's values before it waits on the unique index for another
        # writer's uncommitted insert of the key (a worker that died mid-transaction): had
        # that one rolled back after a wait, the lease would be told out shortened by it, or
        # already over. The row is still this transaction's alone, so its lease is restarted
        # from the clock after the wait, before anyone can read it.
        outs, table = ", ".join(name for name, _ in columns), effects.name
        restart = (
            "  v_clock := CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION);\n"
            f"  IF lease_expires_at < v_clock + p_lease_seconds - {_LOST_LEASE} THEN\n"
            "    lease_expires_at := v_clock + p_lease_seconds;\n"
            "    now := v_clock;\n"
            f"    UPDATE {table} SET lease_expires_at = v_clock + p_lease_seconds\n"
            f"      WHERE {table}.namespace = p_namespace AND {table}.key = p_key;\n"
            "  END IF;\n"
            "  RETURN NEXT;\n"
        )
        self.params = params
        returns = ", ".join(f"{name} {kind}" for name, kind in columns)
        source = (
            f"({', '.join(signature)}) RETURNS TABLE ({returns}) LANGUAGE plpgsql AS "
            f"$effectgate$\n#variable_conflict use_column\n{declare}BEGIN\n"
            f"  RETURN QUERY {body(compiled[0].string)};\n"
            "  IF FOUND THEN RETURN; END IF;\n"
            f"{charge}"
            f"  {body(compiled[1].string)} INTO {outs};\n"
            f"  IF NOT FOUND THEN\n{taken}  END IF;\n"
            f"{restart}END\n$effectgate$"
        )
        self.name = prefix + hashlib.sha256(source.encode()).hexdigest()[:12]
        self.ddl = f"CREATE OR REPLACE FUNCTION {self.name}{source}"
        if order is not None:  # called with positional binds, in that order
            if set(order) != set(params):
                raise AssertionError(f"the order {order} does not name {list(params)}")
            args = [f"CAST(%s AS {params[name]})" for name in order]
        else:
            args = [f"CAST(%({name})s AS {kind})" for name, kind in params.items()]
        if charges is not None:
            args += ["%(scope_keys)s", "%(limits)s", "%(per_day)s"]
        self.call = f"SELECT * FROM {self.name}({', '.join(args)})"
        self.order = order
