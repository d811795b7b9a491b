"""The model checker drives the real begin flow (issue 24/26): a bug placed in
``effectgate/flow.py`` — not in ``decide`` — is found by the exhaustive exploration, with a short
readable trace. Each mutation is a patched copy of the flow module's source (one line changed),
put in place of :func:`effectgate.flow.begin_steps` for the exploration only."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import effectgate.flow
from effectgate.verify.explore import BOUNDS, explore

_SOURCE = Path(effectgate.flow.__file__).read_text(encoding="utf-8")
_LOST = BOUNDS["2-worker"][0]  # 2 workers, one namespace, lost replies (and the clock)

MUTATIONS: dict[str, tuple[str, str, str]] = {
    "adopt-any-row": (
        "if row is not None and secret.issued and decide.adopts_lost_reservation(row, "
        "secret.hash):",
        "if row is not None:",
        "a lost reservation's reply: whatever row is there is taken as ours (no secret/token "
        "check)"),
    "read-is-insert": (
        "if row is not None and row.inserted:",
        "if row is not None and row.state is State.IN_FLIGHT:",
        "a reservation that read another holder's IN_FLIGHT row answers EXECUTE"),
    "no-lapse": (
        "row = (yield from _lapse(row)) or (yield Fetch(req.namespace, req.key))",
        "return _decision(parts, row, Decision.EXECUTE, secret=secret)",
        "the lapse step dropped: a lapsed lease is executed again, without a new attempt"),
}


def _mutant(old: str, new: str) -> types.ModuleType:
    assert _SOURCE.count(old) == 1, f"the flow no longer has the line {old!r}"
    spec = importlib.util.spec_from_loader("effectgate._mutant_flow", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "effectgate"
    sys.modules[spec.name] = module
    try:
        exec(compile(_SOURCE.replace(old, new), "<mutant flow.py>", "exec"), module.__dict__)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(params=sorted(MUTATIONS))
def mutated(request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    old, new, _ = MUTATIONS[request.param]
    monkeypatch.setattr(effectgate.flow, "begin_steps", _mutant(old, new).begin_steps)
    yield request.param


def test_a_mutation_in_the_flow_is_a_violation_with_a_short_trace(mutated: str) -> None:
    found = explore(_LOST)
    assert found.violation is not None, f"{mutated}: {MUTATIONS[mutated][2]} went unseen"
    trace = found.violation
    assert len(trace.actions) <= 12
    text = trace.format()
    assert "VIOLATED" in text and "calls begin" in text
    assert any(v.startswith(("EXCLUSIVE", "ONCE PER ATTEMPT", "EXECUTE ONLY", "LIVENESS"))
               for v in trace.violations), text


def test_the_unmutated_copy_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy itself changes nothing: the bound explores clean through it (the findings
    above are the mutations', not the copying's)."""
    monkeypatch.setattr(effectgate.flow, "begin_steps", _mutant(*_identity()).begin_steps)
    assert explore(_LOST).violation is None


def _identity() -> tuple[str, str]:
    line = MUTATIONS["read-is-insert"][0]
    return line, line
