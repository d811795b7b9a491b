"""A DBOS application with one gated step, for crash tests: one process runs the workflow and
is killed, a new one recovers it.

``python durable_dbos.py STORE_URL NAMESPACE SYSTEM_DB LEDGER WORKFLOW_ID MODE``

* ``run``: start the workflow ``settle(txn_id="T1")`` under WORKFLOW_ID. Its step, a gated
  refund, writes ``LEDGER.ready`` and waits for ``LEDGER.go`` (so the test can act first),
  then performs the side effect (one line appended to LEDGER). With ``$KILL_IN_BODY`` set it
  then SIGKILLs itself, before the gate records the outcome.
* ``recover``: launch DBOS, which recovers the pending workflow; print its outcome as JSON.
* ``fork``: fork the workflow from the gated step and print the fork's outcome as JSON.

The outcome is ``{"result": ...}`` or ``{"error": class name, "message", "key"}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dbos import DBOS

import effectgate as eg
from effectgate.integrations.durable.dbos import effect_step

store, namespace, system_db, ledger_path, workflow_id, mode = sys.argv[1:7]
ledger = Path(ledger_path)
gate = eg.Gate(store, namespace=namespace)
DBOS(config={"name": "effectgate-crash", "system_database_url": system_db,
             "application_version": "crash-test"})


@effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", lease_seconds=1.0,
             step={"retries_allowed": True, "max_attempts": 2, "interval_seconds": 0.05})
def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
    Path(f"{ledger}.ready").write_text(str(os.getpid()))
    while not Path(f"{ledger}.go").exists():
        time.sleep(0.01)
    with ledger.open("a") as out:
        out.write(f"refund {txn_id} by {os.getpid()}\n")
        out.flush()
        os.fsync(out.fileno())
    if os.environ.get("KILL_IN_BODY"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"refunded": amount_cents, "txn": txn_id}


@DBOS.workflow()
def settle(txn_id: str) -> dict[str, Any]:
    return refund(txn_id, 500)


def outcome(handle: Any) -> dict[str, Any]:
    try:
        # Polled every 50 ms, not DBOS's default 1 s: the outcome is known as soon as it lands.
        return {"result": handle.get_result(polling_interval_sec=0.05)}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err),
                "key": getattr(err, "key", None)}


DBOS.launch()
try:
    if mode == "run":
        from dbos import SetWorkflowID

        with SetWorkflowID(workflow_id):
            print(json.dumps(outcome(DBOS.start_workflow(settle, "T1"))), flush=True)
    elif mode == "recover":
        print(json.dumps(outcome(DBOS.retrieve_workflow(workflow_id))), flush=True)
    elif mode == "fork":
        print(json.dumps(outcome(DBOS.fork_workflow(workflow_id, 1))), flush=True)
except BaseException:
    DBOS.destroy()
    raise
# The outcome is printed, and it was read back from DBOS's system database, so every write it
# depends on is committed: exit without DBOS.destroy()'s second of joining idle threads.
os._exit(0)
