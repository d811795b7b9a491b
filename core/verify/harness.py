"""What a check of ``effectgate verify`` gets and gives: a context (the store, a scratch
namespace and folder, gates), a verdict (:class:`CheckResult`), and the two ways a check ends
other than passing (:class:`CheckFailed`, :class:`NotApplicable`)."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..gate import Gate

__all__ = ["LEASE", "CheckFailed", "CheckResult", "NotApplicable", "Status", "VerifyContext",
           "count_keys", "expect", "key_for"]

Status = Literal["passed", "failed", "not_applicable"]
LEASE = 0.3  # seconds: short leases so lapses cost a fraction of a second


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
    others: list[str] = field(default_factory=list)
    """Further scratch namespaces a check used (deleted afterwards too)."""

    def other_namespace(self) -> str:
        """A further scratch namespace, new and random (never derived from the user's: a
        neighbour such as ``<namespace>-other`` may hold real effects)."""
        return f"verify-{uuid.uuid4().hex[:12]}"

    def gate(self, **options: Any) -> Gate:
        """A new gate on the scratch namespace (its own connections and memo; no policy
        unless one is given: the checks never run under the user's own)."""
        options.setdefault("namespace", self.namespace)
        options.setdefault("policy", False)
        if options["namespace"] != self.namespace and options["namespace"] not in self.others:
            self.others.append(options["namespace"])
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


def key_for(check: str, name: str) -> str:
    """The key a check uses for its effect ``name``."""
    return f"verify:{check}:{name}"




def count_keys(gate: Gate, like: str) -> int:
    """How many effects of the gate's namespace have a key ``LIKE like``."""
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return int(conn.execute(
            text("SELECT COUNT(*) FROM effectgate_effects WHERE namespace = :ns AND key LIKE :k"),
            {"ns": gate.namespace, "k": like},
        ).scalar() or 0)
