"""Every notebook in ``notebooks/`` runs top to bottom, offline, in a fresh kernel; records and
decisions render as HTML, and the governance timeline renders as a picture. A framework
notebook whose extra is missing says so in its first code cell and skips the rest cleanly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FRAMEWORKS = {"langchain": ("langchain", "langchain"), "openai_agents": ("agents", "openai-agents"),
              "llama_index": ("llama_index", "llama-index")}
OFFLINE = """
import os, socket
def _offline(*args, **kwargs):
    raise RuntimeError("network access attempted")
socket.create_connection = _offline
_connect = socket.socket.connect
def _local_only(self, address):
    local = ("127.0.0.1", "localhost", "::1")
    if self.family == socket.AF_UNIX or (isinstance(address, tuple) and address[0] in local):
        return _connect(self, address)
    _offline()
socket.socket.connect = _local_only
os.environ.pop("OPENAI_API_KEY", None)
os.environ["LANGSMITH_TRACING"] = "false"
"""
BLOCK = """
import sys
sys.modules[{name!r}] = None  # as if not installed: find_spec gives None, import fails
"""


def outputs(nb: Any, kind: str) -> list[Any]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if kind in o.get("data", {})]


def execute(path: Path, tmp_path: Path, *prelude: str) -> Any:
    nb = nbformat.read(path, as_version=4)
    for n, source in enumerate((OFFLINE, *prelude)):
        nb.cells.insert(n, nbformat.v4.new_code_cell(source))
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    return nb


def test_there_is_a_notebook_per_framework_and_for_governance() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "governance", *FRAMEWORKS} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_offline_top_to_bottom(path: Path, tmp_path: Path) -> None:
    nb = execute(path, tmp_path)
    assert outputs(nb, "text/html"), "no record or decision rendered as HTML"
    if path.stem == "governance":
        assert outputs(nb, "image/png"), "the timeline did not render"
        text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                       for o in c.get("outputs", []))
        assert "refunds that reached the vendor: 6 without the gate, 3 with it" in text


def test_each_notebook_names_what_to_install_first() -> None:
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "markdown"
        extra = FRAMEWORKS.get(path.stem, (None, None))[1]
        wanted = f'pip install ".[notebooks,{extra}]"' if extra else 'pip install ".[notebooks]"'
        assert wanted in first.source, path.name


@pytest.mark.parametrize("stem", sorted(FRAMEWORKS))
def test_a_framework_notebook_without_its_extra_skips_with_a_clear_message(
        stem: str, tmp_path: Path) -> None:
    module, extra = FRAMEWORKS[stem]
    nb = execute(ROOT / "notebooks" / f"{stem}.ipynb", tmp_path, BLOCK.format(name=module))
    code = [c for c in nb.cells if c.cell_type == "code"][2:]  # after the two preludes
    said = "".join(o.get("text", "") for o in code[0].get("outputs", []))
    assert said.startswith("Skipped:") and f'pip install ".[notebooks,{extra}]"' in said
    assert all(not c.get("outputs") for c in code[1:]), "a cell ran after the skip"


def test_the_notebooks_extra_brings_a_jupyter_front_end_and_the_kernel() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for dep in extras["notebooks"]}
    assert {"matplotlib", "ipykernel", "nbclient", "nbformat"} <= names
    assert names & {"jupyterlab", "notebook"}


RUNNER = """
import sys
from pathlib import Path
import nbclient, nbformat
for name in sys.argv[2:]:
    nb = nbformat.read(name, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": sys.argv[1]}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    print(Path(name).stem, "SKIPPED" if "Skipped:" in text else "RAN")
"""


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_every_notebook_runs_from_the_notebooks_extra_alone(tmp_path: Path) -> None:
    """A fresh virtual environment with only ``pip install ".[notebooks]"``: quickstart and
    governance run through, each framework notebook skips with its message."""
    import subprocess
    import sys
    import venv

    # No pip of its own: this run's pip installs into it (``--python``), which skips
    # ensurepip (about 5 of this test's 40 seconds); the notebooks never call pip.
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    # --no-compile: what is installed is the same; only the modules the notebooks import are
    # compiled (when imported), not all of Jupyter's (about 10 of this test's 40 seconds)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "-q", "--no-compile", f"{ROOT}[notebooks]"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    (tmp_path / "work").mkdir()
    run = subprocess.run([str(python), "-c", RUNNER, str(tmp_path / "work"),
                          *(str(p) for p in NOTEBOOKS)], capture_output=True, text=True,
                         timeout=900, cwd=tmp_path / "work")
    assert run.returncode == 0, run.stderr[-3000:]
    said = dict(line.split() for line in run.stdout.splitlines())
    assert said["quickstart"] == said["governance"] == "RAN"
    for stem in FRAMEWORKS:
        assert said[stem] == "SKIPPED", stem
