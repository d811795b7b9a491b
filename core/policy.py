"""Policy: what each effect type may do, loaded from ``effectgate.toml`` (or
``[tool.effectgate]`` in ``pyproject.toml``) or built in Python.

.. code-block:: toml

    strict = true                        # wrappers refuse tools with no effect declared

    [budget]                             # ceilings over every effect type
    per_day_micros = 500_000_000

    [effects."payment.*"]                # glob patterns allowed; the most specific one wins
    key = "refund:{txn_id}"              # template for tools with no decorator
    tools = ["refund"]                   # tool names it covers (gate_tools, the MCP gateway)
    vendor = "stripe"
    lease_seconds = 30
    max_attempts = 3
    approval = { at_or_above_micros = 100_000_000, expires_seconds = 3600,
                 allow_self_approval = false }     # or "always" / "never"
    budget = { per_run_micros = 50_000_000, per_agent_micros = 200_000_000 }
    on_ambiguous = "reconcile"           # or "block": never consult a reconcile hook
    reconcile_grace_seconds = 60         # after a lapsed lease (default: the lease again)
    redact_arguments = ["card_number"]   # an approver sees these as "[redacted]"
    store_result = true                  # false: a duplicate returns None, nothing is kept
    redact_result = ["card", "phone"]    # result fields (at any depth) stored as "[redacted]"
    deny = false                         # or a reason: every call is denied

    [upstreams.files]                    # an MCP upstream: a label, and which server it is
    command = "npx @modelcontextprotocol/server-filesystem ./data"   # or url = "https://..."
    read_only = ["read_*", "list_*"]     # its tools that only read (names or globs): never gated
    trust_read_only_hint = true          # also pass its tools annotated readOnlyHint: true

The gateway applies an ``[upstreams]`` entry to the upstream it was started with when the
entry's ``command`` or ``url`` is that upstream (or when ``mcp gateway --upstream-name LABEL``
names it) — never because of the name a server reports about itself, which any server can
claim. An entry with neither applies only by ``--upstream-name``; ``[upstreams."*"]`` applies
to any upstream no entry names.

Every other tool of an upstream without an effect declared is a write: wrappers print it once
at start and ``strict`` refuses it. ``idempotentHint`` and ``destructiveHint`` never decide.

Where a gate finds its policy (``Gate()`` with no ``policy=``, and the CLI): ``$EFFECTGATE_POLICY``
if set, else the first ``effectgate.toml`` — or ``pyproject.toml`` with a ``[tool.effectgate]``
table — found walking up from the working directory (:func:`find_policy`), as ruff and pytest
find their configuration.

A malformed policy fails at load, naming the file, the line where it can be found, the field,
and what is wrong — never at the first refund.
"""

from __future__ import annotations

import fnmatch
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from . import validate
from .discovery import find_policy
from .errors import ConfigError, EffectKeyError, PolicyError
from .keys import effect_key_template
from .registry import UNDO_SUFFIX
from .validate import MAX_INT
from .vendors import VENDOR_RULES

__all__ = ["ApprovalRule", "Budget", "EffectRule", "Policy", "UpstreamRule", "find_policy"]

# Seconds (a lease, a grace, an approval's expiry) are strict: an int or a float, never a bool
# (``lease_seconds = true`` is no lease of one second) or a string.
_SECONDS_MAX = 7 * 24 * 3600

