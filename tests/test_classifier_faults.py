"""A classifier that raises (or answers something that is not an outcome) has no opinion: the
body's outcome is recorded AMBIGUOUS at once and the caller gets the body's exception, with a
note naming the classifier and its error's type (never its text). A classifier that is not
callable is refused where it is given, before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import effectgate as eg
from effectgate.integrations._kernel import GatedCall, Refused

SECRET = "sk_live_do_not_log"


def picky(exc: BaseException) -> eg.Outcome | None:
    """A user's classifier written for their HTTP errors only."""
    return eg.Outcome.FAILED if exc.response.status_code == 409 else None  # type: ignore[attr-defined]


def leaky(exc: BaseException) -> eg.Outcome | None:
    raise RuntimeError(f"token {SECRET} rejected")


def _noted(exc: BaseException, classifier: str, error: str) -> None:
    notes = " ".join(getattr(exc, "__notes__", []))
    assert classifier in notes and error in notes and "AMBIGUOUS" in notes
    assert SECRET not in notes


def test_a_classifier_that_raises_leaves_the_body_error_and_ambiguous(
        make_gate: Any) -> None:
    gate = make_gate(classifiers=(picky,))

    @gate.effect("j:{x}", effect_type="t2")
    def g(x: str) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as caught:
        g("1")
    _noted(caught.value, "picky", "AttributeError")
    assert gate.get("j:1").state is eg.State.AMBIGUOUS  # at once, not after the lease


async def test_a_classifier_that_raises_async(gate: eg.Gate) -> None:
    @gate.effect("j:{x}", effect_type="t2", classifiers=(leaky,))
    async def g(x: str) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as caught:
        await g("1")
    _noted(caught.value, "leaky", "RuntimeError")
    assert gate.get("j:1").state is eg.State.AMBIGUOUS


def test_a_raising_classifier_is_not_overruled_by_a_builtin(gate: eg.Gate) -> None:
    """The user's classifier is asked first because it knows the body; when it cannot answer,
    a built-in's FAILED (which judges only the request that raised) does not stand in."""
    @gate.effect("j:{x}", effect_type="t2", classifiers=(leaky,))
    def g(x: str) -> None:
        raise httpx.ConnectError("refused")

    with pytest.raises(httpx.ConnectError):
        g("1")
    assert gate.get("j:1").state is eg.State.AMBIGUOUS


def test_a_classifier_that_answers_no_outcome_is_ambiguous(gate: eg.Gate) -> None:
    def vague(exc: BaseException) -> Any:
        return "maybe"

    @gate.effect("j:{x}", effect_type="t2", classifiers=(vague,))
    def g(x: str) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError) as caught:
        g("1")
    _noted(caught.value, "vague", "answered a str, not an outcome")
    assert gate.get("j:1").state is eg.State.AMBIGUOUS


def test_not_executed_is_failed_whatever_the_classifier(gate: eg.Gate) -> None:
    @gate.effect("k:{x}", effect_type="t", classifiers=(picky,))
    def f(x: str) -> None:
        raise eg.NotExecuted("validation failed before anything was sent")

    with pytest.raises(eg.NotExecuted):
        f("1")
    assert gate.get("k:1").state is eg.State.FAILED


def test_the_adapter_kernel_answers_ambiguous_for_a_raising_classifier(gate: eg.Gate) -> None:
    call = GatedCall(eg.EffectSpec(gate, "j:{x}", effect_type="t2", classifiers=(leaky,)),
                     "tool")

    def body() -> None:
        raise ValueError("boom")

    answer = call.run({"x": "1"}, body)
    assert isinstance(answer, Refused) and answer.kind == "ambiguous"
    assert gate.get("j:1").state is eg.State.AMBIGUOUS


def test_classify_itself_survives_a_raising_classifier() -> None:
    assert eg.classify(ValueError("x"), (leaky,)) is eg.Outcome.AMBIGUOUS
    assert eg.classify(eg.NotExecuted("x"), (leaky,)) is eg.Outcome.FAILED


@pytest.mark.parametrize(("classifiers", "says"), [
    (("x",), "classifiers[0]"),
    ((picky, 3), "classifiers[1]"),
    (picky, "tuple of functions"),
    ("picky", "tuple of functions"),
])
def test_a_gate_refuses_a_classifier_that_is_not_callable(
        tmp_path: Path, classifiers: Any, says: str) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(eg.ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        eg.Gate(f"sqlite:///{db}", classifiers=classifiers)
    assert not db.exists()  # nothing written


def test_an_effect_refuses_a_classifier_that_is_not_callable(gate: eg.Gate) -> None:
    with pytest.raises(eg.ConfigError, match=r"classifiers\[1\]"):
        gate.effect("k:{x}", effect_type="t", classifiers=(picky, None))(lambda x: x)
    with pytest.raises(eg.ConfigError, match=r"classifiers\[0\]"):
        eg.EffectSpec(gate, "k:{x}", effect_type="t", classifiers=("x",))  # an adapter's
    assert gate.store.fetch(gate.namespace, "k:1") is None
