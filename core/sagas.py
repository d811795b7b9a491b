"""Sagas: steps tied by ``group_key``, each declaring at ``begin`` how to undo it
(``compensation``), and ``unwind`` running those undos in reverse order.

Every undo is itself an effect (key ``compensate:<step key>``, ``compensates_effect_id`` set),
so it runs at most once even when unwind is re-run or runs in two processes at once. Unwind
never guesses: a step whose outcome is unknown (AMBIGUOUS, IN_FLIGHT, waiting for approval) is
listed as unresolved, a committed step with no compensation as irreversible.

Undos run newest first, and never out of that order: once a step's undo is left unsettled
(AMBIGUOUS, IN_FLIGHT — e.g. a racing unwind or an agent performing it — or waiting for
approval), so that the step may still stand, unwind begins no undo of an older step. Those are
listed as unresolved ("held back") until that undo is settled and unwind is run again. An undo
that ran but whose outcome the store did not take (an outage) is such an unsettled undo.

An undo counts only if it began after its step committed (:func:`ran_before`): one an agent
began while the step was still in flight (or failed, or unknown) undid nothing the step then
did, and can never run again at its key, so that step is listed failed, for a person.

A step that joins the group while unwind walks it (an agent still at work) is listed when the
walk ends (unresolved if it may stand): an unwind is never complete with a step it never saw.

An unwind an operator confirmed (``confirmed``: the steps whose undo :func:`unwind_plan` showed)
begins no other undo: a step whose undo would run now but was not shown (the saga moved since:
a step was added, an undo settled elsewhere, an approval decided) is listed as unresolved, not
begun, and holds the older steps back as an unsettled undo does, until unwind is reviewed again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import validate
from .context import current_effect_scope
from .errors import ConfigError, EffectGateError, PayloadError, StaleLease, UnknownEffect
from .keys import compensation_key, legacy_compensation_key
from .payload import payload_hash
from .redact import describe
from .registry import UNDO_SUFFIX
from .reporting import failure_outcome
from .states import ApprovalState, Decision, Outcome, State

if TYPE_CHECKING:
    from .gatelike import GateLike
    from .records import BeginDecision, EffectRecord

__all__ = [
    "Compensator", "UnwindReport", "UnwindStep", "compensation_key", "compensation_request",
    "is_undo", "ran_before", "undo_at", "undo_keys", "unwind", "unwind_plan",
]

Compensator = Callable[["EffectRecord", Any], Any]


@dataclass(frozen=True, slots=True)
class UnwindStep:
    """One step of a group and what unwind did with it. ``earlier`` is True for a compensated
    step whose undo had already run before this unwind (an earlier unwind, or an agent): this
    unwind did nothing to it."""

    effect_id: int
    key: str
    effect_type: str
    state: str
    detail: str
    compensation_effect_id: int | None = None
    result: Any = None
    earlier: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {
            "effect_id": self.effect_id, "key": self.key, "effect_type": self.effect_type,
            "state": self.state, "detail": self.detail,
            "compensation_effect_id": self.compensation_effect_id, "result": self.result,
            "earlier": self.earlier,
        }


@dataclass(slots=True)
class UnwindReport:
    """What ``unwind(group_key)`` did: every step lands in exactly one list."""

    group_key: str
    compensated: list[UnwindStep] = field(default_factory=list)
    unresolved: list[UnwindStep] = field(default_factory=list)
    irreversible: list[UnwindStep] = field(default_factory=list)
    failed: list[UnwindStep] = field(default_factory=list)
    skipped: list[UnwindStep] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when nothing is left unresolved or failed."""
        return not (self.unresolved or self.failed)

    @property
    def compensated_now(self) -> list[UnwindStep]:
        """The steps this unwind compensated (not those undone before it)."""
        return [s for s in self.compensated if not s.earlier]

    @property
    def compensated_earlier(self) -> list[UnwindStep]:
        """The compensated steps whose undo had already run before this unwind."""
        return [s for s in self.compensated if s.earlier]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {
            "group_key": self.group_key,
            "complete": self.complete,
            **{name: [s.as_dict() for s in getattr(self, name)]
               for name in ("compensated", "unresolved", "irreversible", "failed", "skipped")},
        }

    def _repr_html_(self) -> str:
        import html  # for notebooks only

        rows = "".join(
            f"<tr><td>{name}</td><td>{html.escape(s.key)}</td><td>{s.state}</td>"
            f"<td>{html.escape(s.detail)}</td></tr>"
            for name in ("compensated", "unresolved", "irreversible", "failed", "skipped")
            for s in getattr(self, name)
        )
        return (f"<table><caption>unwind {html.escape(self.group_key)}</caption>"
                f"<tr><th>outcome</th><th>key</th><th>state</th><th>detail</th></tr>{rows}</table>")


