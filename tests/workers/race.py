"""G2 racer: one OS process of many, all gating the same keys at once.

``python race.py URL NAMESPACE EFFECTS_FILE N_KEYS MODE ORDER``. Prints ``ready`` once its
gate is open, waits for a line on stdin (the start gun), then gates every key, in the order of
its rivals of the same ORDER (``forward`` or ``backward``): those contend on every key, and
the two directions meet in the middle, so that no one racer, run ahead, wins every key. The
body's only side effect is one line appended (``O_APPEND``, one ``write``) to EFFECTS_FILE:
that file, not the store, counts executions. MODE ``decorator`` uses ``@gate.effect``;
``protocol`` calls ``begin``/``report`` by hand. Prints one JSON object: what each key
answered in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

import effectgate as eg


def main() -> None:
    url, namespace, effects_file, n_keys, mode, order = sys.argv[1:7]
    gate = eg.Gate(url, namespace=namespace, lease_seconds=30)
    fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    me = f"{mode}-{os.getpid()}"

    def side_effect(order_id: str) -> dict[str, Any]:
        os.write(fd, f"{order_id} {me}\n".encode())
        return {"order_id": order_id, "by": me}

    @gate.effect("charge:{order_id}", effect_type="payment.charge")
    def charge(order_id: str, cents: int) -> dict[str, Any]:
        return side_effect(order_id)

    def by_protocol(order_id: str, cents: int) -> Any:
        d = gate.begin(effect_type="payment.charge", key=f"charge:{order_id}",
                       payload={"order_id": order_id, "cents": cents})
        if d.decision is eg.Decision.EXECUTE:
            result = side_effect(order_id)
            gate.report(d, "committed", result=result)
            return result
        if d.decision is eg.Decision.DUPLICATE:
            return d.result
        raise eg.refusal(d)

    call = charge if mode == "decorator" else by_protocol
    with contextlib.suppress(eg.UnknownEffect):  # connect before the start gun
        gate.get("charge:warm-up")
    print("ready", flush=True)
    sys.stdin.readline()
    answers: dict[str, Any] = {}
    in_flight = 0
    count = int(n_keys)
    for i in range(count) if order == "forward" else reversed(range(count)):
        order_id = f"o{i}"
        while True:
            try:
                answers[order_id] = call(order_id, 100 + i)
                break
            except eg.EffectInFlight as err:
                in_flight += 1
                time.sleep(min(err.retry_after_seconds or 0.01, 0.01))
    print(json.dumps({"who": me, "answers": answers, "in_flight": in_flight}), flush=True)
    os.close(fd)
    gate.close()


if __name__ == "__main__":
    main()
