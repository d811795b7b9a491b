"""Vendor idempotency keys, shaped to each vendor's rules.

With ``vendor=`` an effect's ``begin`` carries a deterministic key derived from
(namespace, effect type, key, attempt) and the store's secret, so a retry of the *same attempt*
(the holder's own HTTP retry) reuses it, while a new attempt after a FAILED the body proved
(``NotExecuted``), one of the caller's classifiers answered or its holder reported gets a new
one (after a FAILED a built-in classifier inferred from a connection error, or an operator or
a reconcile hook decided, it keeps the old one). The
vendor then refuses a duplicate itself, which protects the action even from callers that skip
the gate. Each rule says where the key goes and how long the vendor remembers it; ``covered``
tells whether that window still covers the attempt.

=========  ==========  =================================  =================================
vendor     max length  where                              vendor's window
=========  ==========  =================================  =================================
stripe     255         header ``Idempotency-Key``         24 hours (keys pruned after that)
square     45          body field ``idempotency_key``     not documented as a fixed window
adyen      64          header ``Idempotency-Key``         at least 31 days
generic    255         header ``Idempotency-Key``         unknown
=========  ==========  =================================  =================================
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigError

__all__ = ["VENDOR_RULES", "VendorKey", "VendorRule", "vendor_key"]


@dataclass(frozen=True, slots=True)
class VendorRule:
    """How one vendor takes idempotency keys."""

    name: str
    max_length: int
    location: Literal["header", "body"]
    field: str
    window_seconds: float | None
    note: str


VENDOR_RULES: dict[str, VendorRule] = {
    "stripe": VendorRule(
        "stripe", 255, "header", "Idempotency-Key", 24 * 3600,
        "Stripe keeps keys for at least 24 hours, then prunes them",
    ),
    "square": VendorRule(
        "square", 45, "body", "idempotency_key", None,
        "Square: at most 45 characters for CreatePayment; no fixed window is documented",
    ),
    "adyen": VendorRule(
        "adyen", 64, "header", "Idempotency-Key", 31 * 24 * 3600,
        "Adyen keeps keys for a minimum of 31 days",
    ),
    "generic": VendorRule(
        "generic", 255, "header", "Idempotency-Key", None,
        "the vendor's window is unknown",
    ),
}


@dataclass(frozen=True, slots=True)
class VendorKey:
    """A vendor idempotency key with where it goes and whether the vendor still remembers it.

    ``covered`` is True while the vendor's window covers this attempt, False once it has passed
    (a re-send would no longer be deduplicated by the vendor), None when the window is unknown.
    """

    vendor: str
    value: str
    location: Literal["header", "body"]
    field: str
    window_seconds: float | None
    covered: bool | None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {
            "vendor": self.vendor,
            "value": self.value,
            "location": self.location,
            "field": self.field,
            "window_seconds": self.window_seconds,
            "covered": self.covered,
        }


def rule_for(vendor: str) -> VendorRule:
    """The rule for ``vendor``; raise :class:`ConfigError` for an unknown vendor."""
    try:
        return VENDOR_RULES[vendor]
    except KeyError:
        known = ", ".join(sorted(VENDOR_RULES))
        raise ConfigError(f"unknown vendor {vendor!r}; known vendors: {known}") from None


def vendor_key(
    secret: bytes,
    vendor: str,
    *,
    namespace: str,
    effect_type: str,
    key: str,
    attempt: int,
    attempt_age_seconds: float = 0.0,
) -> VendorKey:
    """The deterministic vendor key for one attempt of one effect."""
    rule = rule_for(vendor)
    message = "\x1f".join((namespace, effect_type, key, str(attempt))).encode("utf-8")
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    # 32 base32 characters = 160 bits; fits every vendor's limit with the "eg_" prefix.
    value = "eg_" + base64.b32encode(digest[:20]).decode("ascii").lower()
    value = value[: rule.max_length]
    covered = None if rule.window_seconds is None else attempt_age_seconds < rule.window_seconds
    return VendorKey(vendor, value, rule.location, rule.field, rule.window_seconds, covered)