_UNSETTLED = (State.AMBIGUOUS, State.IN_FLIGHT, State.PENDING_APPROVAL)
# What ``begin`` answers for an undo whose outcome is not known yet (AMBIGUOUS, another holder
# running it, waiting for a person): it may still happen, or may have happened.
_WAITING = (Decision.BLOCKED, Decision.IN_FLIGHT, Decision.APPROVAL_REQUIRED)


def unwind(gate: GateLike, group_key: str, by: str, *, hand_off: bool = False,
           confirmed: Iterable[int] | None = None) -> UnwindReport:
    """Compensate the committed steps of ``group_key``, newest first (see :meth:`Gate.unwind`).
    Every step lands in the report, even when one of them fails. Once a step's undo is left
    unsettled (AMBIGUOUS, IN_FLIGHT, waiting for approval), no older step's undo is begun: each
    is listed as unresolved (held back), or as compensated if its undo committed earlier.
    ``group_key`` and ``by`` are checked first (:class:`~effectgate.ConfigError`).

    ``confirmed``: the effect ids of the steps whose undo an operator confirmed (the ``runs``
    of :func:`unwind_plan`). No other undo is begun: a step whose undo would run now but is not
    among them is listed as unresolved ("not in the confirmed plan") and, as an unsettled undo
    does, holds back the older steps; one whose undo committed elsewhere meanwhile is listed
    compensated earlier, as ever. Anything but a collection of ints is refused
    (:class:`~effectgate.ConfigError`) before anything is read.

    ``hand_off`` (the MCP server's ``unwind_group``): a step with no compensator in this
    process is the caller's to undo (listed as failed, "no compensator registered"), so it
    holds back the older steps this process could undo; older steps that are also the
    caller's stay listed so, in order."""
    group_key = validate.text(group_key, "group_key", 512, required=True) or ""
    by = validate.text(by, "by", 256, required=True) or ""
    shown = None if confirmed is None else _confirmed_ids(confirmed)
    records = gate.group_steps(group_key)
    report = _walk(_Walk(gate, by, UnwindReport(group_key), _Undos(gate), hand_off,
                         confirmed=shown), records)
    return _joined(gate, report, {r.effect_id for r in records})


def _joined(gate: GateLike, report: UnwindReport, walked: set[int]) -> UnwindReport:
    """``report``, with the steps that joined the group while it was walked (an agent still
    at work) put first in their lists: each one that may stand (committed with an undo, or
    not settled) is unresolved, so an unwind is never complete with a step it never saw; one
    committed with no undo is irreversible, one that did nothing skipped. Read once more at
    the end; a store that fails then leaves the report as it was."""
    try:
        late = [r for r in gate.group_steps(report.group_key) if r.effect_id not in walked]
    except EffectGateError:
        return report
    lists: dict[str, list[UnwindStep]] = {"unresolved": [], "irreversible": [], "skipped": []}
    for record in late:  # newest first, as each list is
        fields = (record.effect_id, record.key, record.effect_type, record.state.value)
        if record.state is State.COMMITTED and record.compensation is None:
            lists["irreversible"].append(UnwindStep(*fields, "no compensation declared"))
        elif record.state is State.COMMITTED or record.state in _UNSETTLED:
            lists["unresolved"].append(UnwindStep(*fields, (
                "joined the group while it was being unwound (after the older steps' undos "
                "had begun): unwind again")))
        else:
            lists["skipped"].append(UnwindStep(*fields, f"the step is {record.state.value}: "
                                               "nothing happened to undo"))
    for name, steps in lists.items():
        getattr(report, name)[:0] = steps
    return report


