"""Symmetry reduction for the exhaustive exploration (:mod:`effectgate.verify.explore`):
workers the bound gives the same request (namespace, effect type, key, payload, agent, run,
governance) and number of begins are interchangeable, and two states that differ only by a
permutation of such workers are one state to explore.

A worker's index leaks into the state: its lease secrets are ``secret_hash("w<i>b<n>")``, its
approval ids ``apr<i>.<n>.<k>`` (:meth:`effectgate.verify.model.Model._flow`), and a request on
its way names its sender. A permutation therefore moves each worker's local state to its new
index and renames, everywhere in the state (rows, approvals, the answers a worker's flow was
given, leases, requests in transit), the secrets and approval ids of the workers it moves.

The key of a state's class (:meth:`Symmetry.key`): the workers of each class put in order of
a signature that holds no index (their phase, begins, calls...); the permutations that sort
them, applied to the state, give one state (its sorted state) or, when signatures tie, a few
(their frozenset). A permuted state sorts by the same permutations composed with its own, so
every state of a class has the same sorted state, and equal sorted states are states of one
class. The key stands for the sorted state without building it: the fields that name no
worker as they are, and one number for the sorted and renamed rest, equal numbers for equal
values only (so every state of a class has the same key, and equal keys are states of one
class).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

from .._commands import HookFailed
from ..request import secret_hash
from ..store.rows import ApprovalRow, CommittedHead, EffectHead, EffectRow, Moved
from .model import LOST, Action, Config, ModelState
from .model_rows import MRow
from .model_state import Worker

__all__ = ["KEPT", "RENAMED", "Symmetry", "interchangeable"]

_ROWS, _WORKERS, _TRANSIT, _APPROVALS, _CONSUMED, _REPEAT = (
    ModelState._fields.index(f)
    for f in ("rows", "workers", "transit", "approvals", "consumed", "repeat"))
RENAMED = frozenset(("rows", "workers", "transit", "approvals", "consumed", "repeat"))
"""The fields of :class:`ModelState` that may name a worker (its index, lease secrets or
approval ids) and are renamed; the others hold none (a test pins the two lists, so that a new
field is looked at here)."""
KEPT = frozenset(("now", "ledger", "faults", "ops", "grants", "committed", "next_id", "spend",
                  "memo", "day"))

NAMED = ("rows", "workers", "transit", "approvals", "consumed", "repeat")
"""The fields of :data:`RENAMED` in the order :meth:`_Renamer.named` gives them."""
_NAMED_AT = tuple(ModelState._fields.index(f) for f in NAMED)
_named = operator.itemgetter(*_NAMED_AT)
_kept = operator.itemgetter(*(ModelState._fields.index(f) for f in sorted(KEPT)))
# (The key's two halves of a state, each one tuple made in C: :meth:`Symmetry.key`.)

_HEAD_SECRET, _HEAD_APPROVAL = (EffectHead._fields.index(f)
                                for f in ("lease_secret", "approval_id"))
_ROW_SECRET, _ROW_APPROVAL = (MRow._fields.index(f) for f in ("secret", "approval_id"))
_W_ROW, _W_ANSWERS, _W_LEASE, _W_CONSUMED = (
    Worker._fields.index(f) for f in ("row", "answers", "lease", "consumed"))
# (The renaming rebuilds a tuple from a list of its fields (``_make``), not ``_replace``; and
# each renamer keeps what it made: a key renames each distinct part of a state once.)

Perm = tuple[int, ...]
"""A permutation of the workers: ``perm[i]`` is worker ``i``'s index after it."""


