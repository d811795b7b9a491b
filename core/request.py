"""A validated ``begin`` (:class:`Request`) and the proof of holding a lease (:class:`Lease`).

A :class:`Request` is what :meth:`Gate.request <effectgate.Gate.request>` builds after every
check: the key, the payload's hash, the effect type's options and what the policy asks of the
call. Building one touches no store; a request can be begun more than once (each ``begin``
issues its own lease secret).

A :class:`Lease` is what a holder presents to ``report`` and ``extend_lease``: the key, the
fencing token and the secret issued with that lease. The store keeps only the secret's
SHA-256, so neither the store's contents nor an effect id let anyone report for the holder.
"""

# No ``from __future__ import annotations`` here (as in store/rows.py): typing.NamedTuple
# compiles every string annotation at every start; only ``Governance`` is quoted (type-only).

import hashlib
from collections.abc import Mapping
from os import urandom as _urandom
from typing import TYPE_CHECKING, Any, NamedTuple

from .payload import SHORT, short_sha256

if TYPE_CHECKING:
    from .governance import Governance

__all__ = ["Lease", "LeaseSecret", "Request", "secret_hash"]


class Request(NamedTuple):
    """A ``begin`` with everything checked, ready for the store."""

    namespace: str
    key: str
    effect_type: str
    payload_hash: str
    vendor: str | None
    max_attempts: int
    lease_seconds: float
    reconcile_grace_seconds: float | None
    """How long after a lapse a reconcile hook waits (None: the lapsed holder's lease again)."""
    run_id: str | None
    agent_id: str | None
    group_key: str | None
    compensation: str | None
    compensates_effect_id: int | None
    estimated_cost_micros: int | None
    governance: "Governance | None"
    payload: Mapping[str, Any]
    """The arguments themselves, for an approver to see; never written to the effects table."""
    redact_arguments: tuple[str, ...] = ()
    """Argument names an approver sees as ``"[redacted]"``."""


class Lease(NamedTuple):
    """Proof of holding an effect: its key, the fencing token, and the secret issued with the
    lease (``BeginDecision.lease`` gives it; over MCP, the three fields of begin's answer)."""

    key: str
    token: int
    secret: str


_ISSUED_HALF = 512


class _Issued:
    """The hashes of the latest leases this process issued (from 512 to 1,024 of them), by
    secret, so that the holder's report and heartbeats reuse the hash its ``begin`` computed:
    one hash per begin, not one per call. Two generations, the newer filling while the older
    is kept (forgetting the oldest one at a time from one dict scanned past every slot deleted
    before it: 0.6 µs a begin)."""

    __slots__ = ("newer", "older")

    def __init__(self) -> None:
        self.newer: dict[str, str] = {}
        self.older: dict[str, str] = {}

    def get(self, secret: str) -> str | None:
        found = self.newer.get(secret)
        return found if found is not None else self.older.get(secret)

    def put(self, secret: str, digest: str) -> None:
        newer = self.newer
        if len(newer) >= _ISSUED_HALF:  # (a racing thread at worst drops a hash: recomputed)
            self.older, self.newer = newer, {secret: digest}
        else:
            newer[secret] = digest


_ISSUED = _Issued()


def secret_hash(secret: str) -> str:
    """What the store keeps of a lease secret."""
    found = _ISSUED.newer.get(secret)  # (:meth:`_Issued.get`, inline: every report asks)
    if found is None:
        found = _ISSUED.older.get(secret)
    return found if found is not None else hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _issue(raw: str | None = None) -> tuple[str, str]:
    """A lease secret (new: 128 random bits, unless ``raw`` is given) and its hash,
    remembered for the holder's calls."""
    if raw is None:
        raw = _urandom(16).hex()
    data = raw.encode("utf-8")
    digest = (short_sha256 if len(data) <= SHORT else hashlib.sha256)(data).hexdigest()
    _ISSUED.put(raw, digest)
    return raw, digest


class LeaseSecret:
    """The secret one ``begin`` would issue with a lease, made only if it is needed (or
    given: ``raw``, for a deterministic replay)."""

    __slots__ = ("_hash", "_raw")

    def __init__(self, raw: str | None = None) -> None:
        """``raw``: the secret to issue (a replay's, for determinism); else a new one."""
        self._raw: str | None = raw
        self._hash: str | None = None

    @property
    def issued(self) -> bool:
        """Whether the secret has been made (an insert can carry it only then)."""
        return self._raw is not None

    @property
    def raw(self) -> str:
        """The secret (128 random bits, hex), made on first use."""
        if self._raw is None:
            self._raw, self._hash = _issue()
        return self._raw

    @property
    def hash(self) -> str:
        """Its SHA-256, as stored (computed once, with the secret)."""
        if self._hash is None:
            self._raw, self._hash = _issue(self._raw)
        return self._hash
