"""Key template filters (``{content|sha256}``, ``{path|path}``, your own): parsed with the
template, so an unknown filter fails at declaration; the same keys through the decorator, every
framework adapter and a policy, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.keys import KeyTemplate, filter_names, register_filter

BIG = "x" * 10_000 + "é"
WRITE = "write:{path|path}:{content|sha256}"


def test_sha256_and_path_render_a_short_key_for_a_large_write() -> None:
    """A 10 KB content becomes its 64-character digest (of the exact UTF-8 bytes); four
    spellings of one path are one key."""
    t = KeyTemplate(WRITE)
    digest = hashlib.sha256(BIG.encode("utf-8")).hexdigest()
    keys = {t.render({"path": p, "content": BIG})
            for p in ("fs/a.txt", "fs/./a.txt", "fs//a.txt", "./fs/./a.txt")}
    assert keys == {f"write:fs/a.txt:{digest}"}
    assert t.roots == {"path", "content"} and t.fields == ("path", "content")
    assert KeyTemplate("{p|path}").render({"p": "//srv//x/"}) == "/srv/x/"
    # Unnormalised content is other content: NFC and NFD "é" differ, and so do their keys.
    assert KeyTemplate("{c|sha256}").render({"c": "e\u0301"}) != (
        KeyTemplate("{c|sha256}").render({"c": "\u00e9"}))


def test_filters_chain_then_format_and_digest_containers_canonically() -> None:
    assert KeyTemplate("{c|sha256:.12}").render({"c": {"b": 1, "a": [1, 2]}}) == (
        hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()[:12])
    assert KeyTemplate("{c|sha256}").render({"c": b"\x00\x01"}) == (
        hashlib.sha256(b"\x00\x01").hexdigest())
    assert KeyTemplate("mail:{to|strip|lower}").render({"to": " Al@X.COM "}) == "mail:al@x.com"
    assert KeyTemplate("{p|path|sha256}").render({"p": "a/./b"}) == (
        hashlib.sha256(b"a/b").hexdigest())
    assert {"lower", "path", "sha256", "strip"} <= set(filter_names())


@pytest.mark.parametrize("template", ["{c|nope}", "{c|}", "{c|SHA256}", "{|sha256}",
                                      "{c|sha256|}", "x:{c|sha-256}"])
def test_an_unknown_or_empty_filter_fails_when_the_template_is_parsed(template: str) -> None:
    with pytest.raises(eg.EffectKeyError):
        KeyTemplate(template)


@pytest.mark.parametrize(("template", "value"), [
    ("{c|sha256}", None), ("{c|sha256}", True), ("{c|sha256}", "\ud800"),
    ("{c|path}", 3), ("{c|path}", "  "), ("{c|lower}", 5), ("{c|strip}", "   "),
])
def test_a_value_a_filter_refuses_is_an_effect_key_error(template: str, value: Any) -> None:
    with pytest.raises(eg.EffectKeyError):
        KeyTemplate(template).render({"c": value})


def test_normalise_gives_the_payload_the_normalised_spelling() -> None:
    """What the payload hash sees: normalising filters applied to the argument itself (so two
    spellings are one payload), a digest never (the payload keeps the content)."""
    t = KeyTemplate("w:{path|path}:{content|sha256}:{to|strip|lower}:{p2|path|sha256}")
    args = {"path": "a/./b", "content": "X", "to": " Al ", "p2": "c//d", "n": 1}
    assert t.normalise(args) == {"path": "a/b", "content": "X", "to": "al", "p2": "c/d", "n": 1}
    assert args["path"] == "a/./b"  # not changed in place
    plain = {"a": 1}
    assert KeyTemplate("{a}").normalise(plain) is plain
    assert KeyTemplate("{o.id|lower}").normalise({"o": plain}) == {"o": plain}
    with pytest.raises(eg.EffectKeyError):
        t.normalise({**args, "path": 5})


def test_register_filter_adds_one_and_refuses_bad_names_and_silent_replacement() -> None:
    register_filter("tenant_path", lambda v: "t1/" + str(v).lstrip("/"))
    assert KeyTemplate("{p|tenant_path|path}").render({"p": "/a/./b"}) == "t1/a/b"
    for name, func in (("Bad", str), ("a-b", str), (3, str), ("", str), ("ok", 5)):
        with pytest.raises(eg.ConfigError):
            register_filter(name, func)  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError, match="replace=True"):
        register_filter("sha256", str)
    assert len(KeyTemplate("{c|sha256}").render({"c": "a"})) == 64  # unchanged

    def boom(value: Any) -> str:
        raise RuntimeError("no")

    register_filter("boom_filter", boom)
    with pytest.raises(eg.EffectKeyError, match="boom_filter"):
        KeyTemplate("{c|boom_filter}").render({"c": "a"})


def test_the_decorator_gates_a_large_write_once(gate: eg.Gate) -> None:
    """The decorator keys on the digest: the same 10 KB write under another spelling of its
    path runs once; an unknown filter fails at decoration, before anything runs."""
    ran: list[str] = []

    @gate.effect(WRITE, effect_type="fs.write")
    def write_file(path: str, content: str) -> str:
        ran.append(path)
        return f"wrote {len(content)}"

    assert write_file("fs/./a.txt", BIG) == write_file("fs/./a.txt", BIG) == "wrote 10001"
    with contextlib.suppress(eg.PayloadMismatch):  # one key; the payload is the kernel's call
        write_file("fs/a.txt", BIG)
    assert ran == ["fs/./a.txt"]
    assert gate.get(f"write:fs/a.txt:{hashlib.sha256(BIG.encode()).hexdigest()}").attempt == 1
    with pytest.raises(eg.EffectKeyError):
        gate.effect("write:{path|nope}", effect_type="fs.write")(write_file.__wrapped__)


def test_a_policy_with_an_unknown_filter_fails_at_load() -> None:
    with pytest.raises(eg.PolicyError, match="nope"):
        eg.Policy.from_dict({"effects": {"fs.write": {"key": "w:{path|nope}",
                                                      "tools": ["write_file"]}}})
    rule = eg.Policy.from_dict({"effects": {"fs.write": {"key": WRITE,
                                                         "tools": ["write_file"]}}})
    assert rule.tool_effects()["write_file"].key == WRITE


def test_langchain_gate_tool_uses_the_filters(gate: eg.Gate) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.tools import tool

    from effectgate.integrations.langchain import gate_tool

    ran: list[str] = []

    @tool
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        ran.append(path)
        return "ok"

    gated = gate_tool(write_file, WRITE, gate=gate, effect_type="fs.write")
    for path in ("fs/./a.txt", "fs/./a.txt", "fs/a.txt"):
        gated.invoke({"path": path, "content": BIG})
    assert ran == ["fs/./a.txt"]
    with pytest.raises(eg.EffectKeyError):
        gate_tool(write_file, "w:{path|nope}", gate=gate)


def test_openai_agents_gate_tool_uses_the_filters(gate: eg.Gate) -> None:
    pytest.importorskip("agents")
    from agents import function_tool
    from agents.tool_context import ToolContext

    from effectgate.integrations.openai_agents import gate_tool

    ran: list[str] = []

    @function_tool
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        ran.append(path)
        return "ok"

    gated = gate_tool(write_file, WRITE, gate=gate, effect_type="fs.write")

    async def call(path: str) -> Any:
        text = json.dumps({"path": path, "content": BIG})
        ctx = ToolContext(context=None, tool_name="write_file", tool_call_id="c",
                          tool_arguments=text)
        return await gated.on_invoke_tool(ctx, text)

    assert [asyncio.run(call(p)) for p in ("fs/./a.txt", "fs/./a.txt")] == ["ok", "ok"]
    asyncio.run(call("fs/a.txt"))
    assert ran == ["fs/./a.txt"]
    with pytest.raises(eg.EffectKeyError):
        gate_tool(write_file, "w:{path|nope}", gate=gate)


def test_llama_index_gate_tool_uses_the_filters(gate: eg.Gate) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.tools import FunctionTool

    from effectgate.integrations.llama_index import gate_tool

    ran: list[str] = []

    def write_file(path: str, content: str) -> str:
        """Write a file."""
        ran.append(path)
        return "ok"

    gated = gate_tool(FunctionTool.from_defaults(fn=write_file), WRITE, gate=gate,
                      effect_type="fs.write")
    outs = [gated.call(path=p, content=BIG) for p in ("fs/./a.txt", "fs/./a.txt", "fs/a.txt")]
    assert [str(o) for o in outs[:2]] == ["ok", "ok"]
    assert ran == ["fs/./a.txt"]
    with pytest.raises(eg.EffectKeyError):
        gate_tool(FunctionTool.from_defaults(fn=write_file), "w:{path|nope}", gate=gate)


def test_path_merges_only_spellings_that_name_one_file_whatever_the_links() -> None:
    """``.`` and repeated ``/`` go; ``..`` stays (``b/../a`` is ``a`` only if ``b`` is not a
    symlink, which a key cannot know), and so does a trailing ``/`` (on a symlink to a
    directory it means the directory, not the link)."""
    path = KeyTemplate("{p|path}")
    for raw, normal in [("fs/./a.txt", "fs/a.txt"), ("fs//a.txt", "fs/a.txt"),
                        ("./fs/a.txt", "fs/a.txt"), ("fs/b/../a.txt", "fs/b/../a.txt"),
                        ("../a", "../a"), ("fs/..", "fs/.."), ("/../a", "/a"),
                        ("fs/a/", "fs/a/"), ("fs/a/.", "fs/a/"), ("fs/a//", "fs/a/"),
                        ("//srv//x/", "/srv/x/"), (".", "."), ("./", "."), ("/", "/"),
                        ("/./", "/"), ("a/./../b", "a/../b")]:
        assert path.render({"p": raw}) == normal, raw
        assert path.normalise({"p": raw}) == {"p": normal}, raw


def test_the_decorator_never_merges_two_files_behind_a_symlink(gate: eg.Gate,
                                                               tmp_path: Path) -> None:
    """``link`` points two levels down, so ``link/../a.txt`` is ``real/a.txt``, not ``a.txt``:
    the two writes are two effects, each runs once, each file is written; the body gets the
    caller's spelling, which names the file the key names."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub", target_is_directory=True)
    ran: list[str] = []

    @gate.effect("touch:{path|path}", effect_type="fs.touch")
    def touch(path: str) -> str:
        ran.append(path)
        with open(path, "a", encoding="utf-8") as out:
            out.write("x")
        return path

    behind, direct = f"{tmp_path}/link/../a.txt", f"{tmp_path}/a.txt"
    assert [touch(behind), touch(direct), touch(behind), touch(f"{tmp_path}/./a.txt")] == [
        behind, direct, behind, direct]
    assert ran == [behind, direct]
    assert (tmp_path / "real" / "a.txt").read_text() == "x"
    assert (tmp_path / "a.txt").read_text() == "x"
    assert gate.get(f"touch:{behind}").state is eg.State.COMMITTED


