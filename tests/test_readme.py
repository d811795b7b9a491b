"""The README's Python examples run, in order, in one namespace (like a reader pasting them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 5


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EFFECTGATE_URL", raising=False)
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, block in enumerate(BLOCKS, 1):
        try:
            exec(compile(block, f"README.md block {number}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message names the block
            raise AssertionError(f"README block {number} failed: {err!r}\n{block}") from err
