"""Principals: named operators and agents, each with a token, so that ``by`` is who proved it.

A token is ``egp_`` followed by 43 URL-safe characters (``secrets.token_urlsafe(32)``: 256
random bits). It is shown once, when the principal is added; the store keeps only a per-token
salt and a PBKDF2-SHA256 hash of it. The first 12 characters after ``egp_`` are the token's id
and the table's primary key, so authenticating is one indexed read and one constant-time
comparison (:func:`hmac.compare_digest`). A revoked principal never authenticates again.

Roles (DESIGN, "Operators, identities and the console"): an **agent** may begin, report and
extend what it holds; an **operator** may approve, deny, resolve, reconcile and unwind.
:class:`Acting` is the gate as one principal: it refuses what the role may not do
(:class:`~effectgate.Forbidden`) and records the principal's name as ``by`` everywhere, so
self-approval is judged on principal names.

Principals belong to a namespace, like effects: a token of one namespace authenticates in no
other, and a :class:`Principal` says which namespace it belongs to. An :class:`Acting` asks the
store before each act whether it still vouches for its principal (:func:`check_issued`): one
revoked since, one of another namespace, or one this store does not hold as it is (no
principal of that name here, or one with another role or creation time: from another store,
say) is refused with :class:`~effectgate.Unauthenticated` and nothing is written.

That check catches a stale principal, not a forged one. A :class:`Principal` carries no secret:
code in the process can build one from public fields (``as_dict``, ``principals ls``, the
console's principals page) and ``acting_as`` accepts it — just as that code could call
``Gate.approve(..., by="alice")`` itself. Code running in the process is trusted; the proof of
identity is the token, checked (:func:`authenticate`, :func:`authenticate_row`) where a request
comes in from outside: the console's sign-in, the MCP server's HTTP bearer token. Never build
a ``Principal`` from what a caller claims: authenticate its token.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .errors import ConfigError, Forbidden, Unauthenticated, UnknownEffect
from .gatelike import GateLike

if TYPE_CHECKING:
    from .records import ApprovalRecord, EffectRecord
    from .sagas import UnwindReport
    from .states import Outcome
    from .store.rows import PrincipalRow

__all__ = [
    "AGENT", "OPERATOR", "ROLES", "TOKEN_PREFIX", "Acting", "OperatorGate", "Principal",
    "add_principal", "authenticate", "authenticate_row", "check_issued", "check_name",
    "list_principals", "principal_of", "require_holder", "require_operator",
    "revoke_principal",
]

OPERATOR = "operator"
AGENT = "agent"
ROLES = (AGENT, OPERATOR)
TOKEN_PREFIX = "egp_"
_ID_LENGTH = 12
_TOKEN = re.compile(r"egp_[A-Za-z0-9_-]{43}")
_NAME = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}")
_ITERATIONS = 60_000
_REFUSED = "invalid or revoked token"


class Principal(NamedTuple):
    """A named operator or agent of one namespace (never its token)."""

    name: str
    role: str
    namespace: str
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None
    revoked_at: datetime.datetime | None

    @property
    def revoked(self) -> bool:
        """True once revoked: the token no longer authenticates."""
        return self.revoked_at is not None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        out: dict[str, Any] = {}
        for name, value in self._asdict().items():
            out[name] = (value.isoformat().replace("+00:00", "Z")
                         if isinstance(value, datetime.datetime) else value)
        return out


def _time(value: float | None) -> datetime.datetime | None:
    return None if value is None else datetime.datetime.fromtimestamp(value, datetime.UTC)


def principal_of(row: PrincipalRow) -> Principal:
    """The public face of a stored principal."""
    created = _time(row.created_at)
    assert created is not None
    return Principal(row.name, row.role, row.namespace, created, _time(row.last_used_at),
                     _time(row.revoked_at))


def _hash(token: str, salt: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", token.encode("ascii"), bytes.fromhex(salt),
                               _ITERATIONS).hex()


class _Verified:
    """Tokens this process has already checked against a stored hash (the SHA-256 of the
    token, never the token), so a busy agent pays the key derivation once. The row is still
    read on every request: a revocation is seen at once."""

    def __init__(self, size: int = 1024) -> None:
        self._seen: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def known(self, row: PrincipalRow, fingerprint: str) -> bool:
        with self._lock:
            stored = self._seen.get((row.token_id, row.token_hash))
        return stored is not None and hmac.compare_digest(stored, fingerprint)

    def add(self, row: PrincipalRow, fingerprint: str) -> None:
        with self._lock:
            self._seen[(row.token_id, row.token_hash)] = fingerprint
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)


_verified = _Verified()


def check_name(name: object) -> str:
    """A principal's name: 1-64 of lower-case letters, digits and ``. _ @ -``, starting with a
    letter or digit (no look-alike or invisible characters, no two names one identity)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"a principal's name is 1-64 lower-case letters, digits and . _ @ - (starting with "
            f"a letter or digit), not {name!r}"[:300])
    return name


