"""Shared by the console tests: a gate with an approval rule, a saga, a reconcile hook and a
compensator; signing in over plain HTTP."""

from __future__ import annotations

import re
from typing import Any

import effectgate as eg

POLICY = {"effects": {"payment.refund": {"approval": {"always": True}}}}


def console_gate(url: str, namespace: str) -> eg.Gate:
    """A gate whose refunds need approval, with hooks the console can call."""
    gate = eg.Gate(url, policy=POLICY, namespace=namespace)
    undone: list[str] = []

    @gate.compensator("trip.*")
    def undo(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(record.key)
        return {"cancelled": record.key}

    @gate.reconciler("vendor.checked")
    def ask_vendor(record: eg.EffectRecord) -> str:
        return "committed"

    gate.undone = undone  # type: ignore[attr-defined]
    return gate


def csrf_of(html: str) -> str:
    """The first form's CSRF token on a page."""
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token on the page"
    return match.group(1)


def sign_in(client: Any, token: str) -> str:
    """Sign in through the login form; the session's CSRF token."""
    page = client.get("/login")
    assert page.status_code == 200
    done = client.post("/login", data={"token": token, "csrf_token": csrf_of(page.text),
                                       "next": "/approvals"}, follow_redirects=False)
    assert done.status_code == 303, done.text
    return csrf_of(client.get("/approvals").text)
