"""``effectgate verify`` as a library: the guarantees of DESIGN (G1–G12), checked against a
real store in a scratch namespace that is deleted afterwards (the store's other data is never
read or written).

Each check returns a :class:`CheckResult`: ``passed``, ``failed`` (with what went wrong), or
``not_applicable`` (with why — it never counts as a pass)::

    from effectgate.verify import run_checks

    results = run_checks("sqlite:///.effectgate/effects.db", only=["G1", "G3"])
    assert all(r.status != "failed" for r in results)

G2 races 8 OS processes on many keys and counts the side effect itself (a file the body
appends to); G12 kills worker processes with SIGKILL at every point of the protocol.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from xml.etree import ElementTree

from .errors import (
    ConfigError,
    EffectAmbiguous,
    EffectKeyError,
    PayloadMismatch,
    StaleLease,
)
from .gate import Gate
from .states import Decision, State

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
Status = Literal["passed", "failed", "not_applicable"]
LEASE = 0.3  # seconds: short leases so lapses cost a fraction of a second

GUARANTEES: dict[str, str] = {
    "G1": "a committed effect is never executed again",
    "G2": "one winner under concurrency (8 processes, many keys)",
    "G3": "a lapsed lease makes the effect AMBIGUOUS; a blind retry is refused",
    "G4": "FAILED permits a new attempt with a new vendor key",
    "G5": "a key reused with another payload is refused",
    "G6": "a stale lease holder cannot report",
    "G7": "an unresolvable template fails before the body runs",
    "G8": "an approval is bound to its payload and single use",
    "G9": "a budget ceiling refuses, and AMBIGUOUS holds its spend",
    "G10": "unwind compensates each committed step once, in reverse",
    "G11": "pruned keys still refuse duplicates",
    "G12": "a worker killed at any point never causes a second execution",
}


class CheckFailed(Exception):
    """Raised by a check when the store broke the guarantee."""


class NotApplicable(Exception):
    """Raised by a check that cannot apply here, with the reason."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One guarantee's verdict. ``not_applicable`` is never a pass."""

    id: str
    title: str
    status: Status
    detail: str
    seconds: float

    @property
    def passed(self) -> bool:
        """True only for ``passed``."""
        return self.status == "passed"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {"id": self.id, "title": self.title, "status": self.status,
                "detail": self.detail, "seconds": round(self.seconds, 3)}


@dataclass
class VerifyContext:
    """What a check gets: the store, a scratch namespace, a scratch folder, and gates."""

    url: str
    namespace: str
    folder: Path
    gates: list[Gate] = field(default_factory=list)

    def gate(self, **options: Any) -> Gate:
        """A new gate on the scratch namespace (its own connections and memo)."""
        options.setdefault("namespace", self.namespace)
        gate = Gate(self.url, **options)
        self.gates.append(gate)
        return gate

    def close(self) -> None:
        """Close every gate opened for the checks."""
        for gate in self.gates:
            with contextlib.suppress(Exception):
                gate.close()
        self.gates.clear()


