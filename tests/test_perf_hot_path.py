"""The executed effect's hot path (issue 24: an effect on SQLite within 1.3x of the raw driver):
how many Python calls it makes, counted (cProfile's count is the same on a busy machine,
where microseconds are not), and that what was made cheaper on it still checks everything —
a result that is unfinished work by its type, a decision that does not hold the effect, the
same SHA-256 digests whichever implementation made them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate import payload, request

# Before the issue-24 changes an executed effect made 133 calls here (135 in effectgate bench
# --only core, "Python calls / effect") and a refusal from the store 67 (68 there).
_EFFECT_CALLS = 125
_REFUSAL_CALLS = 68


_COUNT = """
import sys
import effectgate as eg
from effectgate.bench.core_paths import gated, python_calls

gate = eg.Gate(f"sqlite:///{sys.argv[1]}/calls.db", namespace="calls", policy=False)
cold = eg.Gate(gate.url, namespace="calls", memo_size=0, policy=False)
fn, cold_fn = gated(gate), gated(cold)
for key in ("warm-1", "warm-2"):  # first calls open connections, compile texts
    fn(key)
    cold_fn(key)
keys = [f"k{i}" for i in range(20)]
effect, refusal = python_calls(fn, keys), python_calls(cold_fn, keys)
assert gate.get("bench:k0").state is eg.State.COMMITTED
print(effect, refusal)
"""


def test_an_executed_effect_and_a_refusal_stay_within_their_python_calls(
        tmp_path: Path) -> None:
    """Counted in a fresh interpreter: a test before this one in the same worker may have
    imported OpenTelemetry, whose look for a provider then costs calls of its own."""
    done = subprocess.run([sys.executable, "-c", _COUNT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    effect, refusal = map(float, done.stdout.split())
    assert effect <= _EFFECT_CALLS, effect
    assert refusal <= _REFUSAL_CALLS, refusal


class _Awaitable(dict):  # type: ignore[type-arg]
    """A dict by its base, unfinished work by its ``__await__``."""

    def __await__(self) -> Any:
        yield None


def test_a_result_of_a_plain_type_subclass_that_awaits_is_still_unfinished(
        gate: eg.Gate) -> None:
    """The check that skips plain result types goes by the exact type: a subclass of one with
    ``__await__`` is unfinished work, recorded AMBIGUOUS and refused."""

    @gate.effect("odd:{n}")
    def odd(n: int) -> Any:
        return _Awaitable(done=False)

    with pytest.raises(eg.ConfigError, match="unfinished"):
        odd(1)
    assert gate.get("odd:1").state is eg.State.AMBIGUOUS

    @gate.effect("plain:{n}")
    def plain(n: int) -> Any:
        return {"done": True}

    assert plain(1) == {"done": True}
    assert gate.get("plain:1").state is eg.State.COMMITTED


def test_the_common_report_still_checks_the_decision_holds(gate: eg.Gate) -> None:
    """The COMMITTED report's inline checks of the decision: another namespace's decision, a
    decision without its secret and a duplicate are refused, nothing written; the real
    holder's report lands after them."""
    d = gate.begin(effect_type="t.held", key="held:1", payload={})
    assert d.decision is eg.Decision.EXECUTE
    for other in (d._replace(namespace=f"{gate.namespace}-b"), d._replace(lease_secret=None),
                  d._replace(decision=eg.Decision.DUPLICATE)):
        with pytest.raises(eg.InvalidTransition):
            gate.report(other, eg.Outcome.COMMITTED, result={"n": 1})
        assert gate.get("held:1").state is eg.State.IN_FLIGHT
    gate.report(d, eg.Outcome.COMMITTED, result={"n": 1})
    assert gate.get("held:1").result == {"n": 1}


@pytest.mark.parametrize("size", [0, 40, 100, 108, 112, 178, 5000])  # around 128 bytes
def test_payload_hashes_are_sha256_of_the_canonical_json_at_every_length(size: int) -> None:
    """Short texts are hashed by CPython's own SHA-256, longer ones by OpenSSL's: the digest
    is the one ``hashlib.sha256`` gives either way (stored hashes compare across versions)."""
    value = {"a": "x" * size, "b": 1}
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert payload.payload_hash(value) == hashlib.sha256(text.encode()).hexdigest()
    secret = "s" * min(size, 128)
    raw, digest = request._issue(secret)
    assert raw == secret and digest == hashlib.sha256(secret.encode()).hexdigest()
    assert request.secret_hash(secret) == digest


def test_a_short_payload_and_a_lease_secret_are_not_hashed_by_openssl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path's two hashes (a tool call's few arguments, its lease secret) skip
    OpenSSL's per-call set-up; a long payload still goes to it."""
    if getattr(payload, "short_sha256", None) is hashlib.sha256:
        pytest.skip("this Python has no built-in SHA-256")
    seen: list[int] = []
    real = hashlib.sha256

    def spy(data: bytes = b"") -> Any:
        seen.append(len(data))
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", spy)
    payload.payload_hash({"txn_id": "t-1", "amount_cents": 500})
    request.LeaseSecret().hash  # noqa: B018 - made on first use
    assert seen == []
    payload.payload_hash({"text": "x" * 1000})
    assert seen and seen[-1] > 128
