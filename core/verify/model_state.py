"""The model's data: a bound (:class:`Config`), a worker's local state (:class:`Worker`),
everything the model knows (:class:`ModelState`: hashable, canonical), one transition
(:class:`Step`), and an action's name for a person (:func:`describe`). The rules that move
them live in :mod:`effectgate.verify.model`; the store rows in
:mod:`effectgate.verify.model_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..payload import payload_hash
from ..request import Request
from ..store.rows import EffectHead
from .model_rows import KEY, VENDOR, MApproval, MRow

__all__ = [
    "COST",
    "LIMIT",
    "LOST",
    "Action",
    "Config",
    "ModelState",
    "Step",
    "Worker",
    "describe",
]

COST = 60
LIMIT = 100
"""With ``Config.budget``: each attempt's estimated cost, and its type's ceiling (one attempt
fits, two held at once do not)."""
Action = tuple[Any, ...]
"""One step of a schedule: a tuple of plain values (``("begin", 0)``, ``("tick",)``, ...)."""


@dataclass(frozen=True)
class Config:
    """A bound: the workers (namespace, effect type), how often each may begin, the faults and
    operator actions allowed, the clock's end, and the protocol's parameters in ticks."""

    workers: tuple[tuple[str, str], ...] = (("a", "refund"), ("a", "refund"))
    begins: tuple[int, ...] = (1, 2)
    faults: int = 1
    ops: int = 1
    ticks: int = 2
    lease_ticks: int = 1
    grace_ticks: int = 1
    max_attempts: int = 3
    hook: bool = True
    forgery: bool = True
    prune: bool = True
    approval: bool = False
    budget: bool = False
    """The first worker's type has a spend ceiling (:data:`LIMIT`); each call estimates
    :data:`COST` (or its :attr:`costs`)."""
    """A policy asks a human to approve every effect of the first worker's type (the operator
    approves or denies)."""
    deny: bool = False
    """The policy denies the first worker's type: every begin of it answers DENIED, never
    EXECUTE (nothing of that type reaches the vendor)."""
    block: bool = False
    """The first worker's type has ``on_ambiguous = "block"``: the reconcile hook is never
    called for it, and an AMBIGUOUS effect of it moves only by an operator's resolve (or the
    lapsed holder's late report)."""
    agents: tuple[str, ...] = ()
    """Each worker's agent id (default none: an unattributed request); workers on one agent
    share its per-agent ceiling (:attr:`agent_budget`)."""
    runs: tuple[str, ...] = ()
    """Each worker's run id (default none); workers on one run share its per-run ceiling."""
    budget_scopes: tuple[str, ...] = ("effect_type",)
    """With :attr:`budget`: the scopes of the ceiling (each at :data:`LIMIT`): any of
    ``effect_type``, ``agent``, ``run`` (a run or agent ceiling counts only the workers that
    carry that id), ``day`` (the namespace's spend on the database's UTC date)."""
    days: int = 0
    """How many times the database's UTC date may change (action ``("midnight",)``, between
    any two store calls): a per-day ceiling's counter is the date's, so a new day counts from
    zero while an earlier day's charges stay with the effects that hold them."""
    self_approve: bool = False
    """The operator actions include the requester approving its own pending request (the real
    :func:`effectgate.decide.check_approval` with the requester as approver, as
    :meth:`effectgate.Gate.approve` does): refused unless :attr:`allow_self_approval`."""
    allow_self_approval: bool = False
    """The approval rule lets a requester approve its own request."""
    hook_fails: bool = False
    """The reconcile hook may raise (verdict ``raise``): the flow must leave the row
    AMBIGUOUS."""
    hook_lies: bool = False
    """The reconcile hook may answer ``committed`` although the vendor never executed. The
    protocol cannot tell: such a hook makes a COMMITTED row with no execution behind it (the
    invariant that a reconciled COMMITTED was executed holds only for a truthful hook, and is
    not checked here); every other invariant still holds."""
    lost_ops: bool = False
    """The operator's approve, deny and prune may lose their reply (each spends a fault): the
    write happened, the operator sees an error, and may repeat the action once
    (``("again",)``): a repeated approve or deny is refused (the request is no longer
    pending), a repeated prune counts what is left to prune. A repeat may lose its reply too
    (``("again", True)``, another fault): the operator repeats again."""
    name: str = ""
    costs: tuple[int, ...] = ()
    """With :attr:`budget`: each worker's estimated cost (default :data:`COST`). One over
    :data:`LIMIT` is over a ceiling's limit alone: where that ceiling counts the call it is
    refused before any approval is asked (:meth:`over_alone`)."""
    keys: tuple[str, ...] = ()
    """Each worker's key (default :data:`KEY`): workers on two keys of one namespace share
    its spend counters."""
    payloads: tuple[int, ...] = ()
    """Each worker's payload ``{"n": <this>}`` (default 1): another payload on the same key is
    refused."""
    unsure: bool = False
    """A holder may report AMBIGUOUS after the vendor answered, and then try to report what
    it learnt (the store must refuse: an AMBIGUOUS it reported moves only by resolve or
    reconcile)."""
    inferred: bool = False
    """A holder may report the FAILED a built-in exception classifier infers from a
    connection error (action ``("report", i, "inferred", lost)``: the decorator's
    :data:`~effectgate.reporting.INFERRED_FAILED`) once it has sent its request, whatever the
    vendor did with it (the classifier judged another request of the body, so it can be
    wrong). That FAILED keeps the vendor key: the next attempt sends under it, and the vendor
    deduplicates a request it executed (AT MOST ONCE). A holder that reported so while its
    request was still on its way begins again only once that request has reached the vendor
    (another worker may retry meanwhile)."""
    memo: bool = False
    """Each namespace's gate keeps a COMMITTED memo (the real
    :meth:`effectgate.flow.BeginFlow.from_memo` answers a repeat before the store is asked)."""
    one_call: bool = False
    """The store's shape: it inserts a new key in one call that reads first (Postgres), so a
    governed begin starts with that move, not a read (:meth:`effectgate.store.Store.one_call`).
    Schedules replayed on a store are explored in its shape (:meth:`Replayer.shaped`)."""

    def request(self, worker: int) -> Request:
        """The ``begin`` worker ``worker`` makes (in ticks)."""
        ns, effect_type = self.workers[worker]
        gov = None
        cost = self.cost(worker)
        rule = self.policy_rule()
        if rule:
            from ..governance import evaluate
            from ..policy import Policy

            policy = Policy.from_dict({"effects": {self.workers[0][1]: rule}})
            gov = evaluate(policy, effect_type, cost)
        payload = self.payload(worker)
        return Request(ns, self.key(worker), effect_type, payload_hash(payload), VENDOR,
                       self.max_attempts, self.lease_ticks - 0.5, float(self.grace_ticks),
                       self.run(worker), self.agent(worker), None, None, None, cost, gov,
                       payload)

    def run(self, worker: int) -> str | None:
        """Worker ``worker``'s run id (None: none)."""
        return self.runs[worker] if worker < len(self.runs) else None

    def agent(self, worker: int) -> str | None:
        """Worker ``worker``'s agent id (None: unattributed)."""
        return self.agents[worker] if worker < len(self.agents) else None

    def cost(self, worker: int) -> int | None:
        """Worker ``worker``'s estimated cost (None: no ceiling, so none declared)."""
        if not self.budget:
            return None
        return self.costs[worker] if worker < len(self.costs) else COST

    def over_alone(self, worker: int) -> bool:
        """Whether worker ``worker``'s cost alone is over the limit of a ceiling that counts
        it (a run or agent ceiling counts only a call with that id): no window ever makes
        room for it, so it is refused at once, before any approval is asked."""
        if not self.governed(worker) or (self.cost(worker) or 0) <= LIMIT:
            return False
        return any(scope in ("effect_type", "day")
                   or (scope == "run" and self.run(worker) is not None)
                   or (scope == "agent" and self.agent(worker) is not None)
                   for scope in self.budget_scopes)

    def key(self, worker: int) -> str:
        """Worker ``worker``'s effect key."""
        return self.keys[worker] if worker < len(self.keys) else KEY

    def payload(self, worker: int) -> dict[str, Any]:
        """Worker ``worker``'s payload."""
        return {"n": self.payloads[worker] if worker < len(self.payloads) else 1}


    def policy_rule(self) -> dict[str, Any]:
        """The policy rule of the first worker's type (empty: no policy)."""
        rule: dict[str, Any] = {}
        if self.approval:
            rule["approval"] = {"always": True, "allow_self_approval": True} if (
                self.allow_self_approval) else "always"
        if self.budget:
            rule["budget"] = {f"per_{scope}_micros": LIMIT for scope in self.budget_scopes}
        if self.deny:
            rule["deny"] = True
        if self.block:
            rule["on_ambiguous"] = "block"
        return rule

    def governed(self, worker: int) -> bool:
        """Whether the policy governs worker ``worker``'s type (the first worker's)."""
        return bool(self.policy_rule()) and self.workers[worker][1] == self.workers[0][1]

    def as_source(self) -> str:
        """This config as Python source."""
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__dataclass_fields__)
        return f"Config({fields})"


