"""Which guarantees ``effectgate verify`` checks, in order, and the check for each."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import ConfigError
from .harness import VerifyContext

__all__ = ["GUARANTEES", "all_checks", "parse_only"]

GUARANTEES: dict[str, str] = {
    "G1": "a committed effect is never executed again",
    "G2": "one winner under concurrency (8 processes, many keys)",
    "G3": "a lapsed lease makes the effect AMBIGUOUS; a blind retry is refused",
    "G4": "FAILED permits a new attempt with a new vendor key",
    "G5": "a key reused with another payload is refused",
    "G6": "a stale lease holder cannot report",
    "G7": "an unresolvable template fails before the body runs",
    "G8": "an approval is bound to its payload and single use",
    "G9": "a budget ceiling refuses, and AMBIGUOUS holds its spend",
    "G10": "unwind compensates each committed step once, in reverse",
    "G11": "pruned keys still refuse duplicates",
    "G12": "a worker killed at any point never causes a second execution",
    "G13": "one namespace can never read, report, extend or resolve another's effects",
    "G14": "only the holder can report or extend (a guessed or borrowed proof is refused)",
    "G15": "a live lease cannot be resolved without force; reconcile waits out a grace period "
           "and a reconciled failure keeps the vendor key",
    "G16": "a key proposed under another effect type is refused",
}


def all_checks() -> dict[str, Callable[[VerifyContext], str]]:
    """Guarantee id → its check (imported here, so the registry imports every check module
    and no check module imports the registry)."""
    from . import checks as core
    from . import governance as gov
    from . import procs

    return {
        "G1": core.check_g1, "G2": procs.check_g2, "G3": core.check_g3, "G4": core.check_g4,
        "G5": core.check_g5, "G6": core.check_g6, "G7": core.check_g7, "G8": gov.check_g8,
        "G9": gov.check_g9, "G10": gov.check_g10, "G11": gov.check_g11,
        "G12": procs.check_g12, "G13": core.check_g13, "G14": core.check_g14,
        "G15": core.check_g15, "G16": core.check_g16,
    }


def parse_only(only: str | Iterable[str] | None) -> list[str]:
    """``"G1,G3"`` (or a list) as guarantee ids in order; :class:`ConfigError` for an
    unknown one. None means all of them."""
    if only is None:
        return list(GUARANTEES)
    names = only.split(",") if isinstance(only, str) else list(only)
    wanted = {n.strip().upper() for n in names if n.strip()}
    unknown = sorted(wanted - set(GUARANTEES))
    if unknown or not wanted:
        raise ConfigError(
            f"unknown guarantee {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(GUARANTEES)}"
        )
    return [g for g in GUARANTEES if g in wanted]
