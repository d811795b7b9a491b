"""Durable engines: effects that run at most once where the engine runs them at least once.

A durable engine records a step's (or an activity's) outcome only after it returns, so a crash
between the side effect and that record runs it again. One module per engine, each importing
its engine lazily:

* :mod:`.dbos` — :func:`~effectgate.integrations.durable.dbos.effect_step`, a gated DBOS step
  (extra ``dbos``);
* :mod:`.temporal` — :func:`~effectgate.integrations.durable.temporal.effect_activity`, a
  gated Temporal activity whose heartbeats extend the lease (extra ``temporal``).

Both put the gate inside the engine's unit of work: the engine's re-run (recovery, retry) asks
the gate again, which answers a committed effect from the store and refuses an AMBIGUOUS one
with a non-retryable error that names the operator's next step. What the workflow does outside
its gated steps is the engine's business.
"""

__all__: list[str] = []