class Worker(NamedTuple):
    """One worker's local state.

    ``phase``: idle, begin (its flow's next store call is ``call``, about ``row``; ``answers``
    is what the flow was answered so far), held (EXECUTE: may send), sent, replied (``reply``
    the vendor's answer), done, dead. ``lease``: (token, secret, attempt, vendor attempt,
    lease end) of its EXECUTE; ``consumed``: the approval its begin's move consumed."""

    phase: str
    begins: int
    forged: bool = False
    call: str | None = None
    row: EffectHead | None = None
    answers: tuple[Any, ...] = ()
    lease: tuple[int, str, int, int | None, float | None] | None = None
    reply: str | None = None
    seen_token: int | None = None
    consumed: str | None = None
    calls: int = 0
    """Store calls this begin has made without an answer (liveness: bounded)."""


class _Lost:
    """The answer recorded for a call whose reply was lost (the flow is thrown an error)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LOST"


LOST = _Lost()


class ModelState(NamedTuple):
    """Everything the model knows: hashable, canonical (equal states compare equal)."""

    now: int
    rows: tuple[MRow, ...]
    workers: tuple[Worker, ...]
    ledger: tuple[tuple[tuple[str, str, str, int], str, bool], ...]
    """The vendor: (vendor key, "executed"|"refused", sent under a live lease)."""
    transit: tuple[tuple[int, tuple[str, str, str, int], bool, float], ...]
    """Requests on their way: (worker, vendor key, sent under a live lease, its lease end)."""
    faults: int
    ops: int
    grants: tuple[tuple[str, str, int], ...]
    """Every EXECUTE granted: (namespace, key, attempt)."""
    committed: tuple[tuple[str, str, str | None], ...]
    """Results of COMMITTED effects once seen: (namespace, key, result)."""
    next_id: int
    approvals: tuple[MApproval, ...] = ()
    consumed: tuple[tuple[str, str, str], ...] = ()
    spend: tuple[tuple[str, str, int], ...] = ()
    """Spend counters: (namespace, scope key, micros)."""
    memo: tuple[tuple[str, str, str, str, int, int, int, str | None], ...] = ()
    """Each namespace gate's COMMITTED memo: (namespace, key, payload hash, effect type,
    effect id, attempt, token, result)."""
    repeat: tuple[str, ...] = ()
    """An operator action whose reply was lost, that the operator may repeat: (kind, approval
    id) or ("prune", "")."""
    day: int = 0
    """The database's UTC date, counted from 0 (:attr:`Config.days`)."""