def _confirmed_ids(confirmed: Iterable[int]) -> frozenset[int]:
    """``confirmed`` as a set of effect ids; :class:`ConfigError` for anything else."""
    refused = ConfigError("confirmed must be a collection of effect ids (ints): the steps "
                          "whose undo the operator confirmed")
    if not isinstance(confirmed, Iterable) or isinstance(
            confirmed, (str, bytes, bytearray, memoryview)):
        raise refused
    try:
        items = list(confirmed)
    except Exception as err:  # the caller's own iterable raised
        raise refused from err
    if not all(type(i) is int for i in items):  # (each checked before any is merged)
        raise refused
    return frozenset(items)


@dataclass(slots=True)
class _Walk:
    """One walk over a group's steps: an unwind, or (``planned`` set) a plan. ``confirmed``:
    the only steps whose undo it may begin (None: any)."""

    gate: GateLike
    by: str
    report: UnwindReport
    undos: _Undos
    hand_off: bool = False
    planned: list[EffectRecord] | None = None
    confirmed: frozenset[int] | None = None


def _walk(w: _Walk, records: list[EffectRecord]) -> UnwindReport:
    """The one place that decides which undos an unwind begins: list each of ``records``
    (newest first) in the report, running its undo unless it is held back or (``confirmed``)
    was not confirmed. A plan (``planned``), not an unwind: nothing is begun; each undo
    whose ``begin`` would answer execute now is appended to it instead, as if it then
    committed, and store errors are raised."""
    held: _Hold | None = None  # why older steps are not undone now
    for record in records:
        state = record.state.value
        step: dict[str, Any] = {"effect_id": record.effect_id, "key": record.key,
                                 "effect_type": record.effect_type, "state": state}
        try:
            held = _unwind_step(w, record, step, held)
        except EffectGateError as err:
            if w.planned is not None:
                raise
            w.report.failed.append(UnwindStep(**step, detail=_text(
                w.gate, f"{type(err).__name__}: {err.message}")))
    return w.report


def unwind_plan(gate: GateLike, group_key: str) -> tuple[list[EffectRecord], str]:
    """Read-only, for a confirmation: the steps of ``group_key`` whose undo :func:`unwind`
    begun now would run, newest first (its own choice, each undo assumed to commit), and a
    digest of the saga as read: its steps and the effects at their undo keys, each by id,
    state, attempt and fencing token (and the approval a waiting undo asks for) — equal again
    only if nothing in the saga moved since. Each undo key and approval is read once, and the
    plan is chosen from those same reads. Store errors are raised, never planned around."""
    group_key = validate.text(group_key, "group_key", 512, required=True) or ""
    records = gate.group_steps(group_key)
    undos = _Undos(gate)
    seen: list[str] = []
    for record in records:
        seen.append(f"{record.effect_id}:{record.state.value}:{record.attempt}:"
                    f"{record.lease_token}:{record.created_at!r}")
        if record.state is State.COMMITTED and record.compensation is not None:
            found = undos.at(record)
            if found is not None:
                seen.append(f"/{found.effect_id}:{found.state.value}:{found.attempt}:"
                            f"{found.lease_token}:{undos.asked(found)}")
    runs: list[EffectRecord] = []
    _walk(_Walk(gate, "plan", UnwindReport(group_key), undos, planned=runs), records)
    return runs, hashlib.sha256("\n".join(seen).encode()).hexdigest()[:32]


class _Undos:
    """The effect at each step's undo key, and the state of the approval one waits for: each
    read from the store at most once in one walk (when it is first needed), so a plan's digest
    and its choice of undos come from the same reads."""

    __slots__ = ("_asked", "_found", "_gate", "_read")

    def __init__(self, gate: GateLike) -> None:
        self._gate = gate
        self._found: dict[int, EffectRecord | None] = {}
        self._asked: dict[int, str] = {}
        self._read: dict[int, EffectRecord] = {}

    def read(self, record: EffectRecord) -> EffectRecord:
        """The COMMITTED step ``record`` with its history (a saga's steps are read without):
        for :func:`ran_before`, once its undo is found committed. A step read back moved
        (it cannot, being committed) or gone is ``record`` as it was."""
        if record.effect_id not in self._read:
            try:
                again = self._gate.get(record.key)
            except UnknownEffect:
                again = record
            self._read[record.effect_id] = again if again.effect_id == record.effect_id and (
                again.state is State.COMMITTED) else record
        return self._read[record.effect_id]

    def at(self, record: EffectRecord) -> EffectRecord | None:
        """Whatever effect is at ``record``'s undo key (its undo or not), if any."""
        if record.effect_id not in self._found:
            self._found[record.effect_id] = _at_undo_key(self._gate, record)
        return self._found[record.effect_id]

    def undo(self, record: EffectRecord) -> EffectRecord | None:
        """The effect at ``record``'s undo key, if it is that undo: begun for this step, with
        the type and payload :func:`compensation_request` gives (any other effect merely took
        the key, and the begin of the undo itself refuses it)."""
        found = self.at(record)
        return found if found is not None and is_undo(found, compensation_request(record)) else None

    def asked(self, effect: EffectRecord) -> str:
        """:func:`_asked` of ``effect``."""
        if effect.effect_id not in self._asked:
            self._asked[effect.effect_id] = _asked(self._gate, effect)
        return self._asked[effect.effect_id]


