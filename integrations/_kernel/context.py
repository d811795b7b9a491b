"""Arguments and context in: what a framework's tool call contributes to an effect."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from effectgate import EffectKeyError, effect_context

from .call import Refused
from .vocabulary import model_message

if TYPE_CHECKING:
    import pydantic
    import pydantic.v1

__all__ = ["framework_context", "invalid_arguments", "model_arguments"]


def model_arguments(model: Any, raw: Mapping[str, Any], *,
                    by_name: bool = False) -> dict[str, Any]:
    """Validate ``raw`` through a pydantic model class; every field by name, defaults applied.
    ``raw``'s keys are the fields' aliases, as a model sends them (or, ``by_name``, either
    their aliases or their names: what a framework hands on after its own validation).

    Values keep their validated types (a nested model stays a model, so a key template can
    say ``{order.id}``); the payload hash makes them canonical JSON.
    """
    validated = model.model_validate(dict(raw), by_alias=True, by_name=True) if by_name \
        else model.model_validate(dict(raw))
    return {name: getattr(validated, name) for name in type(validated).model_fields}


def invalid_arguments(tool_name: str,
                      err: pydantic.ValidationError | pydantic.v1.ValidationError | str,
                      ) -> Refused:
    """The refusal of a call whose arguments the tool's input model (pydantic, or
    ``pydantic.v1``) does not validate (or, ``err`` a text, that are not arguments by name at
    all): the model is told which, and the tool never runs (a gate that cannot key a call does
    not let it through)."""
    if isinstance(err, str):
        detail = f"{tool_name}: {err}"
    else:
        errors = err.errors()
        first = errors[0]
        detail = (f"{tool_name}: {len(errors)} invalid argument(s) "
                  f"({'.'.join(str(p) for p in first['loc'])}: {first['msg']})")
    error = EffectKeyError(detail)
    return Refused("invalid", model_message("invalid", None, error), error, None)


def framework_context(run_id: Any = None, agent_id: Any = None) -> Any:
    """An :class:`effectgate.effect_context` that fills in ``run_id`` / ``agent_id`` from the
    framework where the caller has not set them already (the caller's own context wins)."""
    outer_run, outer_agent = effect_context.current()
    run = None if outer_run is not None or run_id is None else str(run_id)
    agent = None if outer_agent is not None or agent_id is None else str(agent_id)
    if run is None and agent is None:
        return contextlib.nullcontext()
    return effect_context(run_id=run, agent_id=agent)
