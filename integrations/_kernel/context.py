"""Arguments and context in: what a framework's tool call contributes to an effect."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from effectgate import effect_context

__all__ = ["framework_context", "model_arguments"]


def model_arguments(model: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``raw`` through a pydantic model class; every field by name, defaults applied.

    Values keep their validated types (a nested model stays a model, so a key template can
    say ``{order.id}``); the payload hash makes them canonical JSON.
    """
    validated = model.model_validate(dict(raw))
    return {name: getattr(validated, name) for name in type(validated).model_fields}


def framework_context(run_id: Any = None, agent_id: Any = None) -> Any:
    """An :class:`effectgate.effect_context` that fills in ``run_id`` / ``agent_id`` from the
    framework where the caller has not set them already (the caller's own context wins)."""
    outer_run, outer_agent = effect_context.current()
    run = None if outer_run is not None or run_id is None else str(run_id)
    agent = None if outer_agent is not None or agent_id is None else str(agent_id)
    if run is None and agent is None:
        return contextlib.nullcontext()
    return effect_context(run_id=run, agent_id=agent)
