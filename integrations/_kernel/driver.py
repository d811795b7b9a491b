"""``gate_tools``, written once: each framework supplies only how to name, recognise and wrap
one of its tools; and the report of tools left ungated."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from effectgate import ConfigError, Gate
from effectgate.errors import UngatedToolWarning

from .call import OnRefusal
from .declarations import read_declarations
from .gates import resolve_gate

__all__ = ["Framework", "UngatedToolWarning", "gate_tools", "report_ungated"]

log = logging.getLogger("effectgate")


@dataclass(frozen=True)
class Framework:
    """What :func:`gate_tools` needs to know about one framework.

    ``tool_name(tool)``: the name the model calls it by, or None for a tool that does not run
    in this process (a hosted tool, a handoff): passed through, never reported.
    ``is_gated(tool)``: already wrapped. ``wrap(tool, key, gate=..., **options)``: the
    framework's ``gate_tool``.
    """

    name: str
    tool_name: Callable[[Any], str | None]
    is_gated: Callable[[Any], bool]
    wrap: Callable[..., Any]


def gate_tools(framework: Framework, tools: Iterable[Any], effects: Any, *,
               gate: Gate | None = None, strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message",
               wrap_options: Mapping[str, Any] | None = None) -> list[Any]:
    """Gate the declared tools of a list and pass the rest through, in order.

    ``effects``: see :func:`read_declarations`. ``wrap_options`` go to every ``wrap`` (a
    framework's own options, such as LangChain's ``pause``). Every tool left ungated is
    reported once by name (:func:`report_ungated`); ``strict=True`` (or ``policy.strict``)
    refuses them.
    """
    tools = list(tools)
    names = [framework.tool_name(t) for t in tools]
    resolved = resolve_gate(gate)
    declared = read_declarations(effects, gate=resolved, read_only=read_only,
                                 tool_names=[n for n in names if n is not None])
    out: list[Any] = []
    ungated: list[str] = []
    for tool, name in zip(tools, names, strict=True):
        if name is None or framework.is_gated(tool) or name in declared.read_only:
            out.append(tool)
        elif name in declared.effects:
            entry = declared.effects[name]
            if entry.spec is not None:
                raise ConfigError(
                    f"effects[{name!r}]: gate_tools takes a key template and options, not an "
                    "EffectSpec (the tool's wrapper builds its own)"
                )
            options = {"on_refusal": on_refusal, **(wrap_options or {}), **entry.options}
            out.append(framework.wrap(tool, entry.key, gate=resolved, **options))
        else:
            ungated.append(name)
            out.append(tool)
    report_ungated(framework.name, ungated, strict=strict or declared.strict)
    return out


_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def report_ungated(framework: str, names: Sequence[str], *, strict: bool) -> None:
    """Report each ungated tool once per process (a warning and a log line), or, ``strict``,
    refuse them all with :class:`ConfigError` naming them."""
    if not names:
        return
    if strict:
        raise ConfigError(
            f"strict mode: these tools have no effect declared and would run ungated: "
            f"{', '.join(names)}. Declare a key template for each, or list reads as read_only"
        )
    for name in names:
        with _reported_lock:
            if (framework, name) in _reported:
                continue
            _reported.add((framework, name))
        text = (
            f"tool {name!r} has no effect declared: it runs ungated (a repeat runs again). "
            "Declare a key template for it, or list it as read_only if it only reads"
        )
        log.warning(text, extra={"tool": name, "framework": framework, "reason": "ungated"})
        warnings.warn(text, UngatedToolWarning, stacklevel=3)