def interchangeable(config: Config) -> tuple[tuple[int, ...], ...]:
    """The classes of workers ``config`` makes interchangeable (each with two or more
    workers): the same request (namespace, effect type, key, payload, agent, run, what the
    policy asks of it) and number of begins."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in range(len(config.workers)):
        begins = config.begins[i] if i < len(config.begins) else 1
        ident = (repr(config.request(i)), begins)
        groups.setdefault(ident, []).append(i)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)


class _Renamer:
    """One permutation's renaming of worker-specific names (lease secret hashes, approval
    ids) and of worker indices."""

    def __init__(self, config: Config, perm: Perm) -> None:
        self.perm = perm
        self.names: dict[str, str] = {}
        self._workers: dict[Any, Any] = {}
        self._parts: dict[tuple[int, Any], Any] = {}
        for i, j in enumerate(perm):
            if i == j:
                continue
            for n in range(config.begins[i] if i < len(config.begins) else 1):
                self.names[secret_hash(f"w{i}b{n}")] = secret_hash(f"w{j}b{n}")

    def name(self, x: str | None) -> str | None:
        """``x`` renamed (a secret hash or an approval id of a moved worker)."""
        return None if x is None else self.text(x)

    def text(self, x: str) -> str:
        """``x`` renamed (:meth:`name`)."""
        got = self.names.get(x)
        if got is not None:
            return got
        if x.startswith("apr"):
            dot = x.find(".")
            if dot > 3 and x[3:dot].isdigit() and int(x[3:dot]) < len(self.perm):
                i = int(x[3:dot])
                got = x if self.perm[i] == i else f"apr{self.perm[i]}{x[dot:]}"
                self.names[x] = got
                return got
        return x

    def head(self, h: EffectHead) -> EffectHead:
        """A row as the store handed it up, renamed."""
        secret, approval = h.lease_secret, h.approval_id
        new_secret = None if secret is None else self.text(secret)
        new_approval = None if approval is None else self.text(approval)
        if new_secret is secret and new_approval is approval:
            return h
        fields = list(h)
        fields[_HEAD_SECRET], fields[_HEAD_APPROVAL] = new_secret, new_approval
        return EffectHead._make(fields)

    def answer(self, a: Any) -> Any:
        """One answer a worker's flow was given, renamed."""
        if a is None or a is LOST or isinstance(a, (str, HookFailed, CommittedHead)):
            return a  # (a raising hook's answer is one constant, a committed head holds no
            # secret or approval: neither names a worker)
        if isinstance(a, EffectHead):
            return self.head(a)
        if isinstance(a, Moved):
            return a if a.row is None else a._replace(row=self.head(a.row))
        if isinstance(a, EffectRow):
            return a._replace(lease_secret=self.name(a.lease_secret),
                              approval_id=self.name(a.approval_id))
        if isinstance(a, ApprovalRow):
            return a._replace(id=self.text(a.id))
        raise TypeError(f"the symmetry does not know how to rename an answer {a!r}")

    def worker(self, w: Any) -> Any:
        """A worker's local state, renamed (made once for each)."""
        if w.row is None and w.lease is None and w.consumed is None and not w.answers:
            return w  # (idle, done or dead without a lease: it names nobody)
        got = self._workers.get(w)
        if got is None:
            fields = list(w)
            lease, row, consumed = w.lease, w.row, w.consumed
            if lease is not None:
                fields[_W_LEASE] = (lease[0], self.name(lease[1]), lease[2], lease[3], lease[4])
            if row is not None:
                fields[_W_ROW] = self.head(row)
            if w.answers:
                fields[_W_ANSWERS] = tuple(self.answer(a) for a in w.answers)
            if consumed is not None:
                fields[_W_CONSUMED] = self.text(consumed)
            got = self._workers[w] = Worker._make(fields)
        return got

    def row(self, r: MRow) -> MRow:
        """A stored row, renamed."""
        secret, approval = r.secret, r.approval_id
        new_secret = None if secret is None else self.text(secret)
        new_approval = None if approval is None else self.text(approval)
        if new_secret is secret and new_approval is approval:
            return r
        fields = list(r)
        fields[_ROW_SECRET], fields[_ROW_APPROVAL] = new_secret, new_approval
        return MRow._make(fields)

    def named(self, s: ModelState) -> tuple[Any, ...]:
        """The fields of ``s`` that may name a worker (:data:`NAMED`, in that order), with
        the workers moved and everything renamed. Each value of a field other than the
        workers is renamed once (the states of a bound share few rows, approvals...)."""
        perm = self.perm
        workers: list[Any] = list(s.workers)
        for i, w in enumerate(s.workers):
            workers[perm[i]] = self.worker(w)
        return (self._part(_ROWS, s.rows), tuple(workers), self._part(_TRANSIT, s.transit),
                self._part(_APPROVALS, s.approvals), self._part(_CONSUMED, s.consumed),
                self._part(_REPEAT, s.repeat))

    def _part(self, field: int, value: tuple[Any, ...]) -> tuple[Any, ...]:
        """Field ``field`` of a state (its ``value``), renamed (made once for each)."""
        if not value:
            return value
        at = (field, value)
        got = self._parts.get(at)
        if got is None:
            got = self._parts[at] = self._rename_part(field, value)
        return got

    def _rename_part(self, field: int, value: tuple[Any, ...]) -> tuple[Any, ...]:
        perm, name, text = self.perm, self.name, self.text
        if field == _ROWS:
            return tuple(self.row(r) for r in value)
        if field == _TRANSIT:  # requests on their way: (sender, ...)
            return tuple((perm[e[0]], *e[1:]) for e in value)
        if field == _APPROVALS:
            return tuple(a._replace(id=text(a.id)) for a in value)
        if field == _CONSUMED:
            return tuple((name(c[0]), *c[1:]) for c in value)
        assert field == _REPEAT  # (kind, approval id) of a lost operator action
        return (value[0], *(text(x) for x in value[1:]))

    def state(self, s: ModelState) -> ModelState:
        """``s`` with the workers moved and renamed."""
        fields = list(s)
        for at, value in zip(_NAMED_AT, self.named(s), strict=True):
            fields[at] = value
        return ModelState._make(fields)

    def action(self, action: Action) -> Action:
        """``action`` done by the moved workers (the worker indices it names, renamed)."""
        kind = action[0]
        if kind in ("begin", "step", "send", "land", "report", "die", "guess"):
            return (kind, self.perm[action[1]], *action[2:])
        if kind == "borrow":
            return (kind, self.perm[action[1]], self.perm[action[2]])
        return action


