"""Bad input, on SQLite and Postgres: each kind raises a typed error and leaves the store unchanged.

Every case runs against a store that already holds a committed effect (``refund:done``) and one
in flight (held by the test), so "unchanged" means something: the snapshot of the namespace
(effects with their history, approvals, spend) is compared before and after. One gate per
backend serves every case (a fresh in-flight effect each), to keep the many cases cheap.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres, snapshot

PAYLOAD = {"txn_id": "txn_1", "amount_cents": 500}


class Seeded:
    """A gate whose namespace holds a committed effect and, per case, one in flight."""

    def __init__(self, gate: eg.Gate, tmp: Path) -> None:
        self.gate = gate
        self.tmp = tmp
        done = gate.begin(effect_type="payment.refund", key="refund:done", payload=PAYLOAD)
        gate.report(done, "committed", result={"refund_id": "re_1"})
        self.done = done
        self.duplicate = gate.begin(effect_type="payment.refund", key="refund:done",
                                    payload=PAYLOAD)
        self._numbers = itertools.count()
        self.other = gate.begin(effect_type="payment.refund", key="refund:other",
                                payload=PAYLOAD, lease_seconds=600)
        self.held = self.hold()

    def hold(self) -> Any:
        """Reserve a fresh effect and hold it (a long lease) for the next case."""
        self.held = self.gate.begin(effect_type="payment.refund",
                                    key=f"refund:held-{next(self._numbers)}",
                                    payload=PAYLOAD, lease_seconds=600)
        return self.held

    def begin(self, **overrides: Any) -> Any:
        request: dict[str, Any] = {"effect_type": "payment.refund", "key": "refund:new",
                                   "payload": PAYLOAD}
        request.update(overrides)
        return self.gate.begin(**request)

    def run(self, template: str, arguments: dict[str, Any], **options: Any) -> Any:
        """Gate one call through EffectSpec (the decorator's path); the body must not run."""
        def body() -> None:
            raise AssertionError("the body ran despite bad input")

        spec = eg.EffectSpec(self.gate, template, effect_type="payment.refund", **options)
        return spec.run(arguments, body)

    def report(self, *args: Any, **kwargs: Any) -> None:
        self.gate.report(*args, **kwargs)


def _cycle() -> dict[str, Any]:
    payload: dict[str, Any] = {"txn_id": "t"}
    payload["self"] = payload
    return payload


def _cyclic_list() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


def _deep() -> dict[str, Any]:
    value: Any = "bottom"
    for _ in range(20_000):
        value = [value]
    return {"deep": value}


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


class _Order:
    """A data object a template may read plain attributes of (and nothing else)."""

    def __init__(self) -> None:
        self.id = "o_1"
        self._secret = "s3cr3t"
        self.items = ["a", "b"]

    def total(self) -> int:
        return 5


def _policy_file(tmp: Path, text: str) -> Path:
    path = tmp / f"effectgate-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _generator(x: Any) -> Any:
    yield x


async def _async_generator(x: Any) -> Any:
    yield x


def _spec(s: Seeded, **options: Any) -> Any:
    return eg.EffectSpec(s.gate, "refund:{txn_id}", effect_type="payment.refund", **options)


# Characters that must never be part of a key: each would make a look-alike key distinct, or
# break a line of a record or a terminal.
INVISIBLE = {
    "U+2028 line separator": "\u2028", "U+2029 paragraph separator": "\u2029",
    "U+0085 next line": "\x85", "U+200B zero-width space": "\u200b",
    "U+200C zero-width non-joiner": "\u200c", "U+200D zero-width joiner": "\u200d",
    "U+200E left-to-right mark": "\u200e", "U+202E right-to-left override": "\u202e",
    "U+2066 left-to-right isolate": "\u2066", "U+2060 word joiner": "\u2060",
    "U+FEFF byte order mark": "\ufeff", "U+00AD soft hyphen": "\xad",
    "U+00A0 no-break space": "\xa0", "U+3000 ideographic space": "\u3000",
    "ESC [2J (clear screen)": "\x1b[2J", "ESC ] title BEL": "\x1b]0;owned\x07",
    "U+009B CSI": "\x9b31m", "DEL": "\x7f", "tab": "\t", "carriage return": "\r",
    "U+2007 figure space": "\u2007", "U+180E Mongolian vowel separator": "\u180e",
    "U+034F combining grapheme joiner": "\u034f", "U+FE0F variation selector": "\ufe0f",
    "U+3164 Hangul filler": "\u3164",
}


Case = Callable[[Seeded], Any]
E = eg
CASES: list[tuple[str, Case, type[eg.EffectGateError]]] = [
    # -- key templates that cannot be resolved (G7: before anything runs) ----------------
    ("template names a missing argument",
     lambda s: s.run("refund:{txn_id}", {"amount_cents": 5}), E.EffectKeyError),
    ("template attribute missing",
     lambda s: s.run("refund:{order.id}", {"order": {"no_id": 1}}), E.EffectKeyError),
    ("template item missing",
     lambda s: s.run("refund:{order[id]}", {"order": {"no_id": 1}}), E.EffectKeyError),
    ("template field None", lambda s: s.run("refund:{t}", {"t": None}), E.EffectKeyError),
    ("template field empty string", lambda s: s.run("refund:{t}", {"t": " "}), E.EffectKeyError),
    ("template field float", lambda s: s.run("refund:{t}", {"t": 1.5}), E.EffectKeyError),
    ("template field bool", lambda s: s.run("refund:{t}", {"t": True}), E.EffectKeyError),
    ("template field list", lambda s: s.run("refund:{t}", {"t": ["a"]}), E.EffectKeyError),
    ("template field dict", lambda s: s.run("refund:{t}", {"t": {"a": 1}}), E.EffectKeyError),
    ("template field bytes", lambda s: s.run("refund:{t}", {"t": b"raw"}), E.EffectKeyError),
    ("template field datetime",
     lambda s: s.run("refund:{t}", {"t": datetime.datetime(2026, 1, 1)}), E.EffectKeyError),
    ("template unbalanced brace", lambda s: s.run("refund:{txn_id", PAYLOAD), E.EffectKeyError),
    ("template positional field", lambda s: s.run("refund:{}", PAYLOAD), E.EffectKeyError),
    ("template conversion", lambda s: s.run("refund:{txn_id!r}", PAYLOAD), E.EffectKeyError),
    ("template bad format spec",
     lambda s: s.run("refund:{amount_cents:05q}", PAYLOAD), E.EffectKeyError),
    ("template renders 10,000 characters",
     lambda s: s.run("refund:{t}", {"t": "x" * 10_000}), E.EffectKeyError),
    ("template renders a NUL", lambda s: s.run("refund:{t}", {"t": "a\x00b"}), E.EffectKeyError),
    # The common template's short way (text around one plain {name}) at its edges.
    ("template field makes the key one past the longest",
     lambda s: s.run("refund:{t}", {"t": "x" * 506}), E.EffectKeyError),
    ("template text after the field makes the key one past the longest",
     lambda s: s.run("{t}" + "y" * 500, {"t": "x" * 13}), E.EffectKeyError),
    ("template int field makes the key one past the longest",
     lambda s: s.run("r" * 412 + "{t}", {"t": 10**100}), E.EffectKeyError),
    ("template renders a lone surrogate",
     lambda s: s.run("refund:{t}", {"t": "a\ud800"}), E.EffectKeyError),
    ("decorated call with a missing argument",
     lambda s: s.gate.effect("refund:{txn_id}", effect_type="x")(
         lambda txn_id, amount_cents: None)("t1"), E.ConfigError),
    # -- literal keys -----------------------------------------------------------------------
    ("key of 10,000 characters", lambda s: s.begin(key="k" * 10_000), E.EffectKeyError),
    ("key with a NUL character", lambda s: s.begin(key="refund:\x00"), E.EffectKeyError),
    ("key with a newline", lambda s: s.begin(key="refund:a\nb"), E.EffectKeyError),
    ("key with a lone surrogate", lambda s: s.begin(key="refund:\udc80"), E.EffectKeyError),
    ("key not a str", lambda s: s.begin(key=12345), E.EffectKeyError),
    ("key blank", lambda s: s.begin(key="   "), E.EffectKeyError),
    ("get with a 10,000-character key", lambda s: s.gate.get("k" * 10_000), E.EffectKeyError),
    # -- payloads -------------------------------------------------------------------------
    ("payload None", lambda s: s.begin(payload=None), E.PayloadError),
    ("payload bytes as a whole", lambda s: s.begin(payload=b'{"txn_id": 1}'), E.PayloadError),
    ("payload a list", lambda s: s.begin(payload=[1, 2]), E.PayloadError),
    ("payload NaN", lambda s: s.begin(payload={"amount": float("nan")}), E.PayloadError),
    ("payload infinity", lambda s: s.begin(payload={"amount": float("inf")}), E.PayloadError),
    ("payload -infinity", lambda s: s.begin(payload={"a": [float("-inf")]}), E.PayloadError),
    ("payload Decimal NaN",
     lambda s: s.begin(payload={"amount": decimal.Decimal("NaN")}), E.PayloadError),
    ("payload Decimal infinity",
     lambda s: s.begin(payload={"amount": decimal.Decimal("-Infinity")}), E.PayloadError),
    ("payload cyclic dict", lambda s: s.begin(payload=_cycle()), E.PayloadError),
    ("payload cyclic list", lambda s: s.begin(payload={"a": _cyclic_list()}), E.PayloadError),
    ("payload nested 20,000 deep", lambda s: s.begin(payload=_deep()), E.PayloadError),
    ("payload non-str mapping key", lambda s: s.begin(payload={1: "x"}), E.PayloadError),
    ("payload naive datetime",
     lambda s: s.begin(payload={"at": datetime.datetime(2026, 1, 1)}), E.PayloadError),
    ("payload arbitrary object", lambda s: s.begin(payload={"o": object()}), E.PayloadError),
    ("payload lone surrogate", lambda s: s.begin(payload={"note": "\ud83d"}), E.PayloadError),
    ("payload lone surrogate, nested",
     lambda s: s.begin(payload={"n": {"x": ["\udfff", 1.5]}}), E.PayloadError),
    ("payload int of 5,000 digits", lambda s: s.begin(payload={"n": 10**5000}),
     E.PayloadError),
    ("payload Decimal 1E+100000000 (used to hang)",
     lambda s: s.begin(payload={"n": [decimal.Decimal("1E+100000000")]}), E.PayloadError),
    ("payload Decimal 1E-100000000",
     lambda s: s.begin(payload={"n": decimal.Decimal("1E-100000000")}), E.PayloadError),
    ("template field int of 5,000 digits",
     lambda s: s.run("refund:{t}", {"t": 10**5000}), E.EffectKeyError),
    ("payload differs under an existing key",
     lambda s: s.begin(key="refund:done", payload={**PAYLOAD, "amount_cents": 501}),
     E.PayloadMismatch),
    ("decorated call, payload NaN",
     lambda s: s.run("refund:{txn_id}", {"txn_id": "t9", "amount": float("nan")}),
     E.PayloadError),
    ("compensation not JSON", lambda s: s.begin(compensation={"o": object()}), E.PayloadError),
    # -- results ---------------------------------------------------------------------------
    ("result not JSON", lambda s: s.report(s.held, "committed", result=object()),
     E.PayloadError),
    ("result NaN", lambda s: s.report(s.held, "committed", result={"x": float("nan")}),
     E.PayloadError),
    ("result int of 5,000 digits",
     lambda s: s.report(s.held, "committed", result=[10**5000]), E.PayloadError),
    ("result cyclic", lambda s: s.report(s.held, "committed", result=_cycle()),
     E.PayloadError),
    ("result with a lone surrogate",
     lambda s: s.report(s.held, "committed", result={"reply": "\ud800"}), E.PayloadError),
    ("resolve with a result not JSON",
     lambda s: s.gate.resolve(s.held.key, "committed", by="ops", result={1, object()}),
     E.PayloadError),
    # -- outcomes and reports ------------------------------------------------------------
    ("unknown outcome string", lambda s: s.report(s.held, "done"), E.InvalidTransition),
    ("outcome None", lambda s: s.report(s.held, None), E.InvalidTransition),
    ("outcome in the wrong case", lambda s: s.report(s.held, "COMMITTED "),
     E.InvalidTransition),
    ("report with a wrong token",
     lambda s: s.report(s.held.lease._replace(token=s.held.lease_token + 7), "committed"),
     E.StaleLease),
    ("report with a guessed secret",
     lambda s: s.report(s.held.lease._replace(secret="A" * 22), "committed"), E.StaleLease),
    ("report with another effect's proof on this key",
     lambda s: s.report(s.other.lease._replace(key=s.held.key), "committed"),
     E.StaleLease),
    ("report with an unknown key", lambda s: s.report(eg.Lease("refund:nope", 1, "x" * 22),
                                                      "committed"), E.UnknownEffect),
    ("report by effect id", lambda s: s.report(s.held.effect_id, "committed"), E.ConfigError),
    ("report with a token of 2**63",
     lambda s: s.report(s.held.lease._replace(token=2**63), "committed"), E.ConfigError),
    ("report with a bool token",
     lambda s: s.report(s.held.lease._replace(token=True), "committed"), E.ConfigError),
    ("report with an empty secret",
     lambda s: s.report(s.held.lease._replace(secret=""), "committed"), E.ConfigError),
    ("report with a secret not a str",
     lambda s: s.report(s.held.lease._replace(secret=b"x"), "committed"), E.ConfigError),
    ("report with a bad key in the proof",
     lambda s: s.report(s.held.lease._replace(key="a\u2028b\x00"), "committed"),
     E.EffectKeyError),
    ("report of a duplicate decision", lambda s: s.report(s.duplicate, "committed"),
     E.InvalidTransition),
    ("report on a committed effect", lambda s: s.report(s.done, "failed"), E.StaleLease),
    ("report error not a str", lambda s: s.report(s.held, "failed", error=404),
     E.ConfigError),
    ("report negative actual cost",
     lambda s: s.report(s.held, "committed", actual_cost_micros=-1), E.ConfigError),
    ("extend lease by negative seconds", lambda s: s.gate.extend_lease(s.held, -5),
     E.ConfigError),
    ("extend lease with a wrong token",
     lambda s: s.gate.extend_lease(s.held.lease._replace(token=999), 30), E.StaleLease),
    ("extend lease with a guessed secret",
     lambda s: s.gate.extend_lease(s.held.lease._replace(secret="B" * 22), 30), E.StaleLease),
    ("extend lease by effect id", lambda s: s.gate.extend_lease(s.held.effect_id, 30),
     E.ConfigError),
    ("resolve a live lease without force",
     lambda s: s.gate.resolve(s.held.key, "failed", by="ops"), E.InvalidTransition),
    ("resolve with force not a bool",
     lambda s: s.gate.resolve(s.held.key, "failed", by="ops", force=1), E.ConfigError),
    # -- resolve ---------------------------------------------------------------------------
    ("resolve of an unknown key", lambda s: s.gate.resolve("refund:nope", "failed", by="ops"),
     E.UnknownEffect),
    ("resolve as ambiguous",
     lambda s: s.gate.resolve(s.held.key, "ambiguous", by="ops"), E.InvalidTransition),
    ("resolve with an unknown outcome",
     lambda s: s.gate.resolve(s.held.key, "maybe", by="ops"), E.InvalidTransition),
    ("resolve a committed effect as failed",
     lambda s: s.gate.resolve("refund:done", "failed", by="ops"), E.InvalidTransition),
    ("resolve without an operator", lambda s: s.gate.resolve(s.held.key, "failed", by=""),
     E.ConfigError),
    ("resolve by None", lambda s: s.gate.resolve(s.held.key, "failed", by=None),
     E.ConfigError),
    ("resolve a 10,000-character key",
     lambda s: s.gate.resolve("k" * 10_000, "failed", by="ops"), E.EffectKeyError),
    # -- leases, costs, vendors and other options ---------------------------------------------
    ("lease of 0 seconds", lambda s: s.begin(lease_seconds=0), E.ConfigError),
    ("negative lease", lambda s: s.begin(lease_seconds=-1), E.ConfigError),
    ("lease NaN", lambda s: s.begin(lease_seconds=float("nan")), E.ConfigError),
    ("lease infinite", lambda s: s.begin(lease_seconds=float("inf")), E.ConfigError),
    ("lease as a str", lambda s: s.begin(lease_seconds="30"), E.ConfigError),
    ("lease as a bool", lambda s: s.begin(lease_seconds=True), E.ConfigError),
    ("lease of a year", lambda s: s.begin(lease_seconds=365 * 86400), E.ConfigError),
    ("negative cost", lambda s: s.begin(estimated_cost_micros=-1), E.ConfigError),
    ("cost as a float", lambda s: s.begin(estimated_cost_micros=1.5), E.ConfigError),
    ("cost as a bool", lambda s: s.begin(estimated_cost_micros=True), E.ConfigError),
    ("cost as a str", lambda s: s.begin(estimated_cost_micros="100"), E.ConfigError),
    ("cost function raises",
     lambda s: s.run("refund:{txn_id}", PAYLOAD, cost_micros=lambda txn_id: 1 // 0),
     E.ConfigError),
    ("unknown vendor", lambda s: s.begin(vendor="paypal"), E.ConfigError),
    ("unknown vendor on a spec", lambda s: s.run("refund:{txn_id}", PAYLOAD, vendor="acme"),
     E.ConfigError),
    ("max_attempts 0", lambda s: s.begin(max_attempts=0), E.ConfigError),
    ("max_attempts as a str", lambda s: s.begin(max_attempts="3"), E.ConfigError),
    ("effect type empty", lambda s: s.begin(effect_type=""), E.ConfigError),
    ("effect type not a str", lambda s: s.begin(effect_type=5), E.ConfigError),
    # The vendor key's fields are joined by U+001F: ("acme", "payment.refund\x1fcharge") and
    # ("acme\x1fpayment.refund", "charge") gave two effects one vendor key.
    ("effect type with the vendor key's separator",
     lambda s: s.begin(effect_type="payment.refund\x1fcharge"), E.ConfigError),
    ("effect type with an escape sequence",
     lambda s: s.begin(effect_type="t\x1b[31mred"), E.ConfigError),
    ("effect type with a zero-width space",
     lambda s: s.begin(effect_type="payment\u200b.refund"), E.ConfigError),
    ("decorated effect type with a newline",
     lambda s: s.gate.effect("refund:{txn_id}", effect_type="payment\nrefund")(
         lambda txn_id: None)("t1"), E.ConfigError),
    ("run id of 300 characters", lambda s: s.begin(run_id="r" * 300), E.ConfigError),
    ("agent id with a NUL", lambda s: s.begin(agent_id="agent\x00"), E.ConfigError),
    ("run id with a lone surrogate", lambda s: s.begin(run_id="run\ud800"), E.ConfigError),
    ("group key not a str", lambda s: s.begin(group_key=["trip"]), E.ConfigError),
    # "trip:1" and "trip:1" + U+200B looked alike and were two groups: an unwind of the one an
    # operator reads missed the other's steps.
    ("group key with a zero-width space",
     lambda s: s.begin(group_key="trip:1\u200b"), E.ConfigError),
    ("group key with a line feed", lambda s: s.begin(group_key="trip:1\nx"), E.ConfigError),
    ("compensates_effect_id as a str", lambda s: s.begin(compensates_effect_id="7"),
     E.ConfigError),
    # A step of a group that claimed to be an undo was left out of the group's steps: its
    # unwind skipped it, and the report said the group was undone.
    ("an undo that is also a step of a saga group",
     lambda s: s.begin(group_key="trip:1", compensates_effect_id=s.done.effect_id,
                       compensation={"cancel": "hotel"}), E.ConfigError),
    ("gate namespace empty", lambda s: eg.Gate(s.gate.url, namespace=""), E.ConfigError),
    ("gate namespace with the vendor key's separator",
     lambda s: eg.Gate(s.gate.url, namespace="acme\x1fpayment.refund"), E.ConfigError),
    ("another namespace with a line separator",
     lambda s: s.gate.in_namespace("acme\u2028b"), E.ConfigError),
    ("gate with an unsupported database", lambda s: eg.Gate("mysql://root@localhost/x"),
     E.ConfigError),
    ("gate with an in-memory SQLite", lambda s: eg.Gate("sqlite://"), E.ConfigError),
    ("gate with a bad durability", lambda s: eg.Gate(s.gate.url, durability="fast"),
     E.ConfigError),
]

# -- issue 11: Unicode separators, format characters and escapes in keys ----------------------
for _what, _char in INVISIBLE.items():
    CASES.append((f"key with {_what}",
                  lambda s, c=_char: s.begin(key=f"refund:a{c}b"), E.EffectKeyError))
    CASES.append((f"template field renders {_what}",
                  lambda s, c=_char: s.run("refund:{t}", {"t": f"a{c}b"}), E.EffectKeyError))
for _what, _char in list(INVISIBLE.items())[:6]:
    CASES.append((f"get with {_what} in the key",
                  lambda s, c=_char: s.gate.get(f"refund:done{c}"), E.EffectKeyError))
    CASES.append((f"resolve with {_what} in the key",
                  lambda s, c=_char: s.gate.resolve(f"{s.held.key}{c}", "failed", by="ops",
                                                    force=True), E.EffectKeyError))
CASES += [
    # -- unwind: its checks now run in sagas.unwind (imported on first use), before any read
    ("unwind a group key with a NUL", lambda s: s.gate.unwind("g\x00", by="ops"),
     E.ConfigError),
    ("unwind a group key of 10,000 characters",
     lambda s: s.gate.unwind("g" * 10_000, by="ops"), E.ConfigError),
    ("unwind a group key that is not a str", lambda s: s.gate.unwind(7, by="ops"),
     E.ConfigError),
    ("unwind by nobody", lambda s: s.gate.unwind("g", by=""), E.ConfigError),
    ("unwind by a lone surrogate", lambda s: s.gate.unwind("g", by="op\ud800"), E.ConfigError),
    ("template literal with a zero-width space",
     lambda s: s.run("refund:\u200b{txn_id}", PAYLOAD), E.EffectKeyError),
    ("template literal with U+2028", lambda s: s.run("refund\u2028{txn_id}", PAYLOAD),
     E.EffectKeyError),
    ("literal template with a BOM", lambda s: s.run("\ufeffrefund:x", {}), E.EffectKeyError),
    ("report proof whose key has a bidi override",
     lambda s: s.report(s.held.lease._replace(key=s.held.key + "\u202e"), "committed"),
     E.EffectKeyError),
    ("list effects by a key prefix with a NUL",
     lambda s: s.gate.list_effects(key_prefix="refund:\x00"), E.ConfigError),
    ("agent id with a NUL and an escape", lambda s: s.begin(agent_id="a\x1b[2J\x00"),
     E.ConfigError),
    ("resolve note with a NUL",
     lambda s: s.gate.resolve(s.held.key, "failed", by="ops", note="n\x00", force=True),
     E.ConfigError),
    ("resolve by with a lone surrogate",
     lambda s: s.gate.resolve(s.held.key, "failed", by="op\ud800", force=True), E.ConfigError),
    ("resolve note of 10,000 characters",
     lambda s: s.gate.resolve(s.held.key, "failed", by="ops", note="n" * 10_000, force=True),
     E.ConfigError),
    # -- integers of 2**63 and more (what a BIGINT column cannot hold) ------------------------
    ("estimated cost of 2**63", lambda s: s.begin(estimated_cost_micros=2**63), E.ConfigError),
    ("estimated cost of 10**30", lambda s: s.begin(estimated_cost_micros=10**30),
     E.ConfigError),
    ("actual cost of 2**63 at report",
     lambda s: s.report(s.held, "committed", actual_cost_micros=2**63), E.ConfigError),
    ("actual cost of 10**40 at a failed report",
     lambda s: s.report(s.held, "failed", actual_cost_micros=10**40), E.ConfigError),
    ("actual cost as a float", lambda s: s.report(s.held, "committed", actual_cost_micros=1.0),
     E.ConfigError),
    ("compensates_effect_id of 2**63", lambda s: s.begin(compensates_effect_id=2**63),
     E.ConfigError),
    ("compensates_effect_id of 0", lambda s: s.begin(compensates_effect_id=0), E.ConfigError),
    ("get by an id of 2**63", lambda s: s.gate.get_by_id(2**63), E.ConfigError),
    ("get by an id of -1", lambda s: s.gate.get_by_id(-1), E.ConfigError),
    ("list with a limit of 2**63", lambda s: s.gate.list_effects(limit=2**63), E.ConfigError),
    ("list before an id of 2**64", lambda s: s.gate.list_effects(before_id=2**64),
     E.ConfigError),
    ("list with a limit of 0", lambda s: s.gate.list_effects(limit=0), E.ConfigError),
    ("list with a limit of True", lambda s: s.gate.list_effects(limit=True),  # type: ignore[arg-type]
     E.ConfigError),
    ("list by an effect type of 201 characters",
     lambda s: s.gate.list_effects(effect_type="t" * 201), E.ConfigError),
    ("list by a run id that is not a str",
     lambda s: s.gate.list_effects(run_id=7), E.ConfigError),  # type: ignore[arg-type]
    ("prune older than a negative time",
     lambda s: s.gate.prune(datetime.timedelta(seconds=-1)), E.ConfigError),
    ("prune older than a number of seconds",
     lambda s: s.gate.prune(30), E.ConfigError),  # type: ignore[arg-type]
    ("max_attempts of 2**63", lambda s: s.begin(max_attempts=2**63), E.ConfigError),
    ("lease of 2**63 seconds", lambda s: s.begin(lease_seconds=2**63), E.ConfigError),
    ("lease of 10**400 seconds (float overflow)", lambda s: s.begin(lease_seconds=10**400),
     E.ConfigError),
    ("extend lease by 2**63 seconds", lambda s: s.gate.extend_lease(s.held, 2**63),
     E.ConfigError),
    ("report with a token of -1",
     lambda s: s.report(s.held.lease._replace(token=-1), "committed"), E.ConfigError),
    ("report with a token of 2**64",
     lambda s: s.report(s.held.lease._replace(token=2**64), "committed"), E.ConfigError),
    ("cost function returns 2**63",
     lambda s: s.run("refund:{txn_id}", PAYLOAD, cost_micros=lambda txn_id: 2**63),
     E.ConfigError),
    ("cost function returns a float",
     lambda s: s.run("refund:{txn_id}", PAYLOAD, cost_micros=lambda txn_id: 1.5),
     E.ConfigError),
    ("spec cost of 2**63", lambda s: s.run("refund:{txn_id}", PAYLOAD, cost_micros=2**63),
     E.ConfigError),
    # -- deep results (stored only when every reader can read them back) ---------------------
    ("result nested 201 deep", lambda s: s.report(s.held, "committed", result=_nested(201)),
     E.PayloadError),
    ("result nested 900 deep", lambda s: s.report(s.held, "committed", result=_nested(900)),
     E.PayloadError),
    ("result nested 5,000 deep",
     lambda s: s.report(s.held, "committed", result={"r": _nested(5_000)}), E.PayloadError),
    ("resolve with a result nested 900 deep",
     lambda s: s.gate.resolve(s.held.key, "committed", by="ops", result=_nested(900),
                              force=True), E.PayloadError),
    ("compensation nested 5,000 deep", lambda s: s.begin(compensation=_nested(5_000)),
     E.PayloadError),
    ("compensation of 10 MB", lambda s: s.begin(compensation={"undo": "x" * 10_000_000}),
     E.PayloadError),
    # -- key templates that walk into the program ---------------------------------------------
    ("template reads a dunder attribute",
     lambda s: s.run("refund:{order.__class__}", {"order": _Order()}), E.EffectKeyError),
    ("template walks to globals (the issue's exploit)",
     lambda s: s.run("k:{order.__init__.__globals__[sys].modules[os].environ[HOME]}",
                     {"order": _Order()}), E.EffectKeyError),
    ("template reads a _private attribute",
     lambda s: s.run("refund:{order._secret}", {"order": _Order()}), E.EffectKeyError),
    ("template dunder after an item",
     lambda s: s.run("refund:{order[0].__doc__}", {"order": ["x"]}), E.EffectKeyError),
    ("template dunder deep in a walk",
     lambda s: s.run("refund:{order.items.__len__}", {"order": _Order()}), E.EffectKeyError),
    ("template reads a method (a callable)",
     lambda s: s.run("refund:{order.total}", {"order": _Order()}), E.EffectKeyError),
    ("template reads a str method", lambda s: s.run("refund:{t.upper}", {"t": "abc"}),
     E.EffectKeyError),
    ("template steps onto a module",
     lambda s: s.run("refund:{m.sep}", {"m": __import__("os")}), E.EffectKeyError),
    ("template field is a module",
     lambda s: s.run("refund:{m}", {"m": __import__("os")}), E.EffectKeyError),
    ("template steps onto a class", lambda s: s.run("refund:{c.x}", {"c": _Order}),
     E.EffectKeyError),
    ("template field is a function", lambda s: s.run("refund:{f}", {"f": len}),
     E.EffectKeyError),
    ("template walk of nine steps",
     lambda s: s.run("k:{a[0][0][0][0][0][0][0][0][0]}", {"a": _nested(9)}), E.EffectKeyError),
    ("template empty item", lambda s: s.run("refund:{order[]}", {"order": {}}),
     E.EffectKeyError),
    ("template empty attribute", lambda s: s.run("refund:{order..id}", {"order": {}}),
     E.EffectKeyError),
    ("template attribute with a dash", lambda s: s.run("refund:{order.a-b}", {"order": {}}),
     E.EffectKeyError),
    ("group template with a dunder",
     lambda s: s.run("refund:{txn_id}", PAYLOAD, group_key="g:{txn_id.__class__}"),
     E.EffectKeyError),
    ("decorator with an attribute-walk template",
     lambda s: s.gate.effect("k:{o.__init__.__globals__}", effect_type="x")(lambda o: None),
     E.EffectKeyError),
    ("policy key template with an attribute walk",
     lambda s: eg.Policy.from_dict({"effects": {"t": {
         "key": "k:{o.__init__.__globals__[sys]}", "tools": ["t"]}}}), E.PolicyError),
    ("policy file with an attribute-walk template",
     lambda s: eg.Policy.load(_policy_file(s.tmp, '[effects."sms.send"]\n'
                                           'key = "sms:{to.__class__.__mro__}"\n'
                                           'tools = ["send_sms"]\n')), E.PolicyError),
    ("policy file key with a zero-width space",
     lambda s: eg.Policy.load(_policy_file(s.tmp, '[effects.t]\nkey = "k\u200b:x"\n')),
     E.PolicyError),
    ("gate with a policy whose template walks",
     lambda s: eg.Gate(s.gate.url, policy={"effects": {"t": {"key": "{a._b}", "tools": ["t"]}}}),
     E.PolicyError),
    # -- what is stored of results, per effect type in the policy --------------------------------
    ("policy store_result not a bool",
     lambda s: eg.Policy.from_dict({"effects": {"t": {"store_result": "no"}}}), E.PolicyError),
    ("policy redact_result not a list",
     lambda s: eg.Policy.from_dict({"effects": {"t": {"redact_result": 5}}}), E.PolicyError),
    ("policy redact_result with a blank name",
     lambda s: eg.Policy.from_dict({"effects": {"t": {"redact_result": [" "]}}}), E.PolicyError),
    ("policy redact with a typo'd field",
     lambda s: eg.Policy.from_dict({"effects": {"t": {"redact": ["x"]}}}), E.PolicyError),
    ("spec store_result not a bool", lambda s: _spec(s, store_result="no"), E.ConfigError),
    ("spec redact not callable", lambda s: _spec(s, redact="card"), E.ConfigError),
    # -- functions the decorator cannot gate -------------------------------------------------------
    ("decorating a generator function",
     lambda s: s.gate.effect("k:{x}", effect_type="x")(_generator), E.ConfigError),
    ("decorating an async generator function",
     lambda s: s.gate.effect("k:{x}", effect_type="x")(_async_generator), E.ConfigError),
    ("decorating a non-callable", lambda s: s.gate.effect("k:{x}", effect_type="x")(42),
     E.ConfigError),
    ("decorating a callable object missing the template's argument",
     lambda s: s.gate.effect("k:{x}", effect_type="x")(type("C", (), {
         "__call__": lambda self, y: y})()), E.EffectKeyError),
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def seeded(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    if request.param == "postgres":
        require_postgres()
        url = PG_URL
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('bad') / 'effects.db'}"
    gate = eg.Gate(url, namespace=f"{TEST_PREFIX}bad-{uuid.uuid4().hex[:8]}", policy=False)
    yield Seeded(gate, tmp_path_factory.mktemp("policies"))
    gate.close()


def test_at_least_150_kinds_of_bad_input() -> None:
    assert len(CASES) + len(CLI_CASES) >= 150
    assert len({name for name, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "error"), [(c, e) for _, c, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_bad_input_raises_typed_error_and_leaves_store_unchanged(
    seeded: Seeded, case: Case, error: type[eg.EffectGateError]
) -> None:
    """Each kind of bad input raises its own EffectGateError subclass (never a bare TypeError,
    ValueError or a driver error) and writes nothing."""
    gate = seeded.gate
    held = seeded.hold()
    before = snapshot(gate)
    with pytest.raises(error) as raised:
        case(seeded)
    assert type(raised.value).__module__ == "effectgate.errors"
    assert snapshot(gate) == before
    # The held effect still reports normally afterwards: bad input broke nothing.
    gate.report(held, "committed", result={"ok": True})
    assert gate.get(held.key).state is eg.State.COMMITTED


def test_error_text_with_lone_surrogate_still_records_the_outcome(gate: eg.Gate) -> None:
    """An exception whose message holds a lone surrogate (a badly decoded vendor reply) still
    records FAILED; it used to leave the effect stuck IN_FLIGHT with a store error."""

    @gate.effect("email:{msg}", effect_type="email.send")
    def send(msg: str) -> None:
        raise eg.NotExecuted("SMTP said: \udce9chec")

    with pytest.raises(eg.NotExecuted) as raised:
        send("m1")
    assert not getattr(raised.value, "__notes__", None)
    record = gate.get("email:m1")
    assert record.state is eg.State.FAILED
    assert record.error is not None and "chec" in record.error


def test_result_with_lone_surrogate_commits_without_storing_it(gate: eg.Gate) -> None:
    """A body whose result cannot be stored (a lone surrogate) still commits: the effect
    happened; a duplicate returns None, with a warning at the commit."""
    calls: list[str] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str) -> dict[str, str]:
        calls.append(txn_id)
        return {"vendor_reply": "\ud800"}

    with pytest.warns(eg.ResultNotStoredWarning):
        refund("t1")
    assert gate.get("refund:t1").state is eg.State.COMMITTED
    assert refund("t1") is None and calls == ["t1"]


# -- the command line: conflicting flags and hostile arguments (exit 2, one line, no write) ----

CLI_CASES: list[tuple[str, list[str]]] = [
    ("resolve --committed --failed", ["resolve", "{held}", "--committed", "--failed"]),
    ("resolve --failed --committed", ["resolve", "{held}", "--failed", "--committed"]),
    ("resolve --failed with --result", ["resolve", "{held}", "--failed", "--result", "{}"]),
    ("resolve --json --plain", ["resolve", "{held}", "--committed", "--json", "--plain"]),
    ("resolve with neither outcome", ["resolve", "{held}"]),
    ("resolve --result not JSON", ["resolve", "{held}", "--committed", "--result", "{x"]),
    ("resolve --result 900 deep", ["resolve", "{held}", "--committed", "--force",
                                   "--result", "[" * 900 + "]" * 900]),
    ("resolve a key with U+2028", ["resolve", "refund:done\u2028", "--failed"]),
    ("resolve a key with an escape sequence", ["resolve", "refund:\x1b[2J", "--failed"]),
    ("resolve a key with a zero-width space", ["resolve", "refund:do\u200bne", "--failed"]),
    ("resolve --note with a NUL", ["resolve", "{held}", "--failed", "--force", "--note",
                                   "a\x00b"]),
    ("ls --json --plain", ["ls", "--json", "--plain"]),
    ("ls --state with an escape", ["ls", "--state", "ambiguous\x1b[0m"]),
    ("ls --limit 0", ["ls", "--limit", "0"]),
    ("ls --limit 2**63", ["ls", "--limit", str(2**63)]),
    ("ls --type with a NUL", ["ls", "--type", "payment\x00"]),
    ("show --plain --json", ["show", "refund:done", "--plain", "--json"]),
    ("show a key with a BOM", ["show", "\ufeffrefund:done"]),
    ("show a key with a bidi override", ["show", "refund:\u202edone"]),
    ("show a key of 600 characters", ["show", "k" * 600]),
    ("approve an unknown id", ["approve", "apr_\x1b[2J"]),
    ("deny an unknown id", ["deny", "apr_nope", "--reason", "x"]),
    ("prune --json --plain", ["prune", "--older-than", "1d", "--json", "--plain"]),
    ("prune --older-than 2**63 weeks", ["prune", "--older-than", f"{2**63}w"]),
    ("prune --older-than with an escape", ["prune", "--older-than", "1d\x1b"]),
    ("unwind --gate with --url", ["unwind", "g", "--gate", "x:y", "--url", "sqlite:///x.db"]),
]


@pytest.mark.parametrize("args", [a for _, a in CLI_CASES], ids=[n for n, _ in CLI_CASES])
def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(seeded: Seeded,
                                                                args: list[str]) -> None:
    """Conflicting flags and hostile arguments: one escaped line on stderr, exit 2, and the
    store exactly as it was."""
    from click.testing import CliRunner

    from effectgate.cli import main

    gate = seeded.gate
    held = seeded.hold()
    args = [a.replace("{held}", held.key) for a in args]
    where = [] if "--gate" in args else ["--url", gate.url, "--namespace", gate.namespace]
    before = snapshot(gate)
    result = CliRunner().invoke(main, [*args, *where], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("effectgate: error:") and result.stderr.count("\n") == 1
    assert not any(ch in result.stderr for ch in ("\x1b", "\u2028", "\u202e", "\ufeff"))
    assert snapshot(gate) == before
