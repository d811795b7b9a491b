"""Which upstream tools write (the rule the gateway and ``mcp init`` share), the policy's
``[upstreams.NAME]`` rules, and the key ``mcp init`` proposes for a tool."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install "effectgate[mcp]"')

from mcp import types

from effectgate.integrations.mcp.identity import UpstreamIdentity, choose_rule
from effectgate.integrations.mcp.init import propose_key, render_policy
from effectgate.integrations.mcp.results import stored_result
from effectgate.integrations.mcp.transport import check_bind, is_loopback
from effectgate.integrations.mcp.writes import Kind, classify


def tool(name: str, *, read: bool | None = None, idempotent: bool | None = None,
         destructive: bool | None = None, schema: dict[str, Any] | None = None) -> types.Tool:
    notes = None
    if (read, idempotent, destructive) != (None, None, None):
        notes = types.ToolAnnotations(read_only_hint=read, idempotent_hint=idempotent,
                                      destructive_hint=destructive)
    return types.Tool(name=name, annotations=notes,
                      input_schema=schema or {"type": "object", "properties": {}})


POLICY = eg.Policy.from_dict({
    "effects": {"fs.write": {"key": "w:{path|path}:{content|sha256}", "tools": ["write_file"]}},
    "upstreams": {
        "secure-filesystem-server": {"read_only": ["read_*", "list_directory"]},
        "trusted-*": {"trust_read_only_hint": True},
        "*": {},
    },
})


def test_the_policy_picks_the_most_specific_upstream_rule() -> None:
    fs = POLICY.upstream("secure-filesystem-server")
    assert fs is not None and fs.read_only == ("read_*", "list_directory")
    trusted = POLICY.upstream("trusted-everything")
    assert trusted is not None and trusted.trust_read_only_hint
    fallback = POLICY.upstream("anything")
    assert fallback is not None and fallback.name == "*"
    assert eg.Policy.from_dict({}).upstream("x") is None


@pytest.mark.parametrize(("tool_", "upstream", "kind"), [
    (tool("write_file", read=True), "secure-filesystem-server", Kind.GATED),  # gated wins
    (tool("read_text_file"), "secure-filesystem-server", Kind.READ),  # policy read_only
    (tool("list_directory", read=False), "secure-filesystem-server", Kind.READ),
    (tool("list_directory_with_sizes", read=True), "secure-filesystem-server", Kind.WRITE),
    (tool("echo", read=True), "trusted-everything", Kind.READ),  # trusted hint
    (tool("echo", read=True), "anything", Kind.WRITE),  # untrusted hint
    (tool("move_file"), "trusted-everything", Kind.WRITE),  # no annotations: destructive
    (tool("toggle", idempotent=True, destructive=False), "trusted-everything", Kind.WRITE),
    (tool("put", read=False, idempotent=True), "trusted-everything", Kind.WRITE),
])
def test_every_tool_without_an_effect_or_a_trusted_read_is_a_write(
        tool_: types.Tool, upstream: str, kind: Kind) -> None:
    """Missing annotations count as destructive and idempotentHint never skips the gate; a
    readOnlyHint passes only from an upstream the policy trusts."""
    verdict = classify(tool_, POLICY.tool_effects(), POLICY.upstream(upstream))
    assert verdict.kind is kind, verdict.why


@pytest.mark.parametrize("policy", [
    {"effects": {"x.y": {"key": "k:{a}", "tools": ["w"]}},
     "upstreams": {"u": {"read_only": ["w"]}}},
    {"upstreams": {"u": {"read_only": "read_*"}}},
    {"upstreams": {"u": {"read_only": ["ok", ""]}}},
    {"upstreams": {"u": {"read_only": ["a\nb"]}}},
    {"upstreams": {"u": {"trust_read_only_hint": "yes please"}}},
    {"upstreams": {"u": {"typo": True}}},
    {"upstreams": ["u"]},
    {"upstreams": {"u": {"command": ""}}},
    {"upstreams": {"u": {"command": "'unclosed"}}},
    {"upstreams": {"u": {"command": "server\n--evil"}}},
    {"upstreams": {"u": {"url": "ftp://h/mcp"}}},
    {"upstreams": {"u": {"url": "https://user:tok@h/mcp"}}},
    {"upstreams": {"u": {"url": "https://h/mcp?key=s"}}},
    {"upstreams": {"u": {"url": "https://h:99999/mcp"}}},
    {"upstreams": {"u": {"url": "https://h/mcp", "command": "server"}}},
])
def test_a_malformed_upstream_rule_fails_at_load(policy: dict[str, Any]) -> None:
    with pytest.raises(eg.PolicyError):
        eg.Policy.from_dict(policy)


def schema(**props: str) -> dict[str, Any]:
    return {"type": "object", "required": list(props),
            "properties": {k: {"type": v} for k, v in props.items()}}


@pytest.mark.parametrize(("props", "template"), [
    ({"path": "string", "content": "string"}, "t:{path|path}:{content|sha256}"),
    ({"source": "string", "destination": "string"}, "t:{source|path}:{destination|path}"),
    ({"owner": "string", "repo": "string", "issue_number": "integer", "body": "string"},
     "t:{owner}:{repo}:{issue_number}:{body|sha256}"),
    ({"userId": "string", "items": "array", "amount": "number"},
     "t:{userId}:{items|sha256}:{amount|sha256}"),
    ({"to": "string", "dry": "boolean"}, "t:{to}"),
])
def test_init_proposes_a_key_over_the_identifying_required_parameters(
        props: dict[str, str], template: str) -> None:
    proposal = propose_key(tool("t", schema=schema(**props)))
    assert proposal.template == template
    eg.KeyTemplate(proposal.template)  # parses: every filter exists


def test_init_says_where_it_cannot_guess() -> None:
    bare = propose_key(tool("t"))
    assert bare.template == "t" and any("at most once ever" in n for n in bare.notes)
    odd = propose_key(tool("a{b}", schema=schema(**{"x y": "string", "id": "string"})))
    assert odd.template == "a{{b}}:{id}" and any("'x y'" in n for n in odd.notes)
    assert eg.KeyTemplate(odd.template).render({"id": "1"}) == "a{b}:1"


def test_the_rendered_policy_loads_and_lists_reads_by_name() -> None:
    text = render_policy([tool("peek", read=True), tool("poke"), tool('q"\n\x7f')],
                         server='srv "x"\n', version="1")
    policy = eg.Policy.from_dict(tomllib.loads(text))
    (rule,) = policy.upstreams.values()
    assert rule.name == 'srv "x"\n' and rule.read_only == ("peek",)
    assert not rule.trust_read_only_hint and policy.strict
    assert set(policy.tool_effects()) == {"poke", 'q"\n\x7f'}
    assert all(line.startswith("#") or "\x7f" not in line for line in text.splitlines())


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.4", False),
    ("example.com", False), ("localhost.evil.com", False),
])
def test_only_loopback_addresses_count_as_local(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    if loopback:
        check_bind(host, 8000)
    else:
        with pytest.raises(eg.ConfigError, match="--allow-remote"):
            check_bind(host, 8000)
        check_bind(host, 8000, allow_remote=True)


@pytest.mark.parametrize(("host", "port"), [("127.0.0.1", -1), ("127.0.0.1", 70000),
                                             ("127.0.0.1", True), ("", 80), ("a b", 80),
                                             ("x\n", 80)])
def test_bad_addresses_are_config_errors(host: str, port: Any) -> None:
    with pytest.raises(eg.ConfigError):
        check_bind(host, port, allow_remote=True)


def test_start_lines_and_policies_never_show_url_credentials() -> None:
    from effectgate.integrations.mcp.upstream import Upstream, redacted

    assert redacted("https://u:tok@h.example:8443/mcp?key=s#f") == "https://h.example:8443/mcp"
    assert redacted("python server.py --token x") == "python server.py --token x"
    assert "tok" not in Upstream("https://u:tok@h.example/mcp?key=s").describe()


BOUND = eg.Policy.from_dict({"upstreams": {
    "files": {"command": "npx @modelcontextprotocol/server-filesystem /srv/a",
              "read_only": ["read_*"]},
    "remote": {"url": "https://MCP.example.com:443/mcp", "trust_read_only_hint": True},
    "secure-filesystem-server": {"trust_read_only_hint": True},
    "*": {"read_only": ["ping"]},
}})


@pytest.mark.parametrize(("target", "label", "chosen"), [
    ("npx @modelcontextprotocol/server-filesystem /srv/a", None, "files"),
    ("npx  '@modelcontextprotocol/server-filesystem'  /srv/a", None, "files"),  # same argv
    ("npx @modelcontextprotocol/server-filesystem /srv/b", None, "*"),  # another root
    ("https://mcp.example.com/mcp", None, "remote"),
    ("https://u:tok@mcp.example.com/mcp?session=1", None, "remote"),  # same server
    ("https://mcp.example.com/other", None, "*"),
    ("http://mcp.example.com/mcp", None, "*"),
    ("python impostor.py", None, "*"),  # whatever name it reports
    ("python impostor.py", "secure-filesystem-server", "secure-filesystem-server"),
])
def test_the_rule_is_the_entry_naming_this_upstream_never_its_claimed_name(
        target: str, label: str | None, chosen: str) -> None:
    choice = choose_rule(BOUND, UpstreamIdentity.of(target), label)
    assert choice.rule is not None and choice.rule.name == chosen, choice
    assert any("secure-filesystem-server" in w and "--upstream-name" in w
               for w in choice.warnings) is (label is None)


def test_a_rule_bound_to_another_upstream_cannot_be_named_onto_this_one() -> None:
    with pytest.raises(eg.PolicyError, match="not this gateway's upstream"):
        choose_rule(BOUND, UpstreamIdentity.of("python impostor.py"), "files")
    twice = eg.Policy.from_dict({"upstreams": {"a": {"command": "srv x"},
                                               "b": {"command": "srv  x"}}})
    with pytest.raises(eg.PolicyError, match="all name this upstream"):
        choose_rule(twice, UpstreamIdentity.of("srv x"))
    assert choose_rule(eg.Policy.from_dict({"upstreams": {"u": {}}}),
                       UpstreamIdentity.of("srv")).rule is None
    assert choose_rule(None, UpstreamIdentity.of("srv")).rule is None


def test_the_key_scope_is_the_configured_upstream() -> None:
    """One scope for one command line (however it is quoted) or one server URL; another for
    another root, another server or another transport."""
    scope = UpstreamIdentity.of("srv --root /a").key_scope
    assert scope.startswith("mcp-") and len(scope) == 16
    assert UpstreamIdentity.of(" srv  '--root' /a ").key_scope == scope
    assert UpstreamIdentity.of("srv --root /b").key_scope != scope
    url = UpstreamIdentity.of("https://h.example/mcp").key_scope
    assert UpstreamIdentity.of("https://u:p@H.example:443/mcp?t=1#f").key_scope == url
    assert len({url, scope, UpstreamIdentity.of("http://h.example/mcp").key_scope}) == 3
    for bad in ("", "'x"):
        with pytest.raises(eg.ConfigError):
            UpstreamIdentity.of(bad)


def test_init_binds_its_rule_to_the_upstream_it_listed() -> None:
    text = render_policy([tool("peek", read=True)], server="srv",
                         upstream="https://u:tok@h.example/mcp?key=s")
    (rule,) = eg.Policy.from_dict(tomllib.loads(text)).upstreams.values()
    assert rule.url == "https://h.example/mcp" and "tok" not in text and "key=s" not in text
    text = render_policy([tool("peek", read=True)], server="srv", upstream='srv "a b" /x')
    (rule,) = eg.Policy.from_dict(tomllib.loads(text)).upstreams.values()
    assert rule.command == 'srv "a b" /x'
    assert UpstreamIdentity.of('srv "a b" /x').names(rule)


CARD = "4242-4242-CARD"


@pytest.mark.parametrize("text", [
    json.dumps({"id": "ch_1", "card": CARD}, indent=2),  # the JSON beside structured content
    f"charged {CARD}",  # free text: replaced by the redacted structure
    CARD.replace("-", ""),  # a bare JSON number is no structure
])
def test_a_stored_mcp_result_holds_no_redacted_field(text: str) -> None:
    result = {"content": [{"type": "text", "text": text},
                          {"type": "resource", "resource": {
                              "uri": "x:/1", "text": json.dumps({"card": CARD})}},
                          {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
              "structuredContent": {"id": "ch_1", "card": CARD.replace("-", "")
                                    if text.isdigit() else CARD},
              "_meta": {"card": CARD}, "isError": False}
    stored = stored_result(result, ["card"])
    assert CARD not in json.dumps(stored) and CARD.replace("-", "") not in json.dumps(stored)
    assert stored["structuredContent"] == {"id": "ch_1", "card": "[redacted]"}
    assert json.loads(stored["content"][0]["text"])["card"] == "[redacted]"
    assert stored["content"][2] == result["content"][2] and stored["isError"] is False
    types.CallToolResult.model_validate(stored)  # still a result a repeat can return


def test_redacting_a_field_named_like_the_envelope_keeps_the_result_whole() -> None:
    result = {"content": [{"type": "text", "text": json.dumps({"type": "card", "text": "x"})}],
              "structuredContent": {"type": "card", "text": "x"}}
    stored = stored_result(result, ["type", "text"])
    assert stored["content"][0]["type"] == "text"
    assert json.loads(stored["content"][0]["text"]) == {"type": "[redacted]",
                                                        "text": "[redacted]"}
    types.CallToolResult.model_validate(stored)
