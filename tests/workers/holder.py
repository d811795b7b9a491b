"""A holder of one effect that another process kills, or pauses and wakes as a zombie.

``python holder.py URL NAMESPACE EFFECTS_FILE TXN_ID LEASE MODE``

* ``hang``: calls a gated refund (the decorator's path); the body performs the side effect
  (one line appended to EFFECTS_FILE), prints ``{"effect_id", "token", "attempt"}`` and then
  waits forever for a reply that never comes, until the test SIGKILLs it.
* ``zombie``: ``begin`` by hand, prints the same JSON, then waits for a line on stdin (the
  test pauses it with SIGSTOP meanwhile). When woken it heartbeats (``extend_lease``) before
  acting, as a careful holder does, and tries to report ``committed`` anyway; it prints what
  each call answered and exits.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import effectgate as eg


def main() -> None:
    url, namespace, effects_file, txn_id, lease, mode = sys.argv[1:7]
    gate = eg.Gate(url, namespace=namespace, lease_seconds=float(lease))
    fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    if mode == "hang":

        @gate.effect("refund:{txn_id}", effect_type="payment.refund")
        def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
            os.write(fd, f"refund:{txn_id} holder {os.getpid()}\n".encode())
            d = eg.current_effect()
            print(json.dumps({"effect_id": d.effect_id, "token": d.lease_token,
                              "secret": d.lease_secret, "attempt": d.attempt}), flush=True)
            sys.stdin.readline()  # the vendor's reply never arrives
            return {"refund_id": "never"}

        refund(txn_id, 500)
        return

    d = gate.begin(effect_type="payment.refund", key=f"refund:{txn_id}",
                   payload={"txn_id": txn_id, "amount_cents": 500})
    print(json.dumps({"effect_id": d.effect_id, "token": d.lease_token,
                      "secret": d.lease_secret, "attempt": d.attempt,
                      "decision": d.decision.value}), flush=True)
    sys.stdin.readline()  # paused here (SIGSTOP) far past the lease
    answers: dict[str, Any] = {}
    for name, call in (
        ("extend_lease", lambda: gate.extend_lease(d, 30)),
        ("report", lambda: gate.report(d, "committed", result={"by": "zombie"})),
    ):
        try:
            call()
            answers[name] = "accepted"
        except eg.StaleLease as err:
            answers[name] = {"error": "StaleLease", "state": err.state, "reason": err.reason}
    print(json.dumps(answers), flush=True)
    gate.close()


if __name__ == "__main__":
    main()
