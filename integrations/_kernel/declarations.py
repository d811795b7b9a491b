"""One reader of effect declarations: which tool is which effect, under which key template.

Every place that wraps a set of tools without decorators — ``gate_tools`` of each framework,
LangChain's ``EffectGateMiddleware``, pydantic-ai's ``EffectGateToolset``, the MCP gateway —
reads its declarations here, so a policy means the same thing everywhere.

Accepted forms (``effects``):

* an :class:`effectgate.Policy`: each rule's ``tools`` are gated under its ``key`` with its
  options; ``policy.strict`` asks for strict mode. The gate must carry that policy (its
  approvals, denials and budgets are the gate's).
* a mapping of tool name to a key template (``"refund:{txn_id}"``), to a dict with ``key`` and
  :class:`effectgate.EffectSpec` options, to an :class:`effectgate.EffectRule`, to a ready
  :class:`effectgate.EffectSpec`, or to ``None`` (declared read-only: not gated, not reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from effectgate import ConfigError, EffectRule, EffectSpec, Gate, Policy

__all__ = ["SPEC_OPTIONS", "Declaration", "Declarations", "read_declarations"]

SPEC_OPTIONS = frozenset({
    "effect_type", "vendor", "cost_micros", "lease_seconds", "max_attempts", "group_key",
    "compensation", "redact", "store_result", "classifiers", "result_type",
})
"""Options a declaration may carry (:class:`effectgate.EffectSpec` keyword arguments)."""

_ADAPTER_OPTIONS = frozenset({"on_refusal"})


@dataclass(frozen=True)
class Declaration:
    """One tool's effect: its key template and options, or a ready spec."""

    tool: str
    key: str
    options: Mapping[str, Any] = field(default_factory=dict)
    spec: EffectSpec | None = None

    def effect_options(self) -> dict[str, Any]:
        """The :class:`effectgate.EffectSpec` options (without adapter options)."""
        return {k: v for k, v in self.options.items() if k not in _ADAPTER_OPTIONS}

    def adapter_options(self) -> dict[str, Any]:
        """Options for the adapter itself (``on_refusal``)."""
        return {k: v for k, v in self.options.items() if k in _ADAPTER_OPTIONS}

    def build(self, gate: Gate, **overrides: Any) -> EffectSpec:
        """The :class:`effectgate.EffectSpec` on ``gate``; ``effect_type`` defaults to the tool
        name; ``overrides`` (``redact=``...) win over the declared options."""
        if self.spec is not None:
            return self.spec
        options = {"effect_type": self.tool, **self.effect_options(), **overrides}
        return EffectSpec(gate, self.key, **options)


@dataclass(frozen=True)
class Declarations:
    """What a set of declarations says: declared tools, read-only tools, strict or not."""

    effects: Mapping[str, Declaration]
    read_only: frozenset[str]
    strict: bool

    def specs(self, gate: Gate) -> dict[str, EffectSpec]:
        """Tool name → :class:`effectgate.EffectSpec` (what the MCP gateway serves)."""
        return {name: d.build(gate) for name, d in self.effects.items()}

    def ungated(self, names: Iterable[str]) -> list[str]:
        """The names, in order, that are neither declared nor read-only."""
        return [n for n in names if n not in self.effects and n not in self.read_only]


def read_declarations(effects: Any, *, gate: Gate, tool_names: Sequence[str] | None = None,
                      read_only: Iterable[str] = ()) -> Declarations:
    """Read ``effects`` (a Policy or a mapping, see the module docstring).

    ``tool_names``, when known, are the tools being wrapped: a mapping that names another tool
    is refused (a typo would leave the real tool ungated). Every error is a
    :class:`effectgate.ConfigError` raised before anything is wrapped.
    """
    reads = set(read_only)
    for name in reads:
        if not isinstance(name, str):
            raise ConfigError(f"read_only names tools by str, not {type(name).__name__}")
    declared: dict[str, Declaration] = {}
    strict = False
    if isinstance(effects, Policy):
        if gate.policy is not effects and gate.policy != effects:
            raise ConfigError(
                "gate_tools got a Policy, but the gate was built without it: pass "
                "gate=eg.Gate(url, policy=policy) so its approvals, denials and budgets apply"
            )
        for name, rule in effects.tool_effects().items():
            entry = _entry(name, rule)
            if entry is not None:
                declared[name] = entry
        strict = bool(effects.strict)
    elif isinstance(effects, Mapping):
        if tool_names is not None:
            unknown = sorted(str(n) for n in set(effects) - set(tool_names))
            if unknown:
                raise ConfigError(
                    f"effects name tools that are not in the list: {', '.join(unknown)} "
                    f"(tools: {', '.join(tool_names)})"
                )
        for name, value in effects.items():
            if not isinstance(name, str):
                raise ConfigError(f"effects names tools by str, not {type(name).__name__}")
            entry = _entry(name, value)
            if entry is None:
                reads.add(name)
            else:
                declared[name] = entry
    else:
        raise ConfigError(
            "effects must be a mapping of tool name to key template, or an effectgate.Policy, "
            f"not {type(effects).__name__}"
        )
    return Declarations(declared, frozenset(reads), strict)


def _entry(name: str, value: Any) -> Declaration | None:
    if value is None:
        return None
    if isinstance(value, str):
        return Declaration(name, value)
    if isinstance(value, EffectSpec):
        return Declaration(name, value.template.template, spec=value)
    if isinstance(value, EffectRule):
        if value.key is None:
            raise ConfigError(f"effects[{name!r}]: the rule has no key template")
        return Declaration(name, value.key, value.effect_options())
    if isinstance(value, Mapping):
        options = dict(value)
        key = options.pop("key", None)
        if not isinstance(key, str):
            raise ConfigError(f"effects[{name!r}] needs a 'key' template (a str)")
        bad = sorted(str(k) for k in set(options) - SPEC_OPTIONS - _ADAPTER_OPTIONS)
        if bad:
            raise ConfigError(f"effects[{name!r}]: unknown options {', '.join(bad)}")
        return Declaration(name, key, options)
    raise ConfigError(
        f"effects[{name!r}] must be a key template, a dict with 'key', an EffectRule, an "
        f"EffectSpec or None (read-only), not {type(value).__name__}"
    )
