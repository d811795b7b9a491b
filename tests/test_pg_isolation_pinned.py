"""The store pins READ COMMITTED on its Postgres connections, whatever the server's default
(red team, round 10): its compare-and-set statements rely on READ COMMITTED's re-check of a
row after a lock wait. Under a server default of SERIALIZABLE, eight threads beginning the
same few keys under a spend ceiling got ``StoreError: SerializationFailure`` (31 to 52 times
in 40 rounds) instead of an answer."""

from __future__ import annotations

import threading
import uuid

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres

POLICY = {"effects": {"pay.gov": {"budget": {"per_run_micros": 10**12}}}}


@pytest.mark.parametrize("level", ["serializable", "repeatable read"])
def test_races_under_a_stricter_server_default_are_answered(level: str) -> None:
    require_postgres()
    namespace = f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"
    url = f"{PG_URL}?options=-c%20default_transaction_isolation%3D{level.replace(' ', '%5C%20')}"
    gates = [eg.Gate(url, POLICY, namespace=namespace) for _ in range(6)]
    answers: list[str] = []
    errors: list[BaseException] = []

    def go(gate: eg.Gate, key: str) -> None:
        try:
            d = gate.begin(effect_type="pay.gov", key=key, payload={}, run_id="r",
                           estimated_cost_micros=1)
            answers.append(d.decision.value)
            if d.decision is eg.Decision.EXECUTE:
                gate.report(d, "failed", error="declined")
        except BaseException as err:  # every error is the finding
            errors.append(err)

    try:
        with gates[0].store.engine.connect() as conn:  # the store's own session settings
            from sqlalchemy import text
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
        for n in range(12):
            threads = [threading.Thread(target=go, args=(g, f"k{n % 3}")) for g in gates]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert errors == [], [f"{type(e).__name__}: {e}" for e in errors[:3]]
        assert len(answers) == 72 and "execute" in answers
    finally:
        for gate in gates:
            gate.close()
