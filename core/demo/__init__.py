"""The demo's scenario as a library: an agent with a refund tool and a trip-booking saga, a
fake payments vendor that counts every call that reaches it, and an operator — played twice,
without the gate and with it.

Five scenes, offline, on any store: a retried refund, a lost reply, a large refund that
needs a human, an overspend, and a half-booked trip. :func:`run_demo` calls ``show`` with each
:class:`Line` as it happens and returns a :class:`DemoReport` (a :class:`Tally` per scene and
pass); it prints nothing itself (``effectgate demo`` renders the lines). Nothing in it depends
on the date or on randomness, except the store's own vendor-key secret, which is never shown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..context import effect_context
from ..gate import Gate
from .agents import Answer, PlainAgent, register_undo
from .scenes import SCENES, Line, Pass, Tally, demo_policy
from .vendor import DOLLAR, FakeVendor, VendorCall, VendorTimeout, money

__all__ = ["DOLLAR", "SCENES", "Answer", "DemoReport", "FakeVendor", "Line", "PlainAgent",
           "SceneResult", "Tally", "VendorCall", "VendorTimeout", "demo_policy", "make_agent",
           "money", "register_undo", "run_demo"]


@dataclass
class SceneResult:
    """One scene's tallies: ``without`` the gate and ``with_gate``."""

    title: str
    without: Tally
    with_gate: Tally


@dataclass
class DemoReport:
    """Both passes: per scene and in total."""

    agent: str
    scenes: list[SceneResult] = field(default_factory=list)

    def total(self, which: str) -> Tally:
        """The sum over scenes of ``"without"`` or ``"with_gate"``."""
        out = Tally()
        for scene in self.scenes:
            out.add(getattr(scene, which))
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {
            "agent": self.agent,
            "scenes": [{"title": s.title, "without": s.without.as_dict(),
                        "with": s.with_gate.as_dict()} for s in self.scenes],
            "without": self.total("without").as_dict(),
            "with": self.total("with_gate").as_dict(),
        }


def make_agent(kind: str, vendor: FakeVendor, gate: Gate | None) -> Any:
    """The LangChain agent where asked for (``auto``: when it can be imported), else the plain
    tool loop; with ``gate`` its tools are gated."""
    if kind in ("auto", "langchain"):
        try:
            module = importlib.import_module("effectgate.demo.langchain")
        except ImportError:
            if kind == "langchain":
                raise
        else:
            return module.LangChainAgent(vendor, gate)
    return PlainAgent(vendor, gate)


def run_demo(gate: Gate, show: Callable[[Line], None], *, agent: str = "auto") -> DemoReport:
    """Play the five scenes without the gate and then with ``gate`` (which must carry
    :func:`demo_policy`); ``agent`` is ``"auto"`` (LangChain when installed), ``"langchain"``
    or ``"plain"``."""
    if agent == "decorator":
        agent = "plain"
    plain_vendor, gated_vendor = FakeVendor(), FakeVendor()
    without = Pass("without the gate", make_agent(agent, plain_vendor, None), plain_vendor,
                   None, show)
    with_gate = Pass("with the gate", make_agent(agent, gated_vendor, gate), gated_vendor,
                     gate, show)
    report = DemoReport(agent=with_gate.agent.name)
    for title, setting, play in SCENES:
        show(Line("scene", f"{title}: {setting}"))
        results = []
        for p in (without, with_gate):
            show(Line("pass", p.label))
            p.tally = type(p.tally)()
            if p.gate is None:
                play(p)
            else:
                with effect_context(run_id="demo-run", agent_id="support-agent"):
                    play(p)
            results.append(p.tally)
        report.scenes.append(SceneResult(title, results[0], results[1]))
    return report
