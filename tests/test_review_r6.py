"""Review, round 6: attacks on this session's commits (sagas' early undos and unrecorded
undos, webhook URLs). Each test states the attack and what must hold."""

from __future__ import annotations

from typing import Any

import pytest

import effectgate as eg
from effectgate.webhooks import Webhooks

SECRET = "s" * 32


@pytest.mark.parametrize("path", ["/T0/é", "/T0/a\x85b", "/T0/a\u2028b", "/T0?q=é"])
def test_a_webhook_url_with_a_non_ascii_path_is_refused_when_configured(path: str) -> None:
    """``http.client`` sends the request line as ASCII: a URL whose path or query is not
    (``é``, a C1 control such as NEL, U+2028) passed the check and every delivery then
    failed (UnicodeEncodeError, taken for a network error), retried to the end and lost,
    as with the tab the check now refuses. A :class:`~effectgate.ConfigError` up front."""
    with pytest.raises(eg.ConfigError, match="ASCII"):
        Webhooks(url=f"https://hooks.example.com{path}", secret=SECRET, flush_on_exit=0)


def test_a_webhook_url_with_an_ascii_path_and_a_non_ascii_console_link_is_kept() -> None:
    """The refusal is of what cannot be sent: a percent-encoded path is fine, and the
    console's link (only written into messages, never requested) may be non-ASCII."""
    hooks = Webhooks(url="https://hooks.example.com/T0/%C3%A9?q=%C3%A9", secret=SECRET,
                     flush_on_exit=0, console_url="https://console.example.com/é")
    assert hooks.console_url == "https://console.example.com/é"


def test_an_undo_settled_failed_while_it_ran_is_not_said_to_turn_ambiguous(
        make_gate: Any) -> None:
    """An operator forces the undo FAILED while its compensator runs (``resolve --failed
    --force``); the compensator then returns: the undo happened, its report is fenced. The
    unwind listed it unresolved saying it "reads in flight, then ambiguous" — a safe state
    that refuses a blind retry — but it reads FAILED, and the next unwind runs the undo
    again. The report must say what the store says, so the operator records it committed."""
    gate: eg.Gate = make_gate()
    runs: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        runs.append(compensation["cancel"])
        gate.resolve("compensate:hotel:rv6", "failed", by="ops", force=True)
        return {"cancelled": compensation["cancel"]}

    step = gate.begin(effect_type="booking.hotel", key="hotel:rv6", payload={},
                      group_key="trip:rv6", compensation={"cancel": "hotel"})
    gate.report(step, "committed", result={"booked": "hotel"})

    report = gate.unwind("trip:rv6", by="ops")
    assert runs == ["hotel"] and not report.complete
    [held] = report.unresolved
    assert gate.get("compensate:hotel:rv6").state is eg.State.FAILED
    assert "in flight, then ambiguous" not in held.detail, held.detail
    assert "reads failed" in held.detail and "runs it again" in held.detail, held.detail


@pytest.mark.parametrize("host", ["exa\u200bmple.com", "ex\u00adample.com",
                                  "b\u00fccher-" + "\u00e9" * 60 + ".example"])
def test_a_webhook_host_idna_would_alter_or_refuse_is_refused_when_configured(
        host: str) -> None:
    """A non-ASCII host goes out IDNA-encoded. IDNA drops a zero-width space or a soft
    hyphen, so deliveries went to ``example.com`` while the configuration showed another
    host; a label IDNA cannot encode (over 63 characters once encoded) failed every
    delivery. Both are a :class:`~effectgate.ConfigError` when configured."""
    with pytest.raises(eg.ConfigError, match="host"):
        Webhooks(url=f"https://{host}/T0", secret=SECRET, flush_on_exit=0)


def test_a_webhook_host_in_plain_idn_form_is_kept() -> None:
    """An internationalised host IDNA encodes as itself is fine."""
    hooks = Webhooks(url="https://b\u00fccher.example/T0", secret=SECRET, flush_on_exit=0)
    assert hooks._url == "https://b\u00fccher.example/T0"