def _signature(w: Any) -> tuple[Any, ...]:
    """What a worker's order within its class is decided on: nothing that names a worker."""
    lease = w.lease
    return (w.phase, w.begins, w.forged, w.call or "", w.reply or "", w.seen_token or 0,
            w.calls, len(w.answers), (lease[0], lease[2]) if lease is not None else (0, 0))


class Symmetry:
    """The permutations of interchangeable workers of one :class:`Config`, and the key that
    is the same for every state of a class (:meth:`key`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.classes = interchangeable(config)
        self._renamers: dict[Perm, _Renamer] = {}
        self._sorted: dict[tuple[tuple[Any, ...], ...], list[Perm]] = {}
        self._identity: Perm = tuple(range(len(config.workers)))
        self._numbers: dict[Any, int] = {}
        """A number for each distinct sorted and renamed part of a state (:meth:`key`)."""
        self._named: dict[tuple[Any, ...], int] = {}
        """The number of each distinct part of a state that names workers, once sorted."""

    def permutations(self) -> list[Perm]:
        """Every permutation of the workers that moves only interchangeable ones (the
        identity first)."""
        out = []
        for choice in itertools.product(*(itertools.permutations(c) for c in self.classes)):
            perm = list(self._identity)
            for members, image in zip(self.classes, choice, strict=True):
                for i, j in zip(members, image, strict=True):
                    perm[i] = j
            out.append(tuple(perm))
        return out

    def renamer(self, perm: Perm) -> _Renamer:
        """The renaming of ``perm`` (made once)."""
        got = self._renamers.get(perm)
        if got is None:
            got = self._renamers[perm] = _Renamer(self.config, perm)
        return got

    def permute(self, s: ModelState, perm: Perm) -> ModelState:
        """``s`` with worker ``i`` moved to ``perm[i]``, everything renamed."""
        return s if perm == self._identity else self.renamer(perm).state(s)

    def permute_action(self, action: Action, perm: Perm) -> Action:
        """``action`` as the worker moved by ``perm`` does it."""
        return action if perm == self._identity else self.renamer(perm).action(action)

    def _sorting(self, s: ModelState) -> list[Perm]:
        """The permutations that put each class's workers in order of signature (a function
        of the workers' signatures: made once for each tuple of them)."""
        sigs = tuple(map(_signature, s.workers))
        got = self._sorted.get(sigs)
        if got is None:
            got = self._sorted[sigs] = self._sorting_of(sigs)
        return got

    def _sorting_of(self, signatures: tuple[tuple[Any, ...], ...]) -> list[Perm]:
        """The permutations that put each class's workers in order of ``signatures``."""
        choices: list[list[tuple[int, ...]]] = []
        moves = False
        for members in self.classes:
            sigs = [signatures[i] for i in members]
            ranked = sorted(range(len(members)), key=sigs.__getitem__)
            if all(sigs[a] != sigs[b] for a, b in itertools.pairwise(ranked)):  # no ties
                order = tuple(members[r] for r in ranked)
                moves = moves or order != members
                choices.append([order])
                continue
            runs = [tuple(members[r] for r in g)
                    for _, g in itertools.groupby(ranked, key=sigs.__getitem__)]
            choices.append([tuple(itertools.chain.from_iterable(p)) for p in
                            itertools.product(*(itertools.permutations(r) for r in runs))])
            moves = True
        if not moves:
            return [self._identity]
        out = []
        for choice in itertools.product(*choices):
            perm = list(self._identity)
            for members, order in zip(self.classes, choice, strict=True):
                for position, i in zip(members, order, strict=True):
                    perm[i] = position
            out.append(tuple(perm))
        return out

    def key(self, s: ModelState) -> Any:
        """The same for every state that is ``s`` up to a permutation of interchangeable
        workers, and for no other.

        ``s`` sorted: its workers put in order of signature (:func:`_signature`) by a
        permutation, applied to ``s`` (or, when signatures tie, the frozenset of the states
        each of the few permutations that sort it makes). A permuted state sorts by the same
        permutations composed with its own, so every state of a class has the same sorted
        state, and equal sorted states are states of one class.

        The sorted state is not the key itself: only the fields that name a worker
        (:data:`RENAMED`) change under a permutation, and they are a function of those fields
        of ``s`` alone. So the key is (a number, the other fields), where the number is the
        same for equal sorted and renamed fields and distinct for distinct ones: equal keys
        are equal sorted states. Those fields of ``s`` are sorted and renamed once for each
        distinct value (the states explored share few), not once for each state."""
        if not self.classes:
            return s
        named = _named(s)
        number = self._named.get(named)
        if number is None:
            number = self._named[named] = self._number(s)
        return (number, _kept(s))

    def _sorted_named(self, s: ModelState, perm: Perm) -> tuple[Any, ...]:
        return _named(s) if perm == self._identity else self.renamer(perm).named(s)

    def _number(self, s: ModelState) -> int:
        """The number of the fields of ``s`` that name workers, sorted (:meth:`key`)."""
        perms = self._sorting(s)
        sorted_: Any = (self._sorted_named(s, perms[0]) if len(perms) == 1
                        else frozenset(self._sorted_named(s, p) for p in perms))
        got = self._numbers.get(sorted_)
        if got is None:
            got = self._numbers[sorted_] = len(self._numbers)
        return got
