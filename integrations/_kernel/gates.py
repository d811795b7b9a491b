"""The gate an integration uses: the one given, or one process-wide default.

``gate=None`` anywhere in the integrations means :func:`default_gate`: one process-wide
``eg.Gate()`` (``$EFFECTGATE_URL``, else ``sqlite:///.effectgate/effects.db``), created on first
use — the same store the plain ``eg.Gate()`` a user writes would open.
"""

from __future__ import annotations

import logging
import threading

from effectgate import ConfigError, Gate

__all__ = ["default_gate", "resolve_gate"]

log = logging.getLogger("effectgate")
_default: Gate | None = None
_default_lock = threading.Lock()


def default_gate() -> Gate:
    """The process-wide gate used when an integration is given ``gate=None``."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Gate()
                log.info("effectgate integrations use the default gate on %s", _default.url)
    return _default


def resolve_gate(gate: Gate | None) -> Gate:
    """``gate``, or the process-wide default."""
    if gate is None:
        return default_gate()
    if not isinstance(gate, Gate):
        raise ConfigError(f"gate must be an effectgate.Gate, not {type(gate).__name__}")
    return gate
