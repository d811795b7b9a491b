"""Every notebook in ``notebooks/`` runs top to bottom, offline, in a fresh kernel; records and
decisions render as HTML, and the timeline renders as a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
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


def outputs(nb: Any, kind: str) -> list[Any]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if kind in o.get("data", {})]


def test_there_is_a_notebook_per_framework_and_for_governance() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "governance", "langchain", "openai_agents", "llama_index"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_offline_top_to_bottom(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(OFFLINE))
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert outputs(nb, "text/html"), "no record or decision rendered as HTML"
    if path.stem == "governance":
        assert outputs(nb, "image/png"), "the timeline did not render"
