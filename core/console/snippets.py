"""Pieces of markup the console's templates share (a leaf: :mod:`.pages` and the template
modules import it, never each other)."""

from __future__ import annotations

__all__ = ["CSRF"]

CSRF = '<input type="hidden" name="csrf_token" value="{{ csrf | asis }}">'
"""The hidden field every form that writes carries (the session's CSRF token)."""