# Money in micro-units: a whole number (not a bool, a float or a string) from 0 to what a
# BIGINT column holds on both databases, so a ceiling or a cost can always be stored.
_Micros = Field(default=None, ge=0, le=MAX_INT, strict=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """Spend ceilings in micro-units (1,000,000 = $1), each over one scope."""

    per_run_micros: int | None = _Micros
    per_agent_micros: int | None = _Micros
    per_effect_type_micros: int | None = _Micros
    per_day_micros: int | None = _Micros

    def ceilings(self) -> list[tuple[str, int]]:
        """(scope, limit) for each ceiling set: scope is run, agent, effect_type or day."""
        out = []
        for scope in ("run", "agent", "effect_type", "day"):
            limit = getattr(self, f"per_{scope}_micros")
            if limit is not None:
                out.append((scope, limit))
        return out


class ApprovalRule(_Strict):
    """When a human must approve: ``always``, or at/above an estimated cost."""

    always: bool = Field(default=False, strict=True)
    at_or_above_micros: int | None = _Micros
    expires_seconds: float = Field(default=24 * 3600.0, gt=0, allow_inf_nan=False, strict=True)
    allow_self_approval: bool = Field(default=False, strict=True)

    def applies(self, cost_micros: int | None) -> bool:
        """True when a call with this estimated cost needs approval. A call that declares no
        cost is asked under a threshold too: leaving the cost out (a forgotten
        ``cost_micros``, an agent that omits it) must not run any amount unapproved."""
        if self.always:
            return True
        return self.at_or_above_micros is not None and (
            cost_micros is None or cost_micros >= self.at_or_above_micros)


class EffectRule(_Strict):
    """Policy for one effect type (or a glob pattern of types)."""

    effect_type: str
    key: str | None = None
    tools: tuple[str, ...] = ()
    vendor: str | None = None
    lease_seconds: float | None = Field(default=None, gt=0, le=_SECONDS_MAX, strict=True)
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_INT, strict=True)
    approval: ApprovalRule | None = None
    budget: Budget | None = None
    deny: StrictBool | StrictStr = False
    on_ambiguous: Literal["block", "reconcile"] = "reconcile"
    reconcile_grace_seconds: float | None = Field(default=None, gt=0, le=_SECONDS_MAX,
                                                  strict=True)
    redact_arguments: tuple[str, ...] = ()
    store_result: bool = Field(default=True, strict=True)
    redact_result: tuple[str, ...] = ()

    @field_validator("redact_arguments", "redact_result")
    @classmethod
    def _field_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name.strip() or len(name) > 200 or not name.isprintable():
                raise ValueError(f"names fields (printable, at most 200 characters), not {name!r}")
        return value

    @field_validator("effect_type")
    @classmethod
    def _pattern(cls, value: str) -> str:
        # the characters an effect type may hold (an empty pattern, a NUL or a no-break space
        # matches no type: a rule that governs nothing), written as types are (NFC)
        try:
            checked = validate.name(value, "an effect type pattern", max(len(value), 1),
                                    required=True)
        except ConfigError as err:
            raise ValueError(f"{err.message}, not {value!r}") from None
        if checked != value:
            raise ValueError(f"an effect type pattern is written in NFC, as effect types are "
                             f"(it would match none of them), not {value!r}")
        if "|" in value:  # a spend counter is "pattern|scope|id": two ceilings would share one
            raise ValueError(f"an effect type pattern has no '|', not {value!r} (its spend "
                             "counters could be another rule's)")
        return value

    @field_validator("budget")
    @classmethod
    def _no_undo_budget(cls, value: Budget | None, info: ValidationInfo) -> Budget | None:
        pattern = info.data.get("effect_type")
        if value is not None and isinstance(pattern, str) and pattern.endswith(UNDO_SUFFIX):
            raise ValueError(
                f"{pattern!r} names undos (a saga's compensations), and no spend ceiling "
                "counts an undo: it gives back what its step spent, and a budget spent must "
                "never stop an unwind halfway (a booked flight with its hotel cancelled). "
                "Put the ceiling on the steps' own type; to have a person look at large "
                "undos, give this rule an approval (at_or_above_micros)")
        return value

    @field_validator("approval", mode="before")
    @classmethod
    def _approval(cls, value: Any) -> Any:
        if value is True or value == "always":
            return {"always": True}
        if value is None or value is False or value == "never":  # (not 0: "in" would take it)
            return None
        return value

    @field_validator("deny")
    @classmethod
    def _reason(cls, value: bool | str) -> bool | str:
        if isinstance(value, str) and not (value.strip() and value.isprintable()):
            raise ValueError("is true, false or the reason every call is denied (printable, "
                             f"not blank), not {value!r}")
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                template = effect_key_template(value)  # (an undo's prefix is refused here)
            except EffectKeyError as err:
                raise ValueError(err.message) from None
            # "{0}" names an argument "0" to KeyTemplate, which no function has (a decorator
            # refuses it); str.format would read it as the first positional argument
            if any(root.isdigit() for root in template.roots):
                raise ValueError(f"bad key template {value!r}: positional fields ({{0}}) are "
                                 "not allowed; name the argument")
        return value

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str | None) -> str | None:
        if value is not None and value not in VENDOR_RULES:
            raise ValueError(f"unknown vendor {value!r}; known: {', '.join(sorted(VENDOR_RULES))}")
        return value

    @property
    def denied(self) -> str | None:
        """The reason every call is denied, or None."""
        if self.deny is True:
            return f"policy denies {self.effect_type}"
        return self.deny or None

    def effect_options(self) -> dict[str, Any]:
        """Options for :class:`~effectgate.EffectSpec` (what a tool wrapper passes on)."""
        options: dict[str, Any] = {"effect_type": self.effect_type}
        for name in ("vendor", "lease_seconds", "max_attempts"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options


_GLOB = frozenset("*?[")


class UpstreamRule(_Strict):
    """What the policy knows about one MCP upstream: which of its tools only read, and whether
    its own ``readOnlyHint`` annotations are believed.

    ``command`` (a command line, as given to ``mcp gateway --upstream``) or ``url`` (an
    ``http(s)://host[:port]/path``, without credentials or query) says which upstream that is,
    as the operator configured it: the gateway applies the rule to the upstream it was started
    with when that is this command or URL, never because of the name a server reports about
    itself. ``name`` is the entry's label (``--upstream-name`` selects an entry by it; ``"*"``
    is the rule for any upstream no entry names)."""

    name: str
    command: str | None = None
    url: str | None = None
    read_only: tuple[str, ...] = ()
    trust_read_only_hint: bool = False

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("command holds a control character")
        try:
            argv = shlex.split(value)
        except ValueError as err:
            raise ValueError(f"cannot parse the command: {err}") from None
        if not argv:
            raise ValueError("command is empty")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value.strip())
            parts.port  # noqa: B018 - a bad port raises here
        except ValueError as err:
            raise ValueError(f"not a URL: {err}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url is http(s)://host[:port]/path")
        if parts.username is not None or parts.password is not None or parts.query \
                or parts.fragment:
            raise ValueError("url names the server only: keep credentials, query and fragment "
                             "out of the policy (they are not part of which server it is)")
        return value.strip()

    def model_post_init(self, _context: Any) -> None:
        if self.command is not None and self.url is not None:
            raise ValueError("give a command or a url, not both")

    @field_validator("read_only")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not pattern.strip() or any(ord(ch) < 32 for ch in pattern):
                raise ValueError(f"read_only holds tool names or globs, not {pattern!r}")
        return value

    def is_read_only(self, tool: str) -> bool:
        """True when ``tool`` matches one of ``read_only`` (a name or a glob)."""
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.read_only)


