"""The policy in force for a gate: where it comes from (:func:`load_policy`), and whether it
is the one last recorded for the gate's namespace in the store (:func:`note_policy`).

``Gate()`` with no ``policy=`` loads ``$EFFECTGATE_POLICY``, else ``effectgate.toml`` or
``[tool.effectgate]`` found walking up from the working directory; ``policy=False`` means
none. A gate whose policy differs from the one recorded for its namespace logs a warning (a
gate started elsewhere, or with no policy file, must not run with other approvals and
ceilings unnoticed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .redact import bound
from .store.version import policy_meta_name

if TYPE_CHECKING:
    from .policy import Policy
    from .store import Store

__all__ = ["load_policy", "note_policy", "policy_digest"]

log = logging.getLogger("effectgate")


def load_policy(policy: object) -> tuple[Policy | None, str | None]:
    """The policy ``policy`` names (an :class:`~effectgate.Policy`, a path, a mapping, None to
    discover one, False for none) and where it came from (logged when there is one)."""
    loaded, source = _load(policy)
    if source is not None:
        log.info("policy in force: %s", source, extra={"reason": f"policy {source}"})
    return loaded, source


def _load(policy: object) -> tuple[Policy | None, str | None]:
    if policy is False:
        return None, None
    if policy is None or policy is True:
        from .discovery import find_policy  # tomllib and pathlib: only to look for a file

        found = find_policy()
        if found is None:
            return None, None
        policy = found
    from .policy import Policy  # pydantic: only once there is a policy

    if isinstance(policy, Policy):
        return policy, "<Policy>"
    if isinstance(policy, (str, os.PathLike)):
        return Policy.load(os.fspath(policy)), os.fspath(policy)
    if isinstance(policy, Mapping):
        return Policy.from_dict(policy), "<dict>"
    raise ConfigError("policy must be an eg.Policy, a path, a mapping, or False for none")


def note_policy(store: Store, namespace: str, policy: Policy | None,
                source: str | None) -> None:
    """Compare the policy in force with the one last recorded for ``namespace`` in the store:
    a difference is logged as a warning; a policy in force is then recorded (no policy never
    replaces the record)."""
    name = policy_meta_name(namespace)
    digest = policy_digest(policy)
    raw = store.meta.get(name)
    recorded: dict[str, Any] = {}
    if raw is not None:
        try:
            loaded = json.loads(raw)
            recorded = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            recorded = {}
    if recorded.get("digest") == digest or (raw is None and policy is None):
        return
    if raw is not None:
        was = recorded.get("source") or "no policy"
        now = source or "no policy"
        message = (f"namespace {namespace!r} runs with a policy that differs from the "
                   f"one last recorded for it in the store (then: {was}; now: {now}): "
                   "approvals, denials and ceilings may not be what its other gates apply")
        log.warning("%s", bound(message, 600),
                    extra={"reason": "policy differs from the one last recorded"})
    if policy is not None and not store.read_only:
        # Only a policy is recorded: an operator's CLI (no policy file where it runs) or a
        # gate started elsewhere warns, but does not replace what the application runs.
        store.put_meta(name, json.dumps(
            {"digest": digest, "source": source, "namespace": namespace}, sort_keys=True))


def policy_digest(policy: Policy | None) -> str:
    """A short digest of what a policy says (None: ``"none"``): equal for two policies that
    say the same thing, whatever their file's order or spelling."""
    if policy is None:
        return "none"
    text = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
