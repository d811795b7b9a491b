"""The governance guarantees: G8 (approvals), G9 (budgets), G10 (unwind), G11 (prune)."""

from __future__ import annotations

from .gate import Gate
from .verify import NotApplicable, VerifyContext

__all__ = ["check_g8", "check_g9", "check_g10", "check_g11"]


def _needs(*names: str) -> None:
    missing = [n for n in names if not hasattr(Gate, n)]
    if missing:
        raise NotApplicable(f"this effectgate has no {', '.join(missing)}")


def check_g8(ctx: VerifyContext) -> str:
    _needs("approve")
    raise NotApplicable("not written yet")


def check_g9(ctx: VerifyContext) -> str:
    raise NotApplicable("not written yet")


def check_g10(ctx: VerifyContext) -> str:
    _needs("unwind")
    raise NotApplicable("not written yet")


def check_g11(ctx: VerifyContext) -> str:
    _needs("prune")
    raise NotApplicable("not written yet")
