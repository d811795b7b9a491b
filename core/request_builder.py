"""Building a :class:`~effectgate.request.Request`: an effect type's options validated once
(:class:`EffectKind`, the policy's defaults applied), then each call's key, payload hash,
identities and governance checked — every error raised here, before the store is touched.
A key starting with ``compensate:`` (:data:`~effectgate.keys.UNDO_PREFIX`) is an undo's only:
refused (:class:`~effectgate.EffectKeyError`) for any other effect, whichever way it came
(decorator, ``gate.request`` / ``begin`` / ``preview``, MCP, gateway).

:meth:`Gate.kind <effectgate.Gate.kind>`, :meth:`Gate.request <effectgate.Gate.request>` and
the decorator's path call these with the gate's namespace, policy and defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from . import validate
from .context import run_context
from .errors import ConfigError, PayloadError
from .governance import evaluate
from .keys import UNDO_PREFIX, reserved_key
from .payload import canonical_json, payload_hash
from .registry import UNDO_SUFFIX
from .request import Request
from .vendors import rule_for

if TYPE_CHECKING:
    from .governance import Governance
    from .policy import Policy

__all__ = ["MAX_COMPENSATION", "EffectKind", "build_request", "effect_kind"]


class EffectKind(NamedTuple):
    """An effect type's options, validated once, with the policy's defaults applied, and what
    the policy asks of a call of it that declares no cost (``governance``, asked once: a
    policy is immutable)."""

    effect_type: str
    vendor: str | None
    lease_seconds: float
    max_attempts: int
    reconcile_grace_seconds: float | None  # None: the lapsed holder's lease again
    redact_arguments: tuple[str, ...] = ()
    store_result: bool = True
    redact_result: tuple[str, ...] = ()
    policy: Policy | None = None
    """The policy the options were taken from (``governance`` is its answer)."""
    governance: Governance | None = None


def effect_kind(policy: Policy | None, default_lease: float, default_attempts: int,
                effect_type: str, *, vendor: str | None = None,
                lease_seconds: float | None = None, max_attempts: int | None = None,
                reconcile_grace_seconds: float | None = None) -> EffectKind:
    """``effect_type``'s options: those given, else the policy's rule, else the gate's
    defaults (``default_lease``, ``default_attempts``); :class:`ConfigError` when one is
    unusable."""
    effect_type = validate.name(effect_type, "effect_type", 200, required=True) or ""
    rule = policy.rule_for(effect_type) if policy is not None else None
    redact_arguments: tuple[str, ...] = ()
    redact_result: tuple[str, ...] = ()
    store_result = True
    if rule is not None:
        vendor = vendor if vendor is not None else rule.vendor
        lease_seconds = lease_seconds if lease_seconds is not None else rule.lease_seconds
        max_attempts = max_attempts if max_attempts is not None else rule.max_attempts
        if reconcile_grace_seconds is None:
            reconcile_grace_seconds = rule.reconcile_grace_seconds
        redact_arguments = rule.redact_arguments
        store_result, redact_result = rule.store_result, rule.redact_result
    if vendor is not None:
        rule_for(vendor)
    attempts = default_attempts if max_attempts is None else validate.whole(
        max_attempts, "max_attempts", minimum=1)
    lease = default_lease if lease_seconds is None else validate.seconds(
        lease_seconds, "lease_seconds")
    grace = None if reconcile_grace_seconds is None else validate.seconds(
        reconcile_grace_seconds, "reconcile_grace_seconds")
    return EffectKind(effect_type, vendor, lease, attempts, grace, redact_arguments,
                      store_result, redact_result, policy,
                      None if policy is None else evaluate(policy, effect_type, None))


def build_request(
    namespace: str, policy: Policy | None, kind: EffectKind, key: str,
    payload: Mapping[str, Any], *,
    run_id: str | None = None, agent_id: str | None = None, group_key: str | None = None,
    compensation: Any = None, compensates_effect_id: int | None = None,
    estimated_cost_micros: int | None = None,
) -> Request:
    """The :class:`Request` for an already checked ``key`` of ``kind`` in ``namespace``:
    the payload hashed, the run and agent taken from :func:`effectgate.run_context` when not
    given, every field validated and the policy's governance evaluated."""
    digest = payload_hash(payload)
    if run_id is None or agent_id is None:
        ctx_run, ctx_agent = run_context()
        run_id = run_id if run_id is not None else ctx_run
        agent_id = agent_id if agent_id is not None else ctx_agent
    if compensates_effect_id is not None:
        validate.whole(compensates_effect_id, "compensates_effect_id", minimum=1)
        if group_key is not None:  # it would hide among the group's steps from an unwind
            raise ConfigError("an undo (compensates_effect_id) is not a step of a saga group: "
                              "give it no group_key")
        if key.startswith(UNDO_PREFIX) and not kind.effect_type.endswith(UNDO_SUFFIX):
            raise reserved_key(key)  # (an undo's type has its exact key checked at begin)
    elif key.startswith(UNDO_PREFIX):  # no effect but an undo takes a step's one undo key
        raise reserved_key(key)
    cost = None if estimated_cost_micros is None else validate.micros(
        estimated_cost_micros, "estimated_cost_micros")
    # Only an undo's own type (``<type>.compensate``) escapes the spend ceilings: naming a
    # step held gives any other effect no leave to spend past them.
    undo = compensates_effect_id is not None and kind.effect_type.endswith(UNDO_SUFFIX)
    if cost is None and not undo and kind.policy is policy:
        gov = kind.governance  # asked when the kind was made
    else:
        gov = None if policy is None else evaluate(policy, kind.effect_type, cost,
                                                   spends=not undo)
    text = validate.text
    return _new_request(Request, (  # the tuple itself: every call makes one
        namespace, key, kind.effect_type, digest, kind.vendor, kind.max_attempts,
        kind.lease_seconds, kind.reconcile_grace_seconds,
        None if run_id is None else text(run_id, "run_id", 256),
        None if agent_id is None else text(agent_id, "agent_id", 256),
        None if group_key is None else validate.name(group_key, "group_key", 512),
        None if compensation is None else _compensation(compensation),
        compensates_effect_id, cost, gov, payload, kind.redact_arguments,
    ))


_new_request = tuple.__new__

MAX_COMPENSATION = 65_536
"""The most characters an undo's description (``compensation``, canonical JSON) may hold: it
is kept in the effect's row for as long as the effect is."""


def _compensation(value: Any) -> str:
    text = canonical_json(value, "compensation", as_dumped=True)  # stored: as a result is
    if len(text) > MAX_COMPENSATION:
        raise PayloadError(f"compensation is at most {MAX_COMPENSATION} characters of JSON; "
                           f"this one has {len(text)}: store a reference to the undo instead")
    return text