@dataclass(frozen=True, slots=True)
class _Hold:
    """Why the steps older than one are not undone now: its undo is unsettled, or (``handed``)
    it is the caller's to undo (:func:`unwind`'s ``hand_off``)."""

    text: str
    handed: bool = False


def _unwind_step(w: _Walk, record: EffectRecord, step: dict[str, Any],
                 held: _Hold | None) -> _Hold | None:
    """List ``record`` (undoing it unless ``held`` or not confirmed; a plan: see
    :func:`_walk`); return why older steps are held back."""
    report, state = w.report, record.state.value
    if record.state in _UNSETTLED:
        report.unresolved.append(UnwindStep(**step, detail=f"the step is {state}: "
                                            "resolve it before it can be undone"))
        return held
    if record.state is not State.COMMITTED:
        report.skipped.append(UnwindStep(**step, detail=f"the step is {state}: "
                                         "nothing happened to undo"))
        return held
    if record.compensation is None:
        report.irreversible.append(UnwindStep(**step, detail="no compensation declared"))
        return held
    compensator = w.gate.compensator_for(record.effect_type)
    if compensator is None or held is not None:
        return _not_begun(w, record, step, held, w.hand_off and compensator is None)
    if w.planned is not None:
        return _plan(w, record, w.planned)
    if w.confirmed is not None and record.effect_id not in w.confirmed:
        return _unconfirmed(w, record, step)
    return _compensate(w, record, compensator, step)


def _not_begun(w: _Walk, record: EffectRecord, step: dict[str, Any], held: _Hold | None,
               handed: bool) -> _Hold | None:
    """A step whose undo this unwind does not begin (held back, or no compensator here;
    ``handed``: the caller's to undo): what its undo says if one was begun elsewhere (an
    earlier unwind, an agent over MCP)."""
    report = w.report
    undo = w.undos.undo(record)
    undo_id = None if undo is None else undo.effect_id
    if undo is not None and undo.state is State.COMMITTED and _early(w, record):
        report.failed.append(UnwindStep(**step, detail=_EARLY.format(undo_id),
                                        compensation_effect_id=undo_id))
        return held
    if undo is not None and undo.state is State.COMMITTED:
        report.compensated.append(UnwindStep(**step, detail="compensated earlier",
                                             compensation_effect_id=undo_id,
                                             result=undo.result, earlier=True))
        return held
    if undo is not None and undo.state in _UNSETTLED:
        report.unresolved.append(UnwindStep(
            **step, detail=f"compensation {undo.state.value}: settle it before anything older "
            "is undone", compensation_effect_id=undo_id))
        return held if held is not None and not held.handed else _hold(record,
                                                                     undo.state.value)
    if held is not None and not (held.handed and handed):
        report.unresolved.append(UnwindStep(**step, detail=held.text,
                                            compensation_effect_id=undo_id))
        return held
    report.failed.append(UnwindStep(
        **step, detail=f"no compensator registered for {record.effect_type}"))
    if handed:  # the caller undoes it, after which the older steps may be undone
        return held or _hold(record, "left to the caller", handed=True)
    return None


def _at_undo_key(gate: GateLike, record: EffectRecord) -> EffectRecord | None:
    """Whatever effect is at ``record``'s undo key (its undo or not), if any; for a step
    keyed ``sha256:…``, its undo begun at the old key (:func:`_legacy_undo`) first."""
    legacy = _legacy_undo(gate, record)
    if legacy is not None:
        return legacy
    try:
        return gate.get(compensation_key(record.key))
    except UnknownEffect:
        return None


