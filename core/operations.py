"""Operators' acts behind the gate's facade: :meth:`~effectgate.Gate.resolve`,
:meth:`~effectgate.Gate.approve`, :meth:`~effectgate.Gate.deny` and
:meth:`~effectgate.Gate.reconcile`. Each validates everything first, then asks the pure rules
(:mod:`effectgate.decide`) and writes with a compare-and-set, read again under contention:
an act that raises has written nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import decide, validate
from .errors import ConfigError, InvalidTransition, StoreError, UnknownEffect
from .keys import lookup_key
from .payload import result_json
from .reporting import kept
from .states import ApprovalState, Outcome, State

if TYPE_CHECKING:
    from .flow import BeginFlow
    from .reconcile import Reconciler
    from .records import EffectRecord
    from .registry import Registry
    from .reporting import Reporter
    from .request_builder import EffectKind
    from .store import Store
    from .store.rows import EffectRow

__all__ = ["approve", "deny", "reconcile", "resolve"]

log = logging.getLogger("effectgate")
MAX_STEPS = 16
"""Compare-and-set tries before an act gives up under contention."""


def resolve(r: Reporter, key: str, outcome: Outcome | str, *, by: str, result: Any,
            note: str | None, force: bool, expected: EffectRecord | None = None) -> EffectRow:
    """Settle ``key`` as ``outcome`` by ``by`` (see :meth:`Gate.resolve`); the row after.
    ``expected``: the record the operator reviewed; refused unless the effect is still in its
    state at its fencing token when the verdict is written (the write is compare-and-set on
    that token)."""
    key = lookup_key(key)
    actor = validate.text(by, "by", 256, required=True) or ""
    parsed = validate.parse_outcome(outcome, (Outcome.COMMITTED, Outcome.FAILED))
    if not isinstance(force, bool):
        raise ConfigError("force must be a bool")
    if expected is not None and not (_is_record(expected) and (
            expected.key == key and expected.namespace == r.namespace)):
        raise ConfigError("expected is the EffectRecord of this key that the operator "
                          "reviewed", key=key)
    text = result_json(result) if parsed is Outcome.COMMITTED else None
    note = r.redact(validate.text(note, "note", validate.MAX_TEXT))
    for _ in range(MAX_STEPS):
        row = r.store.fetch(r.namespace, key)
        if row is None:
            raise UnknownEffect(f"no effect with key {key!r}", key=key)
        if _repeated(row, parsed, actor, expected) and (
                parsed is Outcome.FAILED or row.result == (text if not r.result_rules else (
                    result_json(kept(r.policy, row.effect_type, result))))):
            done = r.store.get(r.namespace, key)  # a repeat (its reply lost?): the verdict
            if done is not None and done.token == row.token:
                return done
            continue
        if expected is not None and (row.token, decide.effective_state(row)) != (
                expected.lease_token, expected.state):
            raise InvalidTransition(
                f"cannot resolve {key!r}: it changed since it was reviewed (it was "
                f"{expected.state.value} at token {expected.lease_token}; it is "
                f"{decide.effective_state(row).value} at token {row.token})",
                key=key, state=row.state.value, effect_id=row.id)
        res = decide.resolution(row, parsed, force=force)
        how = "force-resolved" if res.forced else "resolved"
        if text is not None and r.result_rules:
            text = result_json(kept(r.policy, row.effect_type, result))
        done = r.store.resolve(row, res, result=text,
                               reason=f"{how} {parsed.value} by {actor}", actor=actor,
                               note=note)
        if done is not None:
            log.info("%s %s: %s by %s", how, key, parsed.value, _shown(actor),
                     extra={"key": key, "state": parsed.value, "reason": _shown(note)})
            if parsed is Outcome.COMMITTED:
                r.flow.remember(key, done.payload_hash, done.effect_type, done.id,
                                done.attempt, done.token, done.result)
            return done
    raise StoreError("the effect kept changing under contention; try again", key=key)


def _repeated(row: Any, outcome: Outcome, actor: str, expected: EffectRecord | None) -> bool:
    """Whether ``row`` already holds this verdict, written by a resolve of ``actor``'s (its
    reason says so) as its last act (after what ``expected`` showed, if given): a repeat,
    such as a retry of a resolve whose reply was lost, is answered with the row and writes
    nothing."""
    said = (f"resolved {outcome.value} by {actor}", f"force-resolved {outcome.value} by {actor}")
    return row.state.value == outcome.value and row.reason in said and (
        expected is None or row.token == expected.lease_token + 1)


def _shown(text: str | None) -> str | None:
    """An operator's free text (``by``, a note) for the log: each control, line-breaking or
    invisible character shown as ``⟨U+XXXX⟩`` (:func:`~effectgate.redact.visible`), so a line
    feed in it cannot forge a log line nor an escape drive the terminal tailing it. The
    store keeps what was said."""
    from .redact import visible

    return None if text is None else visible(text)


def _is_record(value: object) -> bool:
    from .records import EffectRecord  # here: a worker that never resolves never loads it

    return isinstance(value, EffectRecord)


def approve(store: Store, namespace: str, redact: Callable[[str | None], str | None],
            approval_id: str, *, by: str, note: str | None) -> str:
    """Approve ``approval_id`` by ``by`` (see :meth:`Gate.approve`); its checked id."""
    return _decide_approval(store, namespace, redact, approval_id, by, note, approving=True)


def deny(store: Store, namespace: str, redact: Callable[[str | None], str | None],
         approval_id: str, *, by: str, reason: str | None) -> str:
    """Deny ``approval_id`` by ``by`` (see :meth:`Gate.deny`); its checked id."""
    return _decide_approval(store, namespace, redact, approval_id, by, reason, approving=False)


def _decide_approval(store: Store, namespace: str, redact: Callable[[str | None], str | None],
                     approval_id: str, by: str, text: str | None, *, approving: bool) -> str:
    """An approver's answer to a pending request, checked first (:func:`decide.check_approval`)
    and written compare-and-set; ``text`` is the approval's note or the denial's reason."""
    approval_id = validate.text(approval_id, "approval id", 64, required=True) or ""
    actor = validate.text(by, "by", 256, required=True) or ""
    text = redact(validate.text(text, "note" if approving else "reason", validate.MAX_TEXT))
    for _ in range(MAX_STEPS):
        row = decide.check_approval(store.approval(namespace, approval_id),
                                    approval_id, actor, approving=approving)
        if approving:
            done = store.decide_approval(namespace, approval_id, ApprovalState.APPROVED, actor,
                                         text)
        else:
            why = f"{decide.APPROVER_DENIED} by {actor}" + (f": {text}" if text else "")
            done = store.deny(row, actor, text, why)
        if done:
            log.info("%s %s (%s) by %s", "approved" if approving else "denied", row.key,
                     _shown(approval_id), _shown(actor),
                     extra={"key": row.key, "reason": _shown(text)})
            return approval_id
    raise StoreError("the approval kept changing under contention; try again")


def reconcile(store: Store, namespace: str, flow: BeginFlow, hooks: Registry[Reconciler],
              key: str, *, by: str, kind: Callable[[str], EffectKind] | None = None) -> str:
    """Ask the registered hook about the AMBIGUOUS ``key`` now, as ``by`` (see
    :meth:`Gate.reconcile`); the checked key. A lapsed lease is asked about only after the
    grace period a ``begin`` of its type waits (``kind``: the gate's options for a type, the
    policy's applied): before it, the holder may still be running and the vendor not yet
    know of its request, so a "failed" would let a new attempt run it twice
    (:class:`InvalidTransition`, nothing asked or written)."""
    key = lookup_key(key)
    actor = validate.text(by, "by", 256, required=True) or ""
    row = store.fetch(namespace, key)
    if row is None:
        raise UnknownEffect(f"no effect with key {key!r}", key=key)
    state = decide.effective_state(row)
    if state is not State.AMBIGUOUS:
        raise InvalidTransition(f"{key!r} is {state.value}, not ambiguous: nothing to "
                                "reconcile", key=key, state=state.value)
    if hooks.find(row.effect_type) is None:
        raise ConfigError(f"no reconcile hook for {row.effect_type!r} is registered here "
                          "(give the gate your code defines, with its hooks)", key=key)
    options = None if kind is None else kind(row.effect_type)
    wait = decide.reconcile_wait(row, None) if options is None else decide.reconcile_wait(
        row, options.reconcile_grace_seconds, options.lease_seconds)
    if wait > 0:
        raise InvalidTransition(
            f"{key!r}'s lease lapsed, but its holder may still be running and the vendor may "
            f"not know of its request yet: the reconcile hook is asked once the grace period "
            f"ends, in {wait:.0f}s (resolve it by hand if you know the holder stopped)",
            key=key, state=state.value)
    flow.reconcile(row, by=actor)
    return key
