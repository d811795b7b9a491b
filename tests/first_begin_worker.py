"""A worker's way to its first begin, run as a script by the start-up tests: a gated tool
called twice (and, with ``async``, an async one), then the heavy modules it imported.

Usage: ``python first_begin_worker.py URL NAMESPACE [async]``."""

from __future__ import annotations

import sys

import effectgate as eg

__all__: list[str] = []

url, namespace, *flags = sys.argv[1:]
gate = eg.Gate(url, namespace=namespace, policy=False)


@gate.effect("w:{n}", effect_type="t.start")
def work(n: int) -> int:
    return n


assert work(1) == 1 and work(1) == 1
record = gate.get("w:1")
assert record is not None and record.state is eg.State.COMMITTED
if "async" in flags:
    import asyncio

    @gate.effect("a:{n}", effect_type="t.start")
    async def awork(n: int) -> int:
        return n

    assert asyncio.run(awork(2)) == 2
    record = gate.get("a:2")
    assert record is not None and record.state is eg.State.COMMITTED
print(sorted(m for m in ("sqlalchemy", "asyncio", "opentelemetry.trace") if m in sys.modules))
