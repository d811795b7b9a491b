"""``effectgate console``: a small web console for the people the gate leans on.

Overview, the approvals queue (search, paging; Approve / Deny), the AMBIGUOUS queue (Reconcile
now / Resolve, confirmed before anything is written), effects search and timelines, saga
groups (each step marked with its undo; Unwind), principals (add, revoke) and the audit of
operators' actions — server-rendered pages, no script, every action through the Gate API as
the signed-in operator (see :mod:`effectgate.console.app`), sessions kept in the store.
Needs the ``console`` extra (Starlette, uvicorn, Jinja2)::

    effectgate principals add alice --role operator      # prints alice's token once
    effectgate console --url sqlite:///effects.db        # http://127.0.0.1:8765
"""

from __future__ import annotations

from .app import SESSION_COOKIE
from .routes import build_app
from .serve import check_console_bind, serve

__all__ = ["SESSION_COOKIE", "build_app", "check_console_bind", "serve"]