def _legacy_undo(gate: GateLike, record: EffectRecord) -> EffectRecord | None:
    """The undo of a step keyed ``sha256:…`` begun by an older effectgate, at the old key
    (:func:`~effectgate.keys.legacy_compensation_key`): still the step's one undo (begun
    again at the new key it would run twice). Only an effect that compensates this step, of
    its undo type, counts: any other effect at that key is not this step's. None for any
    other step (no read)."""
    old = legacy_compensation_key(record.key)
    if old is None:
        return None
    try:
        found = gate.get(old)
    except UnknownEffect:
        return None
    mine = (found.compensates_effect_id == record.effect_id
            and found.effect_type == record.effect_type + UNDO_SUFFIX)
    return found if mine else None


def undo_keys(record: EffectRecord) -> tuple[str, ...]:
    """The keys ``record``'s undo may be at: :func:`compensation_key`, and for a step keyed
    ``sha256:…`` the key an older effectgate gave it (what an effect there counts for:
    :func:`undo_at`)."""
    old = legacy_compensation_key(record.key)
    return (compensation_key(record.key),) if old is None else (compensation_key(record.key), old)


def undo_at(gate: GateLike, record: EffectRecord) -> tuple[dict[str, Any], EffectRecord | None]:
    """:func:`compensation_request` of ``record`` at the key its undo is at, and the effect
    there (its undo or not), if any: the key is :func:`compensation_key`, except for a step
    keyed ``sha256:…`` whose undo an older effectgate began at the old key, where it stays
    (retried, or found committed, there; never begun again at the new key). For whoever
    performs an undo outside :func:`unwind` (the MCP server's hand-off)."""
    request = compensation_request(record)
    found = _at_undo_key(gate, record)
    if found is not None and found.key != request["key"]:  # the old key: its undo is there
        request["key"] = found.key
    return request, found


def _asked(gate: GateLike, effect: EffectRecord) -> str:
    """Where the approval ``effect`` waits for stands (``""`` if it waits for none): a person's
    yes or no there changes what its ``begin`` answers, with the effect itself unchanged."""
    if effect.state is not State.PENDING_APPROVAL or effect.approval_id is None:
        return ""
    try:
        return gate.approval(effect.approval_id).state.value
    except UnknownEffect:
        return ""


def _ahead(w: _Walk, record: EffectRecord) -> tuple[str, EffectRecord | None]:
    """What ``begin`` of ``record``'s undo would answer now, read without writing, and the
    effect at its undo key: ``"runs"`` (nothing there, the undo FAILED, or a person approved
    it; a DENIED undo too, as the policy may allow it now), ``"done"`` (it committed
    earlier), ``"waits"`` (unsettled), ``"refused"`` (another effect took its key) or
    ``"early"`` (it committed, but began before the step committed: :func:`ran_before`)."""
    found = w.undos.at(record)
    if found is None:
        return "runs", None
    if not is_undo(found, compensation_request(record)):
        return "refused", found
    if found.state is State.COMMITTED:
        return ("early" if _early(w, record) else "done"), found
    if found.state in _UNSETTLED and w.undos.asked(found) != ApprovalState.APPROVED.value:
        return "waits", found
    return "runs", found


def _plan(w: _Walk, record: EffectRecord, planned: list[EffectRecord]) -> _Hold | None:
    """What :func:`_compensate` would meet now (:func:`_ahead`): an undo that runs is
    planned, as if it then committed (a plan names every undo that may run); a wait holds
    the older steps back; a refusal is listed failed by unwind (here: nothing)."""
    what, found = _ahead(w, record)
    if what == "waits" and found is not None:
        return _hold(record, found.state.value)
    if what == "runs":
        planned.append(record)
    return None


def _unconfirmed(w: _Walk, record: EffectRecord, step: dict[str, Any]) -> _Hold | None:
    """A step whose undo the operator did not confirm: never begun. What its undo says
    (:func:`_ahead`) is listed as :func:`_compensate` would list it, except an undo that
    would run now: listed unresolved, holding the older steps back until it is reviewed."""
    what, found = _ahead(w, record)
    undo_id = None if found is None else found.effect_id
    if what in ("done", "waits", "early"):  # listed as for any undo not begun here
        return _not_begun(w, record, step, None, False)
    if what == "refused" and found is not None:
        w.report.failed.append(UnwindStep(**step, detail=(
            f"its undo's key {found.key} is taken by another effect "
            f"({found.effect_type}, #{undo_id})")))
        return None
    w.report.unresolved.append(UnwindStep(
        **step, detail=f"{_NOT_CONFIRMED}: its undo would run now, but was not among the "
        "undos confirmed (the saga moved since the plan was shown, or it was left out); "
        "nothing was begun; unwind again to review it",
        compensation_effect_id=undo_id))
    return _Hold(f"held back: the undo of the newer step {record.key} is {_NOT_CONFIRMED}; "
                 "unwind again to review it (undos run newest first)")


