"""Callable objects as the bodies of gated steps and activities (the durable-engine tests):
``gate.effect`` names an effect type after such an object's class."""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncRefund", "Refund"]


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
