"""Where a gate finds its policy, without importing the policy machinery (pydantic) until a
file is found: ``$EFFECTGATE_POLICY``, else the nearest ``effectgate.toml`` — or
``pyproject.toml`` with a ``[tool.effectgate]`` table — walking up from the working directory,
as ruff and pytest find their configuration."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from .errors import PolicyError

__all__ = ["find_policy"]


def find_policy(start: str | Path | None = None) -> Path | None:
    """The policy file in force: ``$EFFECTGATE_POLICY``, else the nearest ``effectgate.toml``
    or ``pyproject.toml`` with a ``[tool.effectgate]`` table, walking up from ``start`` (the
    working directory). None when there is none."""
    named = os.environ.get("EFFECTGATE_POLICY")
    if named:
        path = Path(named)
        if not path.is_file():
            raise PolicyError(f"$EFFECTGATE_POLICY names {named!r}, which is not a file")
        return path
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "effectgate.toml"
        if candidate.is_file():
            return candidate
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            try:
                data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            if isinstance(data.get("tool"), dict) and "effectgate" in data["tool"]:
                return pyproject
    return None