_NOT_CONFIRMED = "not in the confirmed plan"


def is_undo(effect: EffectRecord, undo: dict[str, Any]) -> bool:
    """Whether ``effect`` (found at the key of a step's undo) is that undo: begun with exactly
    ``undo`` (:func:`compensation_request` of the step), so the step it compensates, its
    effect type and its payload are the ones :func:`unwind` would begin. Any other effect at
    that key merely took it (and the undo's own begin is refused there). The one test unwind,
    the MCP server and the console apply."""
    return (effect.compensates_effect_id == undo["compensates_effect_id"]
            and effect.effect_type == undo["effect_type"]
            and effect.payload_hash == payload_hash(undo["payload"]))


_AS_SAID = {"blocked": "ambiguous", "in_flight": "in flight",
            "unrecorded": "unrecorded (it ran; the store failed to record it)",
            "approval_required": "waiting for approval", "pending_approval": "waiting for approval"}


def _hold(record: EffectRecord, what: str, *, handed: bool = False) -> _Hold:
    """Why the steps older than ``record`` are not undone now (``what``: its undo's state,
    what its ``begin`` answered, or who has it to do)."""
    return _Hold(f"held back: the undo of the newer step {record.key} is "
                 f"{_AS_SAID.get(what, what)}; settle it, then unwind again (undos run newest "
                 "first)", handed)


def compensation_request(record: EffectRecord) -> dict[str, Any]:
    """The ``begin`` arguments of ``record``'s undo: key ``compensate:<key>``, type
    ``<type>.compensate``, ``compensates_effect_id`` set, and the step's cost (its actual cost
    where its holder reported one, else its estimate: what an approval rule judges the undo
    by; no spend ceiling counts an undo). Whoever performs
    the undo — ``unwind`` here, or an agent over MCP — begins this same effect, so it runs at
    most once."""
    request: dict[str, Any] = {
        "effect_type": record.effect_type + UNDO_SUFFIX, "key": compensation_key(record.key),
        "payload": {"effect_id": record.effect_id, "compensation": record.compensation},
        "compensates_effect_id": record.effect_id,
    }
    if record.run_id is not None:
        request["run_id"] = record.run_id
    cost = record.actual_cost_micros if record.actual_cost_micros is not None else (
        record.estimated_cost_micros)  # what an approval rule judges it by: the spend known
    if cost is not None:
        request["estimated_cost_micros"] = cost
    return request


