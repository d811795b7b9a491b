"""The console's signed cookies: the session, the login form's nonce and one-shot messages.

Each cookie is ``base64url(JSON).base64url(HMAC-SHA256)`` under a key derived from the
store's own secret (``effectgate_meta``), so a cookie minted for one store is refused by every
other. A session cookie carries only a random secret: the session itself lives in the store
(``effectgate_sessions``, under the secret's SHA-256), is read with its principal on every
request, and ends everywhere when its operator signs out. Its CSRF token is derived from the
secret (:meth:`Signer.derive`), so it needs no storage and dies with the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

__all__ = ["SESSION_SECONDS", "Signer", "new_csrf", "new_session_secret", "session_id"]

SESSION_SECONDS = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_csrf() -> str:
    """A fresh random token (CSRF tokens, login nonces)."""
    return secrets.token_urlsafe(24)


def new_session_secret() -> str:
    """A session's secret (256 random bits): in the cookie only, never in the store."""
    return secrets.token_urlsafe(32)


def session_id(secret: str) -> str:
    """The store's name for the session ``secret``: its SHA-256 (hex)."""
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


class Signer:
    """Signs and checks the console's cookies with a key derived from the store's secret.
    ``purpose`` separates cookie kinds: a flash cookie never passes as a session."""

    def __init__(self, store_secret: bytes, namespace: str) -> None:
        self._key = hmac.new(store_secret, b"effectgate console cookies v1\x00"
                             + namespace.encode("utf-8"), hashlib.sha256).digest()

    def _mac(self, purpose: str, body: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}\x00{body}".encode("ascii"),
                             hashlib.sha256).digest())

    def derive(self, purpose: str, text: str) -> str:
        """A value bound to ``text`` under this signer's key (a session's CSRF token)."""
        return _b64(hmac.new(self._key, f"derive\x00{purpose}\x00{text}".encode(),
                             hashlib.sha256).digest())

    def sign(self, purpose: str, value: dict[str, Any], seconds: float) -> str:
        """``value`` as a cookie that expires ``seconds`` from now."""
        body = _b64(json.dumps({**value, "exp": time.time() + seconds},
                               separators=(",", ":")).encode("utf-8"))
        return f"{body}.{self._mac(purpose, body)}"

    def unsign(self, purpose: str, cookie: str | None) -> dict[str, Any] | None:
        """The value of a cookie this signer made for ``purpose`` and that has not expired;
        None for anything else (absent, forged, another store's, expired, malformed)."""
        if not cookie or len(cookie) > 4096 or cookie.count(".") != 1:
            return None
        body, mac = cookie.split(".")
        try:
            if not hmac.compare_digest(mac.encode("ascii"), self._mac(purpose, body)
                                       .encode("ascii")):
                return None
            value = json.loads(_unb64(body))
        except (ValueError, UnicodeError):
            return None
        if not isinstance(value, dict) or not isinstance(value.get("exp"), (int, float)):
            return None
        if value["exp"] < time.time():
            return None
        return value
