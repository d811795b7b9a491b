"""``effectgate verify`` as a library: the guarantees (G1–G16, see ``docs/guarantees.md``)
checked against a real store in a scratch namespace that is deleted afterwards (the store's
other data is never read or written).

Each check returns a :class:`CheckResult`: ``passed``, ``failed`` (with what went wrong), or
``not_applicable`` (with why — it never counts as a pass)::

    from effectgate.verify import run_checks

    results = run_checks("sqlite:///.effectgate/effects.db", only=["G1", "G3"])
    assert all(r.status != "failed" for r in results)

G2 races 8 OS processes on many keys and counts the side effect itself (a file the body
appends to); G12 kills worker processes with SIGKILL at every point of the protocol.

``effectgate verify --exhaustive`` also model-checks the protocol: every interleaving of the
2-worker bound explored on the real decision module with an in-memory store
(:mod:`effectgate.verify.model`, :mod:`effectgate.verify.explore`), then a sample of its
schedules replayed on the store through the real gate (:mod:`effectgate.verify.replay`,
:mod:`effectgate.verify.exhaustive`; the replayer drives the sync flow, or with
``drive="async"`` the async one).

A wing above the kernel: the checks use only the public Gate API (and SQL to count and clean
up their own scratch namespace).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ..errors import ConfigError
from ..gate import Gate
from ..store.version import policy_meta_name
from .harness import CheckFailed, CheckResult, NotApplicable, Status, VerifyContext
from .registry import GUARANTEES, all_checks, parse_only

__all__ = [
    "GUARANTEES",
    "CheckFailed",
    "CheckResult",
    "NotApplicable",
    "VerifyContext",
    "junit_xml",
    "parse_only",
    "run_checks",
]

log = logging.getLogger("effectgate")


def run_checks(url: str | None, only: str | Iterable[str] | None = None, *,
               on_result: Callable[[CheckResult], None] | None = None,
               namespace: str | None = None) -> list[CheckResult]:
    """Check the guarantees (all, or ``only`` these ids) against the store at ``url``.

    Everything happens in a fresh namespace (``namespace``, default ``verify-<random>``),
    deleted afterwards. ``on_result`` is called as each check finishes. A store that cannot
    be opened raises :class:`StoreError` before any check runs.
    """
    from ..store import resolve_url

    ids = parse_only(only)
    target = resolve_url(url)
    scratch = namespace or f"verify-{uuid.uuid4().hex[:12]}"
    probe = Gate(target, namespace=scratch, policy=False)  # opens (and migrates) the store
    try:
        if _holds_rows(probe):
            raise ConfigError(f"namespace {scratch!r} already holds effects, approvals, spend, "
                              "principals or a recorded policy; verify writes and then deletes "
                              "everything in its namespace, so it needs an empty one")
    finally:
        probe.close()
    table = all_checks()
    results: list[CheckResult] = []
    used = {scratch}
    try:
        with _scratch_folder() as folder:
            for gid in ids:
                ctx = VerifyContext(url=target, namespace=scratch, folder=folder / gid)
                ctx.folder.mkdir()
                result = _run_one(gid, table[gid], ctx)
                used.update(ctx.others)
                results.append(result)
                if on_result is not None:
                    on_result(result)
    finally:
        for name in sorted(used):
            _delete_namespace(target, name)
    return results


def _run_one(gid: str, check: Callable[[VerifyContext], str], ctx: VerifyContext) -> CheckResult:
    started = time.perf_counter()
    status: Status
    try:
        detail = check(ctx)
        status = "passed"
    except NotApplicable as err:
        status, detail = "not_applicable", str(err)
    except CheckFailed as err:
        status, detail = "failed", str(err)
    except Exception as err:
        status, detail = "failed", f"{type(err).__name__}: {_first_line(err)}"
        log.debug("verify %s failed with an error", gid, exc_info=True)
    finally:
        ctx.close()
    return CheckResult(gid, GUARANTEES[gid], status, detail, time.perf_counter() - started)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def _scratch_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="effectgate-verify-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _namespaced(conn: Any) -> list[tuple[str, str]]:
    """(table, column) for every effectgate table: the column that names a row's namespace
    (``namespace``, or ``effect_id`` for rows of an effect); the effects table last."""
    from sqlalchemy import inspect

    out = []
    for name in sorted(inspect(conn).get_table_names()):
        if not name.startswith("effectgate_") or name == "effectgate_effects":
            continue
        columns = {c["name"] for c in inspect(conn).get_columns(name)}
        if "namespace" in columns:
            out.append((name, "namespace"))
        elif "effect_id" in columns:
            out.append((name, "effect_id"))
    return [*out, ("effectgate_effects", "namespace")]


_OF_EFFECTS = "SELECT id FROM effectgate_effects WHERE namespace = :ns"


def _holds_rows(gate: Gate) -> bool:
    """Whether the gate's namespace holds any row at all (effects, approvals, spend,
    principals, sessions ...), or a policy recorded for it (which the clean-up deletes too:
    a later gate with another policy would then not be warned)."""
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        for table, column in _namespaced(conn):
            where = (f"{column} = :ns" if column == "namespace"
                     else f"{column} IN ({_OF_EFFECTS})")
            if conn.execute(text(f"SELECT 1 FROM {table} WHERE {where} LIMIT 1"),
                            {"ns": gate.namespace}).first() is not None:
                return True
        return conn.execute(text("SELECT 1 FROM effectgate_meta WHERE name = :name"),
                            {"name": policy_meta_name(gate.namespace)}).first() is not None


def _delete_namespace(url: str, namespace: str) -> None:
    """Remove every row the checks wrote (their namespace only, and the policy it last ran
    with in ``effectgate_meta``)."""
    from sqlalchemy import text

    try:
        gate = Gate(url, namespace=namespace, policy=False)
    except Exception:  # the checks already reported what is wrong with the store
        return
    try:
        with gate.store.engine.begin() as conn:
            for table, column in _namespaced(conn):
                where = (f"{column} = :ns" if column == "namespace"
                         else f"{column} IN ({_OF_EFFECTS})")
                conn.execute(text(f"DELETE FROM {table} WHERE {where}"), {"ns": namespace})
            conn.execute(text("DELETE FROM effectgate_meta WHERE name = :name"),
                         {"name": policy_meta_name(namespace)})
    except Exception as err:
        log.warning("verify could not delete its scratch namespace %s: %s", namespace, err)
    finally:
        gate.close()


def junit_xml(results: list[CheckResult], *, name: str = "effectgate verify") -> str:
    """The results as a JUnit XML report (one test case per guarantee; not applicable is
    ``skipped``)."""
    failures = sum(r.status == "failed" for r in results)
    skipped = sum(r.status == "not_applicable" for r in results)
    suite = ElementTree.Element("testsuite", {
        "name": name, "tests": str(len(results)), "failures": str(failures),
        "errors": "0", "skipped": str(skipped),
        "time": f"{sum(r.seconds for r in results):.3f}",
    })
    for r in results:
        case = ElementTree.SubElement(suite, "testcase", {
            "classname": "effectgate.verify", "name": f"{r.id} {r.title}",
            "time": f"{r.seconds:.3f}",
        })
        if r.status == "failed":
            ElementTree.SubElement(case, "failure", {"message": r.detail}).text = r.detail
        elif r.status == "not_applicable":
            ElementTree.SubElement(case, "skipped", {"message": r.detail})
        else:
            ElementTree.SubElement(case, "system-out").text = r.detail
    ElementTree.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(
        suite, encoding="unicode") + "\n"