def _compensate(w: _Walk, record: EffectRecord, compensator: Compensator,
                step: dict[str, Any]) -> _Hold | None:
    """Begin and run ``record``'s undo; return why older steps are held back, if it is left
    unsettled."""
    gate, report = w.gate, w.report
    request = compensation_request(record)
    legacy = _legacy_undo(gate, record)  # (a step keyed sha256:…: its undo at the old key)
    if legacy is not None and legacy.state is State.COMMITTED:
        return _not_begun(w, record, step, None, False)  # done: listed, never run again
    if legacy is not None:
        request["key"] = legacy.key  # retried (or waited for) where it was begun
    d = gate.begin(**request, agent_id=w.by)
    if d.decision is Decision.DUPLICATE and _early(w, record):
        report.failed.append(UnwindStep(**step, detail=_EARLY.format(d.effect_id),
                                        compensation_effect_id=d.effect_id))
        return None
    if d.decision is Decision.DUPLICATE:
        report.compensated.append(UnwindStep(**step, detail="compensated earlier",
                                             compensation_effect_id=d.effect_id,
                                             result=d.result, earlier=True))
        return None
    if d.decision is not Decision.EXECUTE:
        report.unresolved.append(UnwindStep(
            **step, detail=f"compensation {d.decision.value}: {d.reason or ''}".rstrip(": "),
            compensation_effect_id=d.effect_id))
        return _hold(record, d.decision.value) if d.decision in _WAITING else None
    try:
        with current_effect_scope(d):
            result = compensator(record, record.compensation)
    except BaseException as exc:
        # (a built-in's inferred FAILED only under a vendor key, which it keeps)
        reported = failure_outcome(exc, gate.classifiers, d.vendor_key is not None)
        outcome = Outcome(reported)
        lost: EffectGateError | None = None
        try:
            gate.report(d, reported, error=describe(exc))
        except EffectGateError as err:
            exc.add_note(f"effectgate could not record {outcome}: {err}")
            lost = err
        if not isinstance(exc, Exception):
            raise
        if lost is not None:  # the undo stays in flight, then AMBIGUOUS: unsettled
            return _unrecorded(w, record, step, d, f"{outcome} ({describe(exc)})", lost)
        target = report.failed if outcome is Outcome.FAILED else report.unresolved
        target.append(UnwindStep(
            **step, detail=_text(gate, f"compensation {outcome.value}: {describe(exc)}"),
            compensation_effect_id=d.effect_id))
        return None if outcome is Outcome.FAILED else _hold(record, outcome.value)
    detail = "compensated"
    try:
        try:
            gate.report(d, Outcome.COMMITTED, result=result)
        except PayloadError:  # the undo ran: record it, without a result it cannot store
            gate.report(d, Outcome.COMMITTED, result=None)
            detail, result = ("compensated (its result has no JSON form and was not stored)",
                              None)
    except EffectGateError as err:  # it ran; the store did not take the word (an outage)
        return _unrecorded(w, record, step, d, "committed", err)
    report.compensated.append(UnwindStep(**step, detail=detail,
                                         compensation_effect_id=d.effect_id, result=result))
    return None


_EARLY = ("its undo (#{}) committed, but began before the step committed: it did not undo "
          "what the step did, and cannot run again at its key; a person must check the step")


def ran_before(undo: EffectRecord, step: EffectRecord) -> bool:
    """Whether the committed ``undo`` (found at ``step``'s undo key) began the attempt that
    committed it before the COMMITTED ``step`` committed, on the store's clock: an undo begun
    while the step was in flight, failed or unknown — by an agent, a script — ran before what
    it was to undo, so it undid nothing the step did. Read from both histories (``step`` read
    with its history), each instant written alike there, so one undo begun in the step's
    commit's own tick is never taken for an early one; where either history was pruned, the
    undo's commit is compared with the step's instead (an undo that committed first is early)."""
    began = [h.at for h in undo.history if h.to_state is State.IN_FLIGHT]
    done = [h.at for h in step.history if h.to_state is State.COMMITTED]
    if began and done:
        return began[-1] < done[-1]
    return undo.updated_at < step.updated_at


def _early(w: _Walk, record: EffectRecord) -> bool:
    """:func:`ran_before` of the committed undo at ``record``'s undo key, each read once."""
    found = w.undos.at(record)
    return (found is not None and found.state is State.COMMITTED
            and ran_before(found, w.undos.read(record)))


def _unrecorded(w: _Walk, record: EffectRecord, step: dict[str, Any], d: BeginDecision,
                outcome: str, err: EffectGateError) -> _Hold:
    """The undo ran (its compensator returned or raised) but its outcome could not be
    recorded: it stays in flight, then AMBIGUOUS, until someone resolves it. Listed unresolved
    (not failed: it may well have happened) and, as any unsettled undo, it holds the older
    steps back. One fenced (:class:`StaleLease`: settled by someone else while it ran) reads
    as they settled it: FAILED would have the next unwind run it again."""
    then = "it reads in flight, then ambiguous"
    if isinstance(err, StaleLease):
        then = (f"someone else settled it while it ran (it reads {err.state or 'settled'}; "
                "if failed, the next unwind runs it again)")
    w.report.unresolved.append(UnwindStep(**step, detail=_text(w.gate, (
        f"compensation ran ({outcome}) but could not be recorded ({type(err).__name__}: "
        f"{err.message}): {then}; check it, then resolve "
        f"{d.key}")), compensation_effect_id=d.effect_id))
    return _hold(record, "unrecorded")


def _text(gate: GateLike, text: str) -> str:
    """Free text for the report (shown by the CLI, returned over MCP): through the gate's
    redactor, as every stored error is."""
    return gate._redact(text) or ""
