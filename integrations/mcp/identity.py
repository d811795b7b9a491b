"""Which upstream the gateway stands in front of: its identity as the operator configured it,
the policy's rule for it, and the scope of its keys.

An upstream's **identity** is the command line (its argv) or the URL (scheme, host, port and
path) the gateway was started with — never what the server says about itself: its
``serverInfo`` name is a claim any server can make, so it chooses nothing here.

- **Trust**: the policy's ``[upstreams.LABEL]`` entry whose ``command`` or ``url`` is this
  upstream applies (its ``read_only`` and ``trust_read_only_hint``); else the entry the operator
  named with ``--upstream-name LABEL``; else ``[upstreams."*"]``; else none. An entry with
  neither ``command`` nor ``url`` is applied only by ``--upstream-name`` (a start line says
  so).
- **Keys**: every gated key begins with :attr:`UpstreamIdentity.key_scope` (``mcp-`` and 12 hex
  digits of a digest of the identity), so two instances of one server — the filesystem server
  on two roots — behind two gateways on one store are two sets of effects, while two gateways
  in front of one upstream (the same command or URL) share them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import urllib.parse
from dataclasses import dataclass, field
from typing import Literal

import effectgate as eg

from .upstream import redacted

__all__ = ["RuleChoice", "UpstreamIdentity", "choose_rule"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _url_identity(url: str) -> str:
    """``scheme://host[:port]/path``: the server a URL names (no credentials, query or
    fragment; scheme and host in lower case, the default port left out)."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    return f"{scheme}://{host}{parts.path or '/'}"


@dataclass(frozen=True)
class UpstreamIdentity:
    """An upstream as configured: ``("stdio", argv)`` or ``("http", URL)``."""

    transport: Literal["stdio", "http"]
    target: tuple[str, ...] | str

    @classmethod
    def of(cls, target: str) -> UpstreamIdentity:
        """The identity of ``target``, a command line or an ``http(s)://`` URL (as given to
        ``mcp gateway --upstream``). :class:`~effectgate.ConfigError` if it cannot be read."""
        text = target.strip()
        if text.startswith(("http://", "https://")):
            return cls("http", _url_identity(text))
        try:
            argv = tuple(shlex.split(text))
        except ValueError as err:
            raise eg.ConfigError(f"cannot parse the upstream command: {err}") from None
        if not argv:
            raise eg.ConfigError("the upstream command is empty")
        return cls("stdio", argv)

    @property
    def key_scope(self) -> str:
        """What every gated key of this upstream begins with: ``mcp-`` + 12 hex digits."""
        text = json.dumps([self.transport, self.target], ensure_ascii=False)
        return "mcp-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]

    def names(self, rule: eg.UpstreamRule) -> bool:
        """True when ``rule``'s ``command`` or ``url`` is this upstream."""
        if rule.command is not None:
            return self.transport == "stdio" and self.target == tuple(shlex.split(rule.command))
        if rule.url is not None:
            return self.transport == "http" and self.target == _url_identity(rule.url)
        return False

    def describe(self) -> str:
        """``stdio: COMMAND`` or ``http: URL``, for start lines."""
        if isinstance(self.target, str):
            return f"http: {self.target}"
        return f"stdio: {redacted(shlex.join(self.target))}"


@dataclass(frozen=True)
class RuleChoice:
    """The policy's rule for this upstream (or None), why, and warnings for the start lines."""

    rule: eg.UpstreamRule | None
    why: str
    warnings: tuple[str, ...] = field(default=())


def choose_rule(policy: eg.Policy | None, identity: UpstreamIdentity | None,
                label: str | None = None) -> RuleChoice:
    """The ``[upstreams]`` entry that applies to the upstream ``identity`` (see the module's
    docstring); ``label`` is the operator's ``--upstream-name``. :class:`~effectgate.PolicyError`
    when the entry named by ``label`` is for another command or URL, or two entries name this
    upstream."""
    if policy is None or not policy.upstreams:
        return RuleChoice(None, "no policy rule for this upstream")
    warnings = tuple(
        f"[upstreams.{json.dumps(rule.name, ensure_ascii=False)}] names no command or url, so "
        "it applies only with --upstream-name (the name a server reports proves nothing)"
        for rule in policy.upstreams.values()
        if rule.command is None and rule.url is None and rule.name not in ("*", label))
    if label is not None:
        rule = policy.upstream(label)
        if rule is None:
            return RuleChoice(None, "no policy rule for this upstream", (
                *warnings, f"--upstream-name {label!r}: the policy has no such [upstreams] entry"))
        bound = rule.command is not None or rule.url is not None
        if bound and (identity is None or not identity.names(rule)):
            raise eg.PolicyError(
                f"upstreams.{rule.name}: it is for {rule.command or rule.url!r}, not this "
                f"gateway's upstream{f' ({identity.describe()})' if identity else ''}")
        return RuleChoice(rule, f"policy rule for upstream {rule.name!r} (--upstream-name)",
                          warnings)
    named = [r for r in policy.upstreams.values() if identity is not None and identity.names(r)]
    if len(named) > 1:
        raise eg.PolicyError("entries " + ", ".join(repr(r.name) for r in named)
                             + " of [upstreams] all name this upstream; keep one")
    if named:
        how = "its command" if named[0].command is not None else "its url"
        return RuleChoice(named[0], f"policy rule for upstream {named[0].name!r} ({how})",
                          warnings)
    fallback = policy.upstreams.get("*")
    if fallback is not None and fallback.command is None and fallback.url is None:
        return RuleChoice(fallback, "policy rule for upstream '*' (any upstream)", warnings)
    return RuleChoice(None, "no policy rule for this upstream", warnings)
