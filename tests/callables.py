"""Callable objects as the bodies of gated steps and activities (the durable-engine tests):
``gate.effect`` names an effect type after such an object's class."""

from __future__ import annotations

from typing import Any

__all__ = ["APPROVE_BOTH", "AsyncRefund", "Refund", "wire"]


class Refund:
    """A callable object as a body: its effect type is ``Refund``."""

    def __init__(self, ledger: list[str]) -> None:
        self.ledger = ledger

    def __call__(self, txn_id: str, amount_cents: int) -> dict[str, Any]:
        self.ledger.append(txn_id)
        return {"refunded": amount_cents}


class AsyncRefund(Refund):
    """A callable object whose ``__call__`` is a coroutine function."""

    async def __call__(self, txn_id: str, amount_cents: int) -> dict[str, Any]:  # type: ignore[override]
        self.ledger.append(txn_id)
        return {"refunded": amount_cents}


APPROVE_BOTH = {"effects": {"Refund": {"approval": "always"}, "wire": {"approval": "always"}}}
"""A policy whose approval rule names the effect types of :class:`Refund` and :func:`wire`."""


def wire(ledger: list[str], currency: str, txn_id: str, amount_cents: int) -> dict[str, Any]:
    """A function to gate through a ``functools.partial`` (its effect type is ``wire``)."""
    ledger.append(txn_id)
    return {"wired": amount_cents, "currency": currency}
