"""Exception classifiers: did the action certainly not happen (FAILED), or is it unknown
(AMBIGUOUS)?

A classifier takes an exception and answers ``Outcome.FAILED``, ``Outcome.AMBIGUOUS`` or
``None`` (no opinion). The gate asks the user's classifiers first, then the built-ins below;
without an answer every exception is AMBIGUOUS — the safe default, since a retry of an effect
that did happen is the harm this library exists to prevent.

Built-ins, for errors that provably happen before a request byte leaves. They judge the
request that raised, not the body, and a body may have sent another request first (a charge,
then a receipt to a service that is down), or an earlier try of the same request (a retrying
HTTP adapter). So a gate asks them only for an effect with a vendor key (``vendor=``): their
FAILED keeps that key, and the vendor deduplicates whatever the body had sent. Elsewhere a
connection error is AMBIGUOUS unless the body answers for itself: a classifier of its own
(``classifiers=(eg.classify_httpx,)`` says "this body sends one request, once"), asked first,
or :class:`~effectgate.NotExecuted` raised only where it knows.

* :class:`~effectgate.NotExecuted` → FAILED (the body says so).
* httpx: ``ConnectError`` (refused, DNS failure) and ``ConnectTimeout`` → FAILED;
  every other transport error (read/write timeouts, remote disconnects) → AMBIGUOUS.
* requests: ``ConnectTimeout`` → FAILED; ``ConnectionError`` caused by urllib3's
  ``NewConnectionError`` / ``NameResolutionError`` → FAILED (its own causes: a refusal the
  body handled before sending the request elsewhere is not one); other errors → AMBIGUOUS.

httpx and requests are never imported by effectgate: an exception is recognised by its class's
module, and the class hierarchy is read from the exception itself.

A classifier that raises (or answers something that is not an outcome) has no opinion, and
neither do the ones after it: the outcome is AMBIGUOUS. A FAILED the body proved
(:class:`~effectgate.NotExecuted`) or one of your classifiers answered moves the next attempt
to a new vendor key; one a built-in inferred from a connection error keeps it
(:func:`judge_body`). :func:`classify` asks the built-ins of one exception, whatever sent it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from .errors import ConfigError, NotExecuted
from .states import Outcome

__all__ = ["Classifier", "Judgement", "checked_classifiers", "classify", "classify_body",
           "classify_httpx", "classify_requests", "judge_body", "recorded_outcome"]

Classifier = Callable[[BaseException], "Outcome | None"]


def _class_names(exc: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def classify_httpx(exc: BaseException) -> Outcome | None:
    """httpx (and its fork httpx2, which mcp uses) errors raised before any byte of the
    request left → FAILED."""
    if not type(exc).__module__.startswith("httpx"):
        return None
    names = {c.__qualname__ for c in type(exc).__mro__ if c.__module__.startswith("httpx")}
    if "ConnectError" in names or "ConnectTimeout" in names:
        return Outcome.FAILED
    return Outcome.AMBIGUOUS


_URLLIB3_BEFORE_SEND = {
    "urllib3.exceptions.NewConnectionError",
    "urllib3.exceptions.NameResolutionError",
    "urllib3.exceptions.ConnectTimeoutError",
}


def classify_requests(exc: BaseException) -> Outcome | None:
    """requests errors raised before any byte of the request left → FAILED."""
    if not type(exc).__module__.startswith("requests"):
        return None
    names = _class_names(exc)
    if "requests.exceptions.ConnectTimeout" in names:
        return Outcome.FAILED
    if "requests.exceptions.ConnectionError" in names:
        # What happened to this request: down its reasons and explicit causes, never an
        # exception's __context__ (one handled before it was raised: a body that caught a
        # refused connection and sent the request elsewhere has a refusal there, while the
        # request in flight reached its server).
        cause: BaseException | None = exc
        seen = 0
        while cause is not None and seen < 8:
            if _class_names(cause) & _URLLIB3_BEFORE_SEND:
                return Outcome.FAILED
            reason = getattr(cause, "reason", None)
            args = getattr(cause, "args", ())
            nxt = reason if isinstance(reason, BaseException) else None
            if nxt is None and args and isinstance(args[0], BaseException):
                nxt = args[0]
            cause = nxt or cause.__cause__
            seen += 1
    return Outcome.AMBIGUOUS


BUILTIN_CLASSIFIERS: tuple[Classifier, ...] = (classify_httpx, classify_requests)


def checked_classifiers(classifiers: object) -> tuple[Classifier, ...]:
    """``classifiers`` as a tuple, each one callable; :class:`ConfigError` naming the first
    that is not (checked where they are given, before anything is written)."""
    if callable(classifiers) or isinstance(classifiers, (str, bytes)) or not isinstance(
            classifiers, Iterable):
        raise ConfigError("classifiers must be a tuple of functions of an exception, not "
                          f"{type(classifiers).__name__}")
    checked = tuple(classifiers)
    for position, classifier in enumerate(checked):
        if not callable(classifier):
            raise ConfigError(f"classifiers[{position}] must be a function of an exception, "
                              f"not {type(classifier).__name__}")
    return checked


class _Verdict(NamedTuple):
    outcome: Outcome | None
    broken: str | None  # what went wrong asking a classifier (no text of its error), if it did


def _asked(exc: BaseException, classifiers: Iterable[Classifier]) -> _Verdict:
    """The first opinion of ``classifiers`` on ``exc``; one that raises, or answers something
    that is not an outcome, has none, and the ones after it are not asked (a classifier is
    asked first because it knows its body: one that cannot answer may have said AMBIGUOUS)."""
    for classifier in classifiers:
        try:
            verdict = classifier(exc)
        except Exception as err:  # a broken classifier must not lose the body's outcome
            # Its type only: an error's text may carry what the body was handling (a secret).
            return _broken(classifier, f"raised {type(err).__name__}")
        if verdict is None:
            continue
        try:
            return _Verdict(Outcome(verdict), None)
        except (ValueError, TypeError):
            return _broken(classifier, f"answered a {type(verdict).__name__}, not an outcome")
    return _Verdict(None, None)


def _broken(classifier: Classifier, what: str) -> _Verdict:
    name = getattr(classifier, "__qualname__", None) or type(classifier).__name__
    return _Verdict(Outcome.AMBIGUOUS, f"the exception classifier {name} {what}")


def classify(exc: BaseException, classifiers: Iterable[Classifier] = ()) -> Outcome:
    """FAILED if the action certainly did not happen, else AMBIGUOUS."""
    if isinstance(exc, NotExecuted):
        return Outcome.FAILED
    return _asked(exc, (*classifiers, *BUILTIN_CLASSIFIERS)).outcome or Outcome.AMBIGUOUS


_RECORDED = "__effectgate_outcome__"


def recorded_outcome(exc: BaseException) -> Outcome | None:
    """The outcome the last gate that ``exc`` passed through recorded for its effect (the
    innermost effect whose body raised it, or one enclosing it), or None if none did."""
    mark = getattr(exc, _RECORDED, None)
    return Outcome(mark) if mark in ("failed", "ambiguous") else None


class Judgement(NamedTuple):
    """What a gate records for an effect whose body raised (:func:`judge_body`)."""

    outcome: Outcome
    """FAILED or AMBIGUOUS."""
    proved: bool
    """True for a FAILED the body proved (it raised :class:`~effectgate.NotExecuted`) or one of
    the caller's classifiers answered (it knows its body and its vendor: a decline the vendor
    stored needs a new key): the next attempt gets a new vendor key. A FAILED a built-in
    classifier inferred from a connection error keeps the key: the vendor never saw that
    request, or, when the body had sent another one first, it deduplicates the retry (the
    built-ins are asked only when there is a key to keep: ``keyed``)."""


def judge_body(exc: BaseException, classifiers: Iterable[Classifier] = (), *,
               keyed: bool = False) -> Judgement:
    """:func:`classify_body`, and whether its FAILED is the body's own proof (``proved``).
    ``keyed``: the effect has a vendor key, which a FAILED the built-in classifiers infer
    keeps; without one they are not asked (what else the body sent, nothing would
    deduplicate)."""
    first = recorded_outcome(exc) is None  # (else an inner gate's: only yours are asked)
    if first and isinstance(exc, NotExecuted):
        return _marked(exc, Judgement(Outcome.FAILED, True))
    verdict = _asked(exc, classifiers)
    yours = verdict.outcome is not None
    if not yours and first and keyed:  # (a built-in's FAILED is safe only under a kept key)
        verdict = _asked(exc, BUILTIN_CLASSIFIERS)
    if verdict.broken is not None:
        with contextlib.suppress(TypeError):  # an exception whose __notes__ is not a list
            exc.add_note(f"effectgate: {verdict.broken}; the outcome is recorded AMBIGUOUS")
    failed = verdict.outcome is Outcome.FAILED
    return _marked(exc, Judgement(Outcome.FAILED if failed else Outcome.AMBIGUOUS,
                                  failed and yours))


def _marked(exc: BaseException, judgement: Judgement) -> Judgement:
    with contextlib.suppress(AttributeError, TypeError):  # an exception without a __dict__
        setattr(exc, _RECORDED, judgement.outcome.value)
    return judgement


def classify_body(exc: BaseException, classifiers: Iterable[Classifier] = (), *,
                  keyed: bool = False) -> Outcome:
    """What a gate records for an effect whose body raised ``exc`` — FAILED or AMBIGUOUS (an
    exception cannot prove the effect happened) — noted on ``exc`` (:func:`recorded_outcome`).

    An exception that a gated call inside this body raised, and its own gate recorded, tells
    of that inner effect only: its :class:`~effectgate.NotExecuted` or refused connection
    does not say this body did nothing (it may have charged a card before the inner call).
    Such an exception is AMBIGUOUS here unless one of ``classifiers`` says otherwise.

    The built-in classifiers are asked only when ``keyed`` (the effect has a vendor key: see
    the module docstring). A classifier that raises makes it AMBIGUOUS, with a note on
    ``exc`` naming the classifier and the type of its error."""
    return judge_body(exc, classifiers, keyed=keyed).outcome
