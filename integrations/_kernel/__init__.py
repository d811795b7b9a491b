"""The adapter kernel: what every framework integration shares.

The core decides everything; an integration only translates between a framework's tool call
and the gate. What is common to all of them lives here, one module per concern:

* :mod:`.declarations` — one reader of effect declarations (a policy's tool rules, a mapping,
  ``EffectSpec`` s), also for the MCP gateway and the LangChain middleware;
* :mod:`.driver` — ``gate_tools`` written once, each framework passing its few functions, and
  the report of ungated tools;
* :mod:`.call` — one gated call (:class:`GatedCall`) and its answer (:class:`Refused`), with
  the one place an ``approval_required`` decision becomes the model's answer;
* :mod:`.review` — a framework's own pause for a human: what the reviewer is shown, what
  approve / edit / reject do in the store (an edit either approved by its reviewer or left
  pending), what a replayed call of a request an edit replaced is answered
  (:func:`~.review.replacement`), and what the store decided for a call a framework paused
  outside it (:func:`~.review.store_decision`). A new adapter with a pause uses these, never
  ``gate.approve`` / ``deny`` on its own: the rules (approval id and payload hash checked,
  single use, replays answered from the store) live there once;
* :mod:`.resume` — a pause answered only with a yes or no (Google ADK's confirmation, Agent
  Framework's approval response), decided against the store first;
* :mod:`.raising` — an effectgate error that is also a framework's stopping exception;
* :mod:`.twins` — identical calls in one turn share one execution;
* :mod:`.vocabulary` — every text a model is told, for tool results and for the protocol;
* :mod:`.context`, :mod:`.gates`, :mod:`.extras` — arguments and run ids in, the default gate,
  the import guard of an optional framework.

A framework module keeps only what its framework forces.
"""

from __future__ import annotations

from .call import GatedCall, OnRefusal, Pause, Refused, is_stopping, recorded_failed
from .context import framework_context, invalid_arguments, model_arguments
from .declarations import SPEC_OPTIONS, Declaration, Declarations, read_declarations
from .driver import Framework, UngatedToolWarning, gate_tools, report_ungated
from .extras import missing_extra, requires_extra
from .gates import default_gate, resolve_gate
from .twins import TwinRegistry
from .twins import registry as twin_registry
from .vocabulary import error_hint, model_message

__all__ = [
    "SPEC_OPTIONS",
    "Declaration",
    "Declarations",
    "Framework",
    "GatedCall",
    "OnRefusal",
    "Pause",
    "Refused",
    "TwinRegistry",
    "UngatedToolWarning",
    "default_gate",
    "error_hint",
    "framework_context",
    "gate_tools",
    "invalid_arguments",
    "is_stopping",
    "missing_extra",
    "model_arguments",
    "model_message",
    "read_declarations",
    "recorded_failed",
    "report_ungated",
    "requires_extra",
    "resolve_gate",
    "twin_registry",
]
