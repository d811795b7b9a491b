"""Integrations use effectgate's public names only: no private module, function or attribute
of the core (``gate._flow``, ``from effectgate.gate import _x``, ``getattr(gate, "_memo")``).
What is private is read from the core's source: every ``_name`` a core module defines at its
top level, in a class body, or assigns on ``self``."""

from __future__ import annotations

import ast
from pathlib import Path

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
# Private names of the frameworks the adapters wrap that happen to be spelled like one of the
# core's (the adapter reads the framework's attribute, never effectgate's).
FRAMEWORK_NAMES = frozenset({"_run", "_arun", "_replace", "_validate", "_call_tool"})


def _core_private_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(source: str, private: set[str],
                 package: str = "effectgate.integrations") -> list[tuple[int, str]]:
    """Where ``source`` (a module of ``package``) reaches for one of the core's private
    names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module.startswith("effectgate") and not module.startswith(
                    "effectgate.integrations"):
                found += [(node.lineno, f"import {a.name}") for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
                found += [(node.lineno, f"module {module}") for part in module.split(".")
                          if part.startswith("_") and not part.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr in private and (
                node.attr not in FRAMEWORK_NAMES):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in private and node.args[1].value not in FRAMEWORK_NAMES):
            found.append((node.lineno, f"getattr {node.args[1].value}"))
    return found


def _package(path: Path) -> str:
    parts = path.relative_to(ROOT / "integrations").parts[:-1]
    return ".".join(("effectgate", "integrations", *parts))


def test_integrations_reach_for_no_private_name_of_the_core() -> None:
    """Every module under ``integrations/`` uses only the core's public names."""
    private = _core_private_names()
    assert {"_flow", "_memo", "_webhooks", "_checked_request"} <= private
    bad = [f"{path.relative_to(ROOT)}:{line} {what}"
           for path in sorted((ROOT / "integrations").rglob("*.py"))
           for line, what in private_uses(path.read_text(encoding="utf-8"), private,
                                          _package(path))]
    assert bad == []


def test_the_scan_finds_private_access() -> None:
    """The scanner itself: each way of reaching into the core is caught."""
    private = {"_flow", "_webhooks", "_loads"}
    source = "\n".join([
        "from effectgate.translate import _loads",
        "from effectgate._private import thing",
        "from .._kernel import fine",  # integrations' own kernel
        "from ... import _secret",  # above integrations/: the core
        "x = gate._flow",
        "y = getattr(gate, '_webhooks', None)",
        "z = self._flow",  # an object's own attribute: not the core's
    ])
    uses = private_uses(source, private, "effectgate.integrations.mcp")
    assert sorted(what for _, what in uses) == sorted([
        "import _loads", "module effectgate._private", "import _secret", "._flow",
        "getattr _webhooks"])