class Policy(_Strict):
    """Per effect type rules, ceilings over everything, ``strict`` for wrappers, and what is
    known about MCP upstreams (``upstreams``)."""

    effects: dict[str, EffectRule] = Field(default_factory=dict)
    budget: Budget | None = None
    strict: bool = False
    upstreams: dict[str, UpstreamRule] = Field(default_factory=dict)

    @field_validator("effects", mode="before")
    @classmethod
    def _name_rules(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {
                name: {"effect_type": name, **rule} if isinstance(rule, Mapping) else rule
                for name, rule in value.items()
            }
        return value

    @field_validator("upstreams", mode="before")
    @classmethod
    def _name_upstreams(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {name: {"name": name, **rule} if isinstance(rule, Mapping) else rule
                    for name, rule in value.items()}
        return value

    def model_post_init(self, _context: Any) -> None:
        tools: dict[str, str] = {}
        for rule in self.effects.values():
            if len(rule.tools) > 1:
                raise ValueError(
                    f"effects.{rule.effect_type}: tools {', '.join(map(repr, rule.tools))} share "
                    "one key template, which would make them one effect (a capture would answer "
                    "a refund); give each tool its own effect type and rule"
                )
            for tool in rule.tools:
                if tool in tools:
                    raise ValueError(
                        f"tool {tool!r} is declared by both {tools[tool]!r} and "
                        f"{rule.effect_type!r}"
                    )
                tools[tool] = rule.effect_type
            if rule.tools and rule.key is None:
                raise ValueError(f"effects.{rule.effect_type}: tools need a key template")
            if rule.tools and any(ch in rule.effect_type for ch in "*?["):
                raise ValueError(
                    f"effects.{rule.effect_type}: a rule with tools names one effect type, "
                    "not a pattern"
                )
        for upstream in self.upstreams.values():
            for pattern in upstream.read_only:
                if not _GLOB & set(pattern) and pattern in tools:
                    raise ValueError(
                        f"upstreams.{upstream.name}: tool {pattern!r} is read_only and gated by "
                        f"{tools[pattern]!r}; it is one or the other")
        every = self.effects.get("*")
        if self.budget is not None and every is not None and every.budget is not None:
            raise ValueError(
                'effects."*" has a budget beside the top-level [budget]: both would count on '
                'the same counters ("*"), charging each call twice; put the ceilings in one')
        # Most specific pattern first: exact names, then longer literal prefixes; for an undo's
        # type, the patterns written for undos before any other.
        ordered = sorted(self.effects.values(), key=lambda r: -len(r.effect_type.split("*")[0]))
        undo_first = sorted(ordered, key=lambda r: not r.effect_type.endswith(UNDO_SUFFIX))
        object.__setattr__(self, "_ordered", tuple(ordered))
        object.__setattr__(self, "_undo_first", tuple(undo_first))
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_ceilings", {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>",
                  text: str | None = None) -> Policy:
        """Build a policy from plain data; :class:`PolicyError` names the field at fault."""
        if not isinstance(data, Mapping):
            raise PolicyError(f"{source}: a policy is a table, not {type(data).__name__}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as err:
            raise _policy_error(err, source, text) from None
        except ValueError as err:
            raise PolicyError(f"{source}: {err}", reason=str(err)) from None

    @classmethod
    def load(cls, path: str | Path = "effectgate.toml") -> Policy:
        """Load ``effectgate.toml``, or ``[tool.effectgate]`` from a ``pyproject.toml``."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise PolicyError(f"{path}: cannot read the policy: {err.strerror}") from None
        except UnicodeDecodeError as err:  # (its text would show the file's bytes)
            raise PolicyError(f"{path}: the policy is not UTF-8 text (a bad byte at offset "
                              f"{err.start})", reason="not UTF-8") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise PolicyError(f"{path}: not valid TOML: {err}") from None
        if path.name == "pyproject.toml":
            data = data.get("tool", {}).get("effectgate")
            if data is None:
                raise PolicyError(f"{path}: has no [tool.effectgate] table")
        return cls.from_dict(data, source=str(path), text=text)

    def rule_for(self, effect_type: str) -> EffectRule | None:
        """The rule for ``effect_type``: an exact entry, else the most specific glob. For an
        undo's type (``….compensate``) a pattern written for undos (``*.compensate``) is more
        specific than one that is not (``booking.*``), however long that one's prefix: the
        rule someone wrote for undos governs them, taking what it leaves unset from that
        other rule and keeping no more of their data than it does (:func:`_over_its_step`)."""
        cache: dict[str, EffectRule | None] = self._cache  # type: ignore[attr-defined]
        if effect_type in cache:
            return cache[effect_type]
        rule = self.effects.get(effect_type)
        if rule is None:
            undo = effect_type.endswith(UNDO_SUFFIX)
            ordered = self._undo_first if undo else self._ordered  # type: ignore[attr-defined]
            for candidate in ordered:
                if fnmatch.fnmatchcase(effect_type, candidate.effect_type):
                    rule = candidate
                    break
        if rule is not None and _for_undos(rule):
            rule = _over_its_step(rule, self._besides_undo_rules(effect_type))
        cache[effect_type] = rule
        return rule

    def upstream(self, name: str) -> UpstreamRule | None:
        """The rule for the MCP upstream named ``name``: an exact entry, else the most specific
        glob (``"*"`` for every upstream), else None."""
        rule = self.upstreams.get(name)
        if rule is None:
            ordered = sorted(self.upstreams.values(), key=lambda r: -len(r.name.split("*")[0]))
            rule = next((r for r in ordered if fnmatch.fnmatchcase(name, r.name)), None)
        return rule

    def tool_effects(self) -> dict[str, EffectRule]:
        """Tool name → the rule that gates it (for tools with no decorator)."""
        return {tool: rule for rule in self.effects.values() for tool in rule.tools}

    def ceilings_for(self, effect_type: str) -> list[tuple[str, str, int]]:
        """(pattern, scope, limit) for every ceiling that applies to ``effect_type``."""
        cache: dict[str, list[tuple[str, str, int]]] = self._ceilings  # type: ignore[attr-defined]
        found = cache.get(effect_type)
        if found is None:
            found = cache[effect_type] = self._ceilings_uncached(effect_type)
        return found

    def _ceilings_uncached(self, effect_type: str) -> list[tuple[str, str, int]]:
        out: list[tuple[str, str, int]] = []
        rule = self._spending_rule(effect_type)
        if rule is not None and rule.budget is not None:
            out += [(rule.effect_type, s, limit) for s, limit in rule.budget.ceilings()]
        if self.budget is not None:
            out += [("*", s, limit) for s, limit in self.budget.ceilings()]
        return out

    def _spending_rule(self, effect_type: str) -> EffectRule | None:
        """The rule whose ceilings count a call of ``effect_type``: :meth:`rule_for`'s, unless
        that one was written for undos. Such a rule carries no ceiling (no ceiling counts an
        undo, which is exempt by its ``compensates_effect_id``, not by its name), so a call
        that only bears an undo's name is counted by the most specific other rule: naming a
        type ``….compensate`` is no leave to spend past its step glob's ceiling."""
        rule = self.rule_for(effect_type)
        if rule is None or not _for_undos(rule):
            return rule
        return self._besides_undo_rules(effect_type)

    def _besides_undo_rules(self, effect_type: str) -> EffectRule | None:
        """The most specific rule for ``effect_type`` among those not written for undos (the
        one that governed an undo's type before rules for undos went first)."""
        ordered: tuple[EffectRule, ...] = self._ordered  # type: ignore[attr-defined]
        return next((r for r in ordered if not _for_undos(r)
                     and fnmatch.fnmatchcase(effect_type, r.effect_type)), None)


def _for_undos(rule: EffectRule) -> bool:
    """Whether ``rule`` was written for undos (its pattern ends in ``.compensate``)."""
    return rule.effect_type.endswith(UNDO_SUFFIX)


def _over_its_step(rule: EffectRule, step: EffectRule | None) -> EffectRule:
    """``rule`` (written for undos) as it governs an undo's type that ``step`` (the most
    specific other rule, which governed it before rules for undos went first) matches too.
    What ``rule`` says of approval, denial and ceilings stands. An option it leaves unset
    (:data:`_STEP_OPTIONS`: the vendor, the lease, attempts, the reconcile grace,
    ``on_ambiguous``) is ``step``'s: a rule added to have undos approved does not take from
    the undo of a Stripe step its vendor key, nor shorten its grace. And it keeps no more of
    an undo's data than ``step`` does (``store_result``, ``redact_result``,
    ``redact_arguments``: each the stricter of the two)."""
    if step is None:
        return rule
    update: dict[str, Any] = {name: getattr(step, name) for name in _STEP_OPTIONS
                              if name not in rule.model_fields_set}
    update["store_result"] = rule.store_result and step.store_result
    update["redact_result"] = tuple(dict.fromkeys((*rule.redact_result, *step.redact_result)))
    update["redact_arguments"] = tuple(dict.fromkeys((*rule.redact_arguments,
                                                      *step.redact_arguments)))
    changed = {name: value for name, value in update.items() if getattr(rule, name) != value}
    return rule.model_copy(update=changed) if changed else rule


_STEP_OPTIONS = ("vendor", "lease_seconds", "max_attempts", "reconcile_grace_seconds",
                 "on_ambiguous")
"""The options of an undo's type that a rule written for undos takes from its step's rule
when it leaves them unset (:func:`_over_its_step`)."""


def _policy_error(err: ValidationError, source: str, text: str | None) -> PolicyError:
    problems = []
    for item in err.errors():
        loc = [str(part) for part in item["loc"]]
        field = ".".join(loc) or "(top level)"
        line = _line_of(text, loc) if text else None
        where = f"{source}:{line}" if line else source
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (a typo?)"
        problems.append(f"{where}: {field}: {message}")
    error = PolicyError("invalid policy:\n  " + "\n  ".join(problems), reason=problems[0])
    return error


def _line_of(text: str, loc: list[str]) -> int | None:
    """Best effort: the line of the deepest part of ``loc`` found after its parents."""
    lines = text.splitlines()
    start, found = 0, None
    for part in loc:
        for number in range(start, len(lines)):
            stripped = lines[number].strip()
            if part in stripped and (stripped.startswith(("[", part, f'"{part}"'))
                                     or f"{part} =" in stripped or f"{part}=" in stripped):
                start, found = number, number + 1
                break
    return found
