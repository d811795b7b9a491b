"""The README's Python examples: each block alone, in a fresh directory with no
``$EFFECTGATE_URL``, in a fresh interpreter, offline — and twice, as a reader pasting it again
would (a block that keeps a store in a file must say what its second run answers). The two
set-up commands are the ones ``.ci/run`` runs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
OFFLINE = ("import socket\n"
           "def _offline(*a, **k): raise RuntimeError('network access attempted')\n"
           "socket.socket.connect = _offline\nsocket.create_connection = _offline\n")
NEEDS = {"langchain_core": "langchain", "agents": "openai-agents", "llama_index": "llama-index",
         "dbos": "dbos", "temporalio": "temporal",
         "google.adk": "google-adk", "agent_framework": "agent-framework"}


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 10


def _needed_extra(block: str) -> str | None:
    for module, extra in NEEDS.items():
        if re.search(rf"^\s*(from|import) {module}\b", block, re.M) and (
                importlib.util.find_spec(module.split(".")[0]) is None
                or importlib.util.find_spec(module) is None):
            return extra
    return None


@pytest.mark.parametrize("number", range(1, len(BLOCKS) + 1))
def test_each_readme_block_runs_alone_twice_in_a_fresh_directory(
        number: int, tmp_path: Path) -> None:
    block = BLOCKS[number - 1]
    extra = _needed_extra(block)
    if extra:
        pytest.skip(f"README block {number} needs the {extra} extra")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTGATE_")}
    outputs = []
    for run in (1, 2):
        proc = subprocess.run([sys.executable, "-c", OFFLINE + block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"README block {number}, run {run}:\n{block}\n{proc.stderr}"
        outputs.append(proc.stdout)
    if "quickstart.db" in block:
        assert outputs == ["1 vendor call(s) in this run\n", "0 vendor call(s) in this run\n"]


def test_the_readme_tells_what_the_file_backed_example_answers_the_second_time() -> None:
    assert "The first run prints `1 vendor call(s)`; the second prints `0`" in TEXT


def test_ci_runs_the_readme_test_command_exactly() -> None:
    commands = re.findall(r"```bash\n(.*?)```", TEXT, re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()
    assert ci[-1] == test_command
    demo_command = next(c.strip() for c in commands if "effectgate demo" in c)
    assert demo_command == ("python3 -m venv .venv && .venv/bin/pip install . && "
                            ".venv/bin/effectgate demo")


def test_every_install_hint_in_the_readme_works_from_a_clone() -> None:
    assert 'pip install "effectgate[' not in TEXT
    import tomllib

    known = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    hints = re.findall(r'pip install (?:-e )?"?\.\[([a-z,\-]+)\]', TEXT)
    assert len(hints) >= 8
    for extra in hints:
        assert set(extra.split(",")) <= known, extra