def expect(condition: bool, message: str) -> None:
    """Fail the check with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(message)


def _key(check: str, name: str) -> str:
    return f"verify:{check}:{name}"


# -- G1, G3–G7: one process ------------------------------------------------------------------


def check_g1(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    runs: list[str] = []

    @gate.effect("verify:G1:{ref}", effect_type="verify.g1")
    def act(ref: str) -> dict[str, str]:
        runs.append(ref)
        return {"receipt": f"r-{ref}"}

    first = act("a")
    again = [act("a") for _ in range(3)]
    fresh = ctx.gate().begin(effect_type="verify.g1", key=_key("G1", "a"), payload={"ref": "a"})
    expect(len(runs) == 1, f"the body ran {len(runs)} times for one committed key")
    expect(all(r == first for r in again), f"a duplicate returned {again[0]!r}, not {first!r}")
    expect(fresh.decision is Decision.DUPLICATE,
           f"a second gate was answered {fresh.decision.value!r}, not 'duplicate'")
    expect(fresh.result == first, f"the store returned {fresh.result!r}, not {first!r}")
    return "3 repeats and a second gate got the stored result; the body ran once"


def check_g3(ctx: VerifyContext) -> str:
    gate = ctx.gate(lease_seconds=LEASE)
    key = _key("G3", "lapse")
    payload = {"ref": "lapse", "n": 1}
    d = gate.begin(effect_type="verify.g3", key=key, payload=payload)
    expect(d.decision is Decision.EXECUTE, f"first begin answered {d.decision.value!r}")
    time.sleep(LEASE + 0.15)
    state = gate.get(key).state
    expect(state is State.AMBIGUOUS,
           f"past its lease the effect reads {state.value}, not ambiguous")
    again = ctx.gate().begin(effect_type="verify.g3", key=key, payload=payload)
    expect(again.decision is Decision.BLOCKED,
           f"a blind retry was answered {again.decision.value!r}, not 'blocked'")
    ran: list[int] = []

    @ctx.gate().effect("verify:G3:{ref}", effect_type="verify.g3")
    def act(ref: str, n: int) -> None:
        ran.append(n)

    try:
        act("lapse", 1)
    except EffectAmbiguous:
        pass
    else:
        raise CheckFailed("the decorator ran a retry of an AMBIGUOUS effect")
    expect(not ran, "the body of a retry ran")
    return f"after a {LEASE}s lease: reads ambiguous, begin answers blocked, the body is not run"


def check_g4(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = _key("G4", "retry")
    first = gate.begin(effect_type="verify.g4", key=key, payload={"n": 1}, vendor="stripe")
    gate.report(first, "failed", error="connection refused")
    second = gate.begin(effect_type="verify.g4", key=key, payload={"n": 1}, vendor="stripe")
    expect(second.decision is Decision.EXECUTE,
           f"after FAILED, begin answered {second.decision.value!r}, not 'execute'")
    expect(second.attempt == first.attempt + 1, f"the new attempt is {second.attempt}, not 2")
    expect(second.vendor_idempotency_key != first.vendor_idempotency_key,
           "the new attempt reused the failed attempt's vendor key")
    gate.report(second, "committed", result={"ok": True})
    return "attempt 2 executed with a new vendor key"


def check_g5(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = _key("G5", "collide")
    d = gate.begin(effect_type="verify.g5", key=key, payload={"amount": 500})
    gate.report(d, "committed", result={"ok": True})
    before = gate.get(key)
    try:
        ctx.gate().begin(effect_type="verify.g5", key=key, payload={"amount": 900})
    except PayloadMismatch:
        pass
    else:
        raise CheckFailed("the same key with another payload was not refused")
    after = gate.get(key)
    expect(before == after, "the refused begin changed the stored effect")
    return "PayloadMismatch; the stored effect unchanged"


def check_g6(ctx: VerifyContext) -> str:
    gate = ctx.gate(lease_seconds=LEASE)
    key = _key("G6", "zombie")
    zombie = gate.begin(effect_type="verify.g6", key=key, payload={"n": 1})
    time.sleep(LEASE + 0.15)
    gate.resolve(key, "failed", by="effectgate-verify", note="G6")
    holder = gate.begin(effect_type="verify.g6", key=key, payload={"n": 1})
    expect(holder.decision is Decision.EXECUTE and holder.lease_token > zombie.lease_token,
           f"the new attempt got {holder.decision.value!r} with token {holder.lease_token}")
    for outcome in ("committed", "failed", "ambiguous"):
        try:
            gate.report(zombie, outcome, result={"from": "zombie"})
        except StaleLease:
            continue
        raise CheckFailed(f"a report {outcome!r} with stale token {zombie.lease_token} was taken")
    try:
        gate.extend_lease(zombie, 30)
    except StaleLease:
        pass
    else:
        raise CheckFailed("a stale holder extended its lease")
    gate.report(holder, "committed", result={"from": "holder"})
    stored = gate.get(key)
    expect(stored.result == {"from": "holder"}, f"the stored result is {stored.result!r}")
    return "reports and a heartbeat with the old token refused; the new holder's result kept"


def check_g7(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    ran: list[object] = []

    @gate.effect("verify:G7:{order.id}", effect_type="verify.g7")
    def act(order: Any) -> None:
        ran.append(order)

    bad: list[Any] = [None, {"id": None}, {"id": ""}, {"id": 1.5}, {"id": [1]}]
    for order in bad:
        try:
            act(order)
        except EffectKeyError:
            continue
        raise CheckFailed(f"the template rendered from {order!r}")
    try:
        gate.effect("verify:G7:{missing}", effect_type="verify.g7")(lambda order: None)
    except EffectKeyError:
        pass
    else:
        raise CheckFailed("a template naming a missing argument was accepted")
    expect(not ran, "a body ran with an unresolvable key")
    written = _count(gate, "verify:G7:%")
    expect(written == 0, f"{written} effects were written for unresolvable keys")
    return f"{len(bad) + 1} unresolvable templates refused; nothing ran, nothing written"


def _count(gate: Gate, like: str) -> int:
    """How many effects of the gate's namespace have a key ``LIKE like``."""
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return int(conn.execute(
            text("SELECT COUNT(*) FROM effectgate_effects WHERE namespace = :ns AND key LIKE :k"),
            {"ns": gate.namespace, "k": like},
        ).scalar() or 0)