class Step(NamedTuple):
    """A transition: the state after it, what happened (words), and any violations."""

    state: ModelState
    text: str
    violations: tuple[str, ...]
    answer: Any = None
    """What the caller saw: a begin's (decision, attempt, token) or ("error", type); a
    report's "written" / "refused"; a resolve's "resolved" / "refused"; a prune's count."""


def describe(action: Action, config: Config) -> str:
    """A short name of an action for a person."""
    kind = action[0]
    if kind == "tick":
        return "the database clock advances one tick"
    if kind == "resolve":
        return (f"operator resolves {action[1]}" + (" with force" if action[2] else "")
                + (" (its reply is lost)" if action[3] else ""))
    if kind == "self_approve":
        return "the requester approves its own pending request"
    lost = " (its reply is lost)" if action[1:] == (True,) else ""
    if kind == "prune":
        return "operator prunes settled effects" + lost
    if kind in ("approve", "deny"):
        return (f"operator {'approves' if kind == 'approve' else 'denies'} the pending request"
                + lost)
    if kind == "again":
        return "operator repeats the action whose reply was lost" + lost
    if kind == "midnight":
        return "the database's UTC date changes (midnight)"
    w = action[1]
    ns, et = config.workers[w]
    who = f"worker {w} ({ns}/{et})"
    if kind == "begin":
        return f"{who} calls begin"
    if kind == "step":
        extra = " (its reply is lost)" if action[2] else ""
        extra += f", the reconcile hook answers {action[3]}" if action[3] else ""
        return f"{who}'s begin makes its next store call{extra}"
    if kind == "send":
        return f"{who} sends the request to the vendor"
    if kind == "land":
        return f"the vendor receives {who}'s request ({action[2]} if new)"
    if kind == "report":
        what = ("FAILED as a built-in classifier infers it from a connection error"
                if action[2] == "inferred" else action[2])
        return f"{who} reports {what}" + (" (its reply is lost)" if action[3] else "")
    if kind == "die":
        return f"{who} dies"
    if kind == "guess":
        return f"{who} reports FAILED with the token it saw and a guessed secret"
    if kind == "borrow":
        return f"{who} reports FAILED with worker {action[2]}'s lease (another namespace)"
    return repr(action)
