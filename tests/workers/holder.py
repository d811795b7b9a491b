"""A holder of one effect that another process kills, or pauses and wakes as a zombie.

``python holder.py URL NAMESPACE EFFECTS_FILE TXN_ID LEASE MODE [CALLER]``

* ``hang``: calls a gated refund (the decorator's path); the body performs the side effect
  (one line appended to EFFECTS_FILE), prints ``{"effect_id", "token", "attempt"}`` and then
  waits forever for a reply that never comes, until the test SIGKILLs it.
* ``zombie``: ``begin`` by hand, prints the same JSON, then waits for a line on stdin (the
  test pauses it with SIGSTOP meanwhile). When woken it heartbeats (``extend_lease``) before
  acting, as a careful holder does, and tries to report ``committed`` anyway; it prints what
  each call answered and exits.

CALLER is ``sync`` (the default) or ``async``: the refund is an ``async def`` (the decorator's
async path), and the zombie awaits ``abegin``, ``aextend_lease`` and ``areport`` on one event
loop that stays open while it is paused (so it wakes up with the connection it had).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import effectgate as eg


def hang(gate: eg.Gate, fd: int, txn_id: str, caller: str) -> None:
    def perform(txn_id: str) -> None:
        os.write(fd, f"refund:{txn_id} holder {os.getpid()}\n".encode())
        d = eg.current_effect()
        print(json.dumps({"effect_id": d.effect_id, "token": d.lease_token,
                          "secret": d.lease_secret, "attempt": d.attempt}), flush=True)

    if caller == "async":

        @gate.effect("refund:{txn_id}", effect_type="payment.refund")
        async def arefund(txn_id: str, amount_cents: int) -> dict[str, Any]:
            perform(txn_id)
            await asyncio.to_thread(sys.stdin.readline)  # the vendor's reply never arrives
            return {"refund_id": "never"}

        asyncio.run(arefund(txn_id, 500))
        return

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        perform(txn_id)
        sys.stdin.readline()  # the vendor's reply never arrives
        return {"refund_id": "never"}

    refund(txn_id, 500)


def zombie(gate: eg.Gate, txn_id: str, caller: str) -> None:
    with asyncio.Runner() as runner:
        begin: Callable[..., eg.BeginDecision] = gate.begin
        extend: Callable[..., Any] = gate.extend_lease
        report: Callable[..., None] = gate.report
        if caller == "async":
            begin = lambda **kw: runner.run(gate.abegin(**kw))  # noqa: E731
            extend = lambda *a, **kw: runner.run(gate.aextend_lease(*a, **kw))  # noqa: E731
            report = lambda *a, **kw: runner.run(gate.areport(*a, **kw))  # noqa: E731

        d = begin(effect_type="payment.refund", key=f"refund:{txn_id}",
                  payload={"txn_id": txn_id, "amount_cents": 500})
        print(json.dumps({"effect_id": d.effect_id, "token": d.lease_token,
                          "secret": d.lease_secret, "attempt": d.attempt,
                          "decision": d.decision.value}), flush=True)
        sys.stdin.readline()  # paused here (SIGSTOP) far past the lease
        answers: dict[str, Any] = {}
        for name, call in (
            ("extend_lease", lambda: extend(d, 30)),
            ("report", lambda: report(d, "committed", result={"by": "zombie"})),
        ):
            try:
                call()
                answers[name] = "accepted"
            except eg.StaleLease as err:
                answers[name] = {"error": "StaleLease", "state": err.state,
                                 "reason": err.reason}
        print(json.dumps(answers), flush=True)


def main() -> None:
    url, namespace, effects_file, txn_id, lease, mode = sys.argv[1:7]
    caller = sys.argv[7] if len(sys.argv) > 7 else "sync"
    gate = eg.Gate(url, namespace=namespace, lease_seconds=float(lease))
    fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if mode == "hang":
        hang(gate, fd, txn_id, caller)
        return
    zombie(gate, txn_id, caller)
    gate.close()


if __name__ == "__main__":
    main()