def _check_role(role: object) -> str:
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, not {role!r}"[:200])
    assert isinstance(role, str)
    return role


def add_principal(gate: GateLike, name: str, role: str) -> tuple[Principal, str]:
    """Add ``name`` with ``role`` to the gate's namespace; the principal and its token (shown
    this once: only its hash is stored). :class:`~effectgate.ConfigError` when the name is
    taken (a revoked name stays taken, so history never names two identities)."""
    from .store.principals import insert_principal

    name, role = check_name(name), _check_role(role)
    for _ in range(3):
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        row = insert_principal(gate.store.engine, token_id=token[4:4 + _ID_LENGTH],
                               namespace=gate.namespace, name=name, role=role, salt=salt,
                               token_hash=_hash(token, salt))
        if row is not None:
            return principal_of(row), token
        from .store.principals import principal_by_name

        if principal_by_name(gate.store.engine, gate.namespace, name) is not None:
            raise ConfigError(f"a principal named {name!r} exists already in this namespace")
    raise ConfigError("could not store the principal; try again")  # pragma: no cover


def authenticate_row(gate: GateLike, token: object) -> PrincipalRow:
    """The stored principal ``token`` proves, in the gate's namespace;
    :class:`~effectgate.Unauthenticated` otherwise (the same message whatever was wrong)."""
    from .store.principals import TOUCH_EVERY_SECONDS, principal_by_token_id, touch_principal

    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise Unauthenticated(_REFUSED)
    row = principal_by_token_id(gate.store.engine, token[4:4 + _ID_LENGTH])
    if row is None or row.namespace != gate.namespace or row.revoked_at is not None:
        raise Unauthenticated(_REFUSED)
    fingerprint = hashlib.sha256(token.encode("ascii")).hexdigest()
    if not _verified.known(row, fingerprint):
        if not hmac.compare_digest(_hash(token, row.salt), row.token_hash):
            raise Unauthenticated(_REFUSED)
        _verified.add(row, fingerprint)
    if row.last_used_at is None or row.last_used_at < row.now - TOUCH_EVERY_SECONDS:
        touch_principal(gate.store.engine, row.token_id)
        row = row._replace(last_used_at=row.now)
    return row


def authenticate(gate: GateLike, token: object) -> Principal:
    """The principal ``token`` proves (see :func:`authenticate_row`)."""
    return principal_of(authenticate_row(gate, token))


def revoke_principal(gate: GateLike, name: str) -> Principal:
    """Revoke ``name``: its token stops authenticating at once. Revoking twice is harmless;
    :class:`~effectgate.UnknownEffect` when there is no such principal here."""
    from .store.principals import revoke_principal as revoke

    row = revoke(gate.store.engine, gate.namespace, check_name(name))
    if row is None:
        raise UnknownEffect(f"no principal named {name!r}")
    return principal_of(row)


def list_principals(gate: GateLike) -> list[Principal]:
    """Every principal of the gate's namespace, by name (revoked ones included)."""
    from .store.principals import list_principals as rows

    return [principal_of(r) for r in rows(gate.store.engine, gate.namespace)]


def _principal(principal: object) -> Principal:
    if not isinstance(principal, Principal):
        raise ConfigError("this needs an eg.Principal (from gate.authenticate)")
    if principal.revoked:
        raise Unauthenticated(_REFUSED)
    return principal


def _issued(row: PrincipalRow) -> tuple[str, str, datetime.datetime | None]:
    return row.name, row.role, _time(row.created_at)


def check_issued(principal: Principal, row: PrincipalRow | None, namespace: str) -> Principal:
    """The principal as the store holds it now (``row``: the store's row of that name in
    ``namespace``, or None), when it is the one the store issued to ``principal``: same
    namespace, name, role and creation, and not revoked. :class:`~effectgate.Unauthenticated`
    otherwise, its ``reason`` saying which."""
    principal = _principal(principal)
    if principal.namespace != namespace:
        why = "another namespace"
        detail = f"{principal.name} is a principal of namespace {principal.namespace!r}"
    elif row is None:
        why, detail = "unknown principal", f"this store issued no principal {principal.name!r}"
    elif row.revoked_at is not None:
        why, detail = "revoked", f"{principal.name} was revoked"
    elif _issued(row) != (principal.name, principal.role, principal.created_at):
        why = "not as issued"
        detail = f"{principal.name} is not the principal this store issued under that name"
    else:
        return principal_of(row)
    raise Unauthenticated(f"{detail}, not one {namespace!r} vouches for: refused"[:300],
                          reason=why)


