"""A picture of a run: one row per effect, one bar per state it passed through, and a marker
for each answer that left no trace in the store — a duplicate answered with the stored result,
a refusal (blocked, waiting for approval, denied, in flight). Needs matplotlib
(``pip install ".[notebooks]"`` in the effectgate clone)::

    from effectgate.viz import Recorder, timeline

    rec = Recorder(gate)
    rec.call(refund, "txn_1", 2500, key="refund:txn_1")   # runs it, notes what it came to
    rec.call(refund, "txn_1", 2500, key="refund:txn_1")   # a duplicate: a marker, no bar
    timeline(rec)

The x axis is the recorder's own steps (one per call or observation), so the same notebook
draws the same picture every run: the store's clock is not used to order anything (two
transitions in the same millisecond would otherwise swap places from run to run).
:func:`timeline_data` is the picture as plain data, for comparing two runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import EffectRefused, UnknownEffect

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["EVENT_MARKERS", "STATE_COLOURS", "Event", "Recorder", "timeline", "timeline_data"]

STATE_COLOURS: dict[str, str] = {
    "in_flight": "#4c9be8",
    "committed": "#2e9e5b",
    "failed": "#9aa0a6",
    "ambiguous": "#d6336c",
    "pending_approval": "#f0ad1f",
    "denied": "#7b3fa0",
}
# decision -> (matplotlib marker, colour, legend label)
EVENT_MARKERS: dict[str, tuple[str, str, str]] = {
    "duplicate": ("D", "#145a32", "duplicate: the stored result"),
    "blocked": ("X", "#8e0038", "blocked: outcome unknown"),
    "approval_required": ("s", "#b36b00", "refused: needs approval"),
    "denied": ("P", "#4a235a", "refused: denied"),
    "in_flight": (">", "#1f5f99", "refused: in flight"),
}


@dataclass(frozen=True, slots=True)
class Event:
    """An answer at ``step`` for ``key`` that wrote nothing: a duplicate or a refusal."""

    step: int
    key: str
    decision: str


@dataclass
class Recorder:
    """Notes, step by step, what each call came to and which transitions the store made.

    :meth:`observe` after anything that touches a key (the recorder reads that key's history
    and files its new transitions under the current step); :meth:`call` runs a gated function
    and observes it; :meth:`line` takes the lines of :func:`effectgate.demo.run_demo`.
    """

    gate: Gate
    step: int = 0
    transitions: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    _seen: dict[str, int] = field(default_factory=dict)

    def observe(self, key: str, decision: str | None = None) -> None:
        """One step: ``key``'s new transitions, and ``decision`` as an event when it wrote
        nothing (duplicate, blocked, approval_required, denied, in_flight)."""
        self.step += 1
        try:
            history = self.gate.get(key).history
        except UnknownEffect:
            history = ()
        rows = self.transitions.setdefault(key, [])
        for entry in history[self._seen.get(key, 0):]:
            rows.append((self.step, entry.to_state.value))
        self._seen[key] = len(history)
        if decision in EVENT_MARKERS:
            self.events.append(Event(self.step, key, str(decision)))

    def call(self, fn: Callable[..., Any], *args: Any, key: str, **kwargs: Any) -> Any:
        """Call the gated ``fn`` and observe ``key``: a call that wrote no transition and
        raised nothing was a duplicate; a refusal is noted with its decision (and re-raised)."""
        before = len(self.gate.get(key).history) if self._exists(key) else 0
        try:
            result = fn(*args, **kwargs)
        except EffectRefused as refused:
            self.observe(key, refused.decision)
            raise
        except BaseException:
            self.observe(key)
            raise
        after = len(self.gate.get(key).history) if self._exists(key) else 0
        self.observe(key, "duplicate" if after == before else None)
        return result

    def line(self, line: Any) -> None:
        """Observe a line of :func:`effectgate.demo.run_demo` (those that name a key)."""
        key = getattr(line, "key", None)
        if key:
            self.observe(key, getattr(line, "decision", None))

    def _exists(self, key: str) -> bool:
        try:
            self.gate.get(key)
        except UnknownEffect:
            return False
        return True


def timeline_data(recorder: Recorder) -> dict[str, Any]:
    """The picture as plain data: ``rows`` (key, then ``[start, width, state]`` bars) in the
    order effects first appeared, and ``events`` (``[row, x, decision]``)."""
    order = sorted((bars[0][0], key) for key, bars in recorder.transitions.items() if bars)
    end = recorder.step + 1
    rows = []
    index = {}
    for n, (_, key) in enumerate(order):
        bars = recorder.transitions[key]
        starts = []
        for i, (step, _) in enumerate(bars):  # k transitions in one step: k slices of it
            same = [j for j, b in enumerate(bars) if b[0] == step]
            starts.append(step + same.index(i) / len(same))
        stops = [*starts[1:], float(end)]
        drawn = [[round(a, 4), round(b - a, 4), state]
                 for a, b, (_, state) in zip(starts, stops, bars, strict=True)]
        rows.append([key, drawn])
        index[key] = n
    events = [[index[e.key], e.step + 0.5, e.decision] for e in recorder.events
              if e.key in index]
    return {"steps": recorder.step, "rows": rows, "events": events}


def timeline(source: Recorder | dict[str, Any], *, ax: Any = None,
             title: str | None = None) -> Any:
    """Draw a :class:`Recorder` (or its :func:`timeline_data`): bars coloured by state, a
    marker for each duplicate or refusal. Returns the matplotlib ``Axes``."""
    try:
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError('the timeline needs matplotlib: pip install ".[notebooks]" in the '
                          "effectgate clone") from err
    data = source if isinstance(source, dict) else timeline_data(source)
    rows, events = data["rows"], data["events"]
    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 0.42 * max(len(rows), 2) + 1.4))
    for y, (_, bars) in enumerate(rows):
        ax.broken_barh([(s, w) for s, w, _ in bars], (y - 0.35, 0.7),
                       facecolors=[STATE_COLOURS.get(st, "#cccccc") for _, _, st in bars],
                       edgecolor="white", linewidth=1)
    for decision, (marker, colour, _) in EVENT_MARKERS.items():
        points = [(x, y) for y, x, d in events if d == decision]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker,
                       s=70, color=colour, edgecolors="white", linewidths=0.8, zorder=3,
                       label=decision)
    ax.set_yticks(range(len(rows)), [key for key, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0.5, data["steps"] + 1.5)
    ax.set_xlabel("steps of the run, in order")
    ax.set_xticks([])
    ax.spines[["top", "right"]].set_visible(False)
    states = {st for _, bars in rows for _, _, st in bars}
    kinds = {d for _, _, d in events}
    handles: list[Any] = [Patch(color=c, label=s.upper()) for s, c in STATE_COLOURS.items()
                          if s in states]
    handles += [Line2D([], [], linestyle="", marker=m, color=c, label=label)
                for d, (m, c, label) in EVENT_MARKERS.items() if d in kinds]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title, loc="left")
    ax.figure.tight_layout()
    return ax