def test_lower_is_str_lower_and_casefold_is_its_own_filter(gate: eg.Gate) -> None:
    """``lower`` is :meth:`str.lower` (``ß`` stays ``ß``: ``Straße`` and ``STRASSE`` are two
    effects); caseless matching is ``casefold``, named for what it does (one effect)."""
    assert KeyTemplate("{s|lower}").render({"s": "Straße"}) == "straße"
    assert KeyTemplate("{s|casefold}").render({"s": "Straße"}) == "strasse"
    assert KeyTemplate("{s|lower}").normalise({"s": "STRASSE"}) == {"s": "strasse"}
    assert KeyTemplate("{s|casefold}").normalise({"s": "Straße"}) == {"s": "strasse"}
    ran: list[str] = []

    @gate.effect("mail:{to|lower}", effect_type="mail.send")
    def send(to: str) -> str:
        ran.append(to)
        return to

    @gate.effect("caseless:{to|casefold}", effect_type="mail.caseless")
    def send_caseless(to: str) -> str:
        ran.append(to)
        return to

    assert send("Straße@x.de") == "Straße@x.de"
    assert send("STRASSE@x.de") == "STRASSE@x.de"  # another address: it runs
    assert gate.get("mail:straße@x.de").state is eg.State.COMMITTED
    assert gate.get("mail:strasse@x.de").state is eg.State.COMMITTED
    assert send_caseless("Straße@x.de") == "Straße@x.de"
    assert send_caseless("STRASSE@x.de") == "Straße@x.de"  # one address: the stored result
    assert ran == ["Straße@x.de", "STRASSE@x.de", "Straße@x.de"]