def require_operator(principal: Principal, what: str) -> str:
    """The operator's name; :class:`~effectgate.Forbidden` for any other role."""
    principal = _principal(principal)
    if principal.role != OPERATOR:
        raise Forbidden(f"{principal.name} is an {principal.role}: only an operator may {what}",
                        reason=f"{principal.role} may not {what}")
    return principal.name


def require_holder(principal: Principal, record: EffectRecord, what: str) -> None:
    """:class:`~effectgate.Forbidden` unless ``principal`` is the agent that began ``record``
    (an agent may report or extend only what it holds)."""
    principal = _principal(principal)
    if record.agent_id != principal.name:
        raise Forbidden(f"{principal.name} may not {what} {record.key!r}: another agent holds "
                        "it", key=record.key, reason="not the holder",
                        effect_id=record.effect_id)


class OperatorGate(GateLike, Protocol):
    """The gate :class:`Acting` speaks for: a :class:`~effectgate.gatelike.GateLike` with the
    rest of the operator's acts (:class:`effectgate.Gate` has them all)."""

    def resolve(self, key: str, outcome: Outcome | str, *, by: str, result: Any = None,
                note: str | None = None, force: bool = False,
                expected: EffectRecord | None = None) -> EffectRecord:
        """An operator's verdict on an effect."""
        ...

    def reconcile(self, key: str, *, by: str) -> EffectRecord:
        """Ask the reconcile hook now."""
        ...

    def unwind(self, group_key: str, *, by: str = "unwind") -> UnwindReport:
        """Compensate a saga group."""
        ...


class Acting:
    """The gate as one principal (authenticated by its token: see the module's note on
    trust). Every decision goes through the same Gate API as the CLI, with ``by`` set to the
    principal's name; before each one the store is asked again (:func:`check_issued`), so a
    principal revoked since, of another namespace, or not as the store holds it is refused
    (:class:`~effectgate.Unauthenticated`) and an agent is refused
    (:class:`~effectgate.Forbidden`) anything only an operator may do. Nothing is written when
    either is raised."""

    def __init__(self, gate: OperatorGate, principal: Principal) -> None:
        self.gate = gate
        self.principal = _principal(principal)
        if self.principal.namespace != gate.namespace:
            check_issued(self.principal, None, gate.namespace)  # raises: another namespace

    def _operator(self, what: str) -> str:
        """The operator's name, once the store vouches for it as an operator of this gate's
        namespace now."""
        from .store.principals import principal_by_name

        row = principal_by_name(self.gate.store.engine, self.gate.namespace,
                                self.principal.name)
        return require_operator(check_issued(self.principal, row, self.gate.namespace), what)

    def approve(self, approval_id: str, *, note: str | None = None) -> ApprovalRecord:
        """:meth:`Gate.approve` as this operator (self-approval judged on the name)."""
        by = self._operator("approve")
        return self.gate.approve(approval_id, by=by, note=note)

    def deny(self, approval_id: str, *, reason: str | None = None) -> ApprovalRecord:
        """:meth:`Gate.deny` as this operator."""
        by = self._operator("deny")
        return self.gate.deny(approval_id, by=by, reason=reason)

    def resolve(self, key: str, outcome: Outcome | str, *, result: Any = None,
                note: str | None = None, force: bool = False,
                expected: EffectRecord | None = None) -> EffectRecord:
        """:meth:`Gate.resolve` as this operator (a live lease is refused, as there; so is a
        verdict on an effect that has moved since ``expected``, the record reviewed)."""
        by = self._operator("resolve")
        return self.gate.resolve(key, outcome, by=by, result=result, note=note, force=force,
                                 expected=expected)

    def reconcile(self, key: str) -> EffectRecord:
        """:meth:`Gate.reconcile` as this operator."""
        by = self._operator("reconcile")
        return self.gate.reconcile(key, by=by)

    def unwind(self, group_key: str, *,
               confirmed: Iterable[int] | None = None) -> UnwindReport:
        """:meth:`Gate.unwind` as this operator; with ``confirmed`` (the steps whose undo the
        operator confirmed), no other undo is begun (:func:`effectgate.sagas.unwind`)."""
        by = self._operator("unwind")
        if confirmed is None:
            return self.gate.unwind(group_key, by=by)
        from . import sagas  # on first use, as Gate.unwind loads it

        return sagas.unwind(self.gate, group_key, by, confirmed=confirmed)
