"""The timeline (``effectgate.viz``): deterministic from run to run, with duplicates and
refusals marked as events. Each picture is rendered and compared with the previous run's: the
committed reference data in ``tests/data/`` and the artists actually drawn (bars, colours,
markers), not pixels — fonts and matplotlib versions do not move it. Regenerate the reference
with ``EFFECTGATE_UPDATE_REFERENCE=1`` after a change you mean."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.demo import demo_policy, run_demo

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from effectgate.viz import EVENT_MARKERS, STATE_COLOURS, Recorder, timeline, timeline_data  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


def compare_with_reference(name: str, data: dict[str, Any]) -> None:
    path = DATA / f"{name}.json"
    if os.environ.get("EFFECTGATE_UPDATE_REFERENCE") == "1":
        path.write_text(json.dumps(data, indent=1) + "\n")
    reference = json.loads(path.read_text())
    assert data == reference, f"the {name} picture changed from the committed reference"


def check_drawing(data: dict[str, Any]) -> bytes:
    """Render ``data`` and check the drawn bars and markers are exactly the data."""
    from matplotlib.colors import to_hex

    ax = timeline(data, title="test")
    bars = [c for c in ax.collections if type(c).__name__ != "PathCollection"]
    marks = [c for c in ax.collections if type(c).__name__ == "PathCollection"]
    assert len(bars) == len(data["rows"])
    for collection, (_, row) in zip(bars, data["rows"], strict=True):
        colours = [to_hex(c) for c in collection.get_facecolors()]
        assert colours == [STATE_COLOURS[state] for _, _, state in row]
        assert len(collection.get_paths()) == len(row)
    drawn = sorted((round(float(x), 4), round(float(y)), to_hex(m.get_facecolors()[0]))
                   for m in marks for x, y in m.get_offsets())
    wanted = sorted((e[1], e[0], EVENT_MARKERS[e[2]][1]) for e in data["events"])
    assert drawn == wanted
    assert [t.get_text() for t in ax.get_yticklabels()] == [k for k, _ in data["rows"]]
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=60)
    matplotlib.pyplot.close(ax.figure)
    return buffer.getvalue()


def test_the_demo_timeline_is_the_same_every_run_on_both_backends(make_gate: Any) -> None:
    gate = make_gate(policy=demo_policy())
    recorder = Recorder(gate)
    run_demo(gate, show=recorder.line, agent="plain")
    data = timeline_data(recorder)
    compare_with_reference("timeline_demo", data)
    assert {e[2] for e in data["events"]} == {"duplicate", "blocked", "approval_required",
                                              "denied"}
    png = check_drawing(data)
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_recorder_call_marks_duplicates_and_refusals(gate: eg.Gate) -> None:
    calls = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str) -> str:
        calls.append(txn_id)
        if txn_id == "lost":
            raise TimeoutError("no reply")
        return "ok"

    rec = Recorder(gate)
    rec.call(refund, "t1", key="refund:t1")
    rec.call(refund, "t1", key="refund:t1")
    with pytest.raises(TimeoutError):
        rec.call(refund, "lost", key="refund:lost")
    with pytest.raises(eg.EffectAmbiguous):
        rec.call(refund, "lost", key="refund:lost")
    data = timeline_data(rec)
    assert calls == ["t1", "lost"]
    assert data["rows"] == [
        ["refund:t1", [[1.0, 0.5, "in_flight"], [1.5, 3.5, "committed"]]],
        ["refund:lost", [[3.0, 0.5, "in_flight"], [3.5, 1.5, "ambiguous"]]]]
    assert data["events"] == [[0, 2.5, "duplicate"], [1, 4.5, "blocked"]]
    compare_with_reference("timeline_calls", data)
    check_drawing(data)
