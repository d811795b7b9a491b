"""A picture of a run: one row per effect, one bar per state it passed through, coloured by
state — retries, lapsed leases, approvals and compensations at a glance. Needs matplotlib
(``pip install "effectgate[notebooks]"``)::

    from effectgate.viz import timeline

    timeline(gate, run_id="run_42")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from .records import EffectRecord, HistoryEntry

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["STATE_COLOURS", "segments", "timeline"]

STATE_COLOURS: dict[str, str] = {
    "in_flight": "#4c9be8",
    "committed": "#2e9e5b",
    "failed": "#9aa0a6",
    "ambiguous": "#d6336c",
    "pending_approval": "#f0ad1f",
    "denied": "#7b3fa0",
}


def segments(records: Iterable[EffectRecord], *, by: Literal["order", "time"] = "order"
             ) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """For each effect (oldest first): ``(key, [(start, length, state), ...])``.

    ``by="order"``: x is the rank of each transition among all of them (a run that takes
    milliseconds stays readable); ``by="time"``: seconds since the first transition."""
    rows = [(r.key, list(r.history)) for r in records if r.history]
    rows.sort(key=lambda kv: (kv[1][0].at, kv[0]))
    moments = sorted({h.at for _, hist in rows for h in hist})
    if not moments:
        return []
    rank = {m: float(i) for i, m in enumerate(moments)}
    origin = moments[0]

    def x(h: HistoryEntry) -> float:
        return rank[h.at] if by == "order" else (h.at - origin).total_seconds()

    end = (len(moments) if by == "order"
           else (moments[-1] - origin).total_seconds() * 1.05 or 1.0)
    out = []
    for key, hist in rows:
        bars = []
        for i, h in enumerate(hist):
            start = x(h)
            stop = x(hist[i + 1]) if i + 1 < len(hist) else end
            bars.append((start, max(stop - start, 0.15 if by == "order" else end * 0.01),
                         h.to_state.value))
        out.append((key, bars))
    return out


def timeline(source: Gate | Iterable[EffectRecord], *, run_id: str | None = None,
             group_key: str | None = None, by: Literal["order", "time"] = "order",
             ax: Any = None, limit: int = 60, title: str | None = None) -> Any:
    """Draw the effects of a gate (filtered by ``run_id`` / ``group_key``) or the given records
    as a timeline coloured by state; returns the matplotlib ``Axes``."""
    try:
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError('the timeline needs matplotlib: pip install "effectgate[notebooks]"'
                          ) from err
    records = _records(source, run_id, group_key, limit)
    rows = segments(records, by=by)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.42 * max(len(rows), 2) + 1.2))
    for y, (_, bars) in enumerate(rows):
        ax.broken_barh([(s, w) for s, w, _ in bars], (y - 0.35, 0.7),
                       facecolors=[STATE_COLOURS.get(st, "#cccccc") for _, _, st in bars],
                       edgecolor="white", linewidth=1)
    ax.set_yticks(range(len(rows)), [key for key, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("transitions, in order" if by == "order" else "seconds")
    if by == "order":
        ax.set_xticks([])
    ax.spines[["top", "right"]].set_visible(False)
    seen = {st for _, bars in rows for _, _, st in bars}
    ax.legend(handles=[Patch(color=c, label=s.replace("_", " ")) for s, c in STATE_COLOURS.items()
                       if s in seen], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title, loc="left")
    ax.figure.tight_layout()
    return ax


def _records(source: Gate | Iterable[EffectRecord], run_id: str | None,
             group_key: str | None, limit: int) -> list[EffectRecord]:
    if isinstance(source, EffectRecord):
        return [source]
    if hasattr(source, "list_effects"):
        gate: Any = source
        listed = gate.list_effects(run_id=run_id, group_key=group_key, limit=limit)
        return [gate.get(r.key) for r in listed]
    return list(source)