# -- the runner ------------------------------------------------------------------------------


def _checks() -> dict[str, Callable[[VerifyContext], str]]:
    from . import verify_governance as gov
    from . import verify_procs as procs

    return {
        "G1": check_g1, "G2": procs.check_g2, "G3": check_g3, "G4": check_g4,
        "G5": check_g5, "G6": check_g6, "G7": check_g7, "G8": gov.check_g8,
        "G9": gov.check_g9, "G10": gov.check_g10, "G11": gov.check_g11,
        "G12": procs.check_g12,
    }


def parse_only(only: str | Iterable[str] | None) -> list[str]:
    """``"G1,G3"`` (or a list) as guarantee ids in order; :class:`ConfigError` for an
    unknown one. None means all of them."""
    if only is None:
        return list(GUARANTEES)
    names = only.split(",") if isinstance(only, str) else list(only)
    wanted = {n.strip().upper() for n in names if n.strip()}
    unknown = sorted(wanted - set(GUARANTEES))
    if unknown or not wanted:
        raise ConfigError(
            f"unknown guarantee {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(GUARANTEES)}"
        )
    return [g for g in GUARANTEES if g in wanted]


def run_checks(url: str | None, only: str | Iterable[str] | None = None, *,
               on_result: Callable[[CheckResult], None] | None = None,
               namespace: str | None = None) -> list[CheckResult]:
    """Check the guarantees (all, or ``only`` these ids) against the store at ``url``.

    Everything happens in a fresh namespace (``namespace``, default ``verify-<random>``),
    deleted afterwards. ``on_result`` is called as each check finishes. A store that cannot
    be opened raises :class:`StoreError` before any check runs.
    """
    from .store import resolve_url

    ids = parse_only(only)
    target = resolve_url(url)
    scratch = namespace or f"verify-{uuid.uuid4().hex[:12]}"
    probe = Gate(target, namespace=scratch)  # opens (and migrates) the store, or raises
    try:
        if _count(probe, "%"):
            raise ConfigError(f"namespace {scratch!r} already holds effects; verify writes and "
                              "then deletes everything in its namespace, so it needs an empty one")
    finally:
        probe.close()
    checks = _checks()
    results: list[CheckResult] = []
    with _scratch_folder() as folder:
        for gid in ids:
            ctx = VerifyContext(url=target, namespace=scratch, folder=folder / gid)
            ctx.folder.mkdir()
            result = _run_one(gid, checks[gid], ctx)
            results.append(result)
            if on_result is not None:
                on_result(result)
    _delete_namespace(target, scratch)
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


def _delete_namespace(url: str, namespace: str) -> None:
    """Remove every row the checks wrote (their namespace only)."""
    from sqlalchemy import inspect, text

    try:
        gate = Gate(url, namespace=namespace)
    except Exception:  # the checks already reported what is wrong with the store
        return
    try:
        with gate.store.engine.begin() as conn:
            tables = set(inspect(conn).get_table_names())
            ids = "SELECT id FROM effectgate_effects WHERE namespace = :ns"
            for name in sorted(tables):
                if not name.startswith("effectgate_") or name == "effectgate_effects":
                    continue
                columns = {c["name"] for c in inspect(conn).get_columns(name)}
                if "namespace" in columns:
                    conn.execute(text(f"DELETE FROM {name} WHERE namespace = :ns"),
                                 {"ns": namespace})
                elif "effect_id" in columns:
                    conn.execute(text(f"DELETE FROM {name} WHERE effect_id IN ({ids})"),
                                 {"ns": namespace})
            conn.execute(text("DELETE FROM effectgate_effects WHERE namespace = :ns"),
                         {"ns": namespace})
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
