"""A gate client whose clock is wrong by OFFSET seconds.

``python skewed_clock.py URL NAMESPACE OFFSET [CALLER]``. Python's ``time.time``/
``time.time_ns`` and ``datetime.datetime.now``/``utcnow``/``today`` are shifted by OFFSET before
effectgate is imported. (Under ``faketime``, which shifts the whole process's clock, the test
passes 0.) Reads one JSON command per line on stdin and answers one JSON line:
``{"op": "begin", "key": K, "lease": S}``, ``{"op": "extend", "key": K, "seconds": S}``,
``{"op": "get", "key": K}``, ``{"op": "clock"}``. CALLER ``async`` (default ``sync``) awaits
``abegin``, ``aextend_lease`` and ``aget`` on one event loop kept for the whole session.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
import time
from typing import Any

OFFSET = float(sys.argv[3])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + OFFSET  # type: ignore[assignment]
time.time_ns = lambda: _time_ns() + int(OFFSET * 1e9)  # type: ignore[assignment]
_real_datetime = datetime.datetime


class _SkewedDatetime(_real_datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
        return _real_datetime.now(tz) + datetime.timedelta(seconds=OFFSET)

    @classmethod
    def utcnow(cls) -> Any:  # type: ignore[override]
        return _real_datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(
            seconds=OFFSET
        )

    @classmethod
    def today(cls) -> Any:  # type: ignore[override]
        return cls.now()


datetime.datetime = _SkewedDatetime  # type: ignore[misc]

import effectgate as eg  # noqa: E402 - after the clock is skewed


def main() -> None:
    url, namespace = sys.argv[1:3]
    caller = sys.argv[4] if len(sys.argv) > 4 else "sync"
    runner = asyncio.Runner()
    gate = eg.Gate(url, namespace=namespace)
    begin: Any = gate.begin
    extend: Any = gate.extend_lease
    get: Any = gate.get
    if caller == "async":
        begin = lambda **kw: runner.run(gate.abegin(**kw))  # noqa: E731
        extend = lambda *a: runner.run(gate.aextend_lease(*a))  # noqa: E731
        get = lambda key: runner.run(gate.aget(key))  # noqa: E731
    held: dict[str, eg.BeginDecision] = {}
    payload = {"order": "o1"}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out: dict[str, Any] = {"op": op}
        if op == "clock":
            out["time"] = time.time()
            out["datetime_now"] = datetime.datetime.now(datetime.UTC).timestamp()
        elif op == "begin":
            d = begin(effect_type="job.run", key=cmd["key"], payload=payload,
                      lease_seconds=cmd["lease"])
            if d.decision is eg.Decision.EXECUTE:
                held[cmd["key"]] = d
            out.update(decision=d.decision.value, expires=d.lease_expires_epoch,
                       retry_after=d.retry_after_seconds, reason=d.reason)
        elif op == "extend":
            expiry = extend(held[cmd["key"]], cmd["seconds"])
            out["expires"] = expiry.timestamp()
        elif op == "get":
            record = get(cmd["key"])
            out.update(state=record.state.value, reason=record.reason)
        out["store_now"] = gate.store.now()
        print(json.dumps(out), flush=True)
    gate.close()
    runner.close()


if __name__ == "__main__":
    main()
