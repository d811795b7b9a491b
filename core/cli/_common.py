"""What every ``effectgate`` command shares: the store options, opening the gate, printing,
and turning errors into one line and a documented exit code.

Exit codes (the same for every command):

* 0 — done;
* 1 — a check failed (``verify``) or the store refused the operation (e.g. resolving a
  COMMITTED effect, approving a consumed approval);
* 2 — bad input: a usage error, an unknown key or id, a malformed URL or option;
* 3 — the store could not be reached or failed.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_STORE",
    "BadInput",
    "Command",
    "actor",
    "by_option",
    "console",
    "exclusive",
    "fail",
    "gate_options",
    "given",
    "handle_errors",
    "normalise_url",
    "note_action",
    "open_gate",
    "output_options",
    "print_json",
    "shown_url",
]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STORE = 0, 1, 2, 3
F = TypeVar("F", bound=Callable[..., Any])


def console(*, stderr: bool = False) -> Any:
    """A ``rich`` console: colours on a terminal, plain text (80 columns) in a pipe."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False, emoji=False)


def shown_url(url: str) -> str:
    """A store URL as it may be printed: :func:`effectgate.store.connections.safe_url` (the
    one helper; imported when first needed, so a command that opens no store never loads the
    store package)."""
    from ..store.connections import safe_url

    return safe_url(url)


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout, for scripts (control and format characters inside
    strings as ``\\u`` escapes, so agent-supplied text never reaches a terminal raw)."""
    from ._safe import dumps

    click.echo(dumps(value))




by_option = click.option("--by", default=None, metavar="NAME",
                         help="Who is acting (default: your login name).")


def actor(by: str | None) -> str:
    """Who acts: ``--by``, else the OS login name."""
    if by:
        return by
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "operator"


def note_action(gate: Any, actor: str, action: str, **fields: Any) -> None:
    """Append what ``actor`` just did to the store's audit (:mod:`effectgate.audit`, via
    ``cli``). The action happened either way: an entry that cannot be written is a warning on
    stderr, not a failure."""
    from ..audit import record_action
    from ..errors import EffectGateError
    from ._safe import plain

    try:
        record_action(gate, actor, action, via="cli", **fields)
    except EffectGateError as err:
        click.echo(f"effectgate: warning: done, but the audit entry could not be written: "
                   f"{plain(err.message)}", err=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``effectgate: error: message`` on stderr (one line, unsafe characters escaped)
    and exit with ``code``."""
    from ..redact import redact_text
    from ._safe import plain

    click.echo(f"effectgate: error: {plain(redact_text(message))}", err=True)
    sys.exit(code)


class BadInput(click.ClickException):
    """A usage error shown as one line (``effectgate: error: ...``), exit code 2."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: Any = None) -> None:
        from ._safe import plain

        click.echo(f"effectgate: error: {plain(self.format_message())}", err=True)


EXIT_CODES_HELP = ("Exit codes: 0 done; 1 a check failed or the store refused; "
                   "2 bad input; 3 the store could not be reached.")


class Command(click.Command):
    """A command whose usage errors are one line on stderr (exit 2), not a usage screen, and
    whose help ends with the exit codes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as err:
            raise BadInput(f"{err.format_message()} (see: {ctx.command_path} --help)") from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            raise BadInput(f"{err.format_message()} (see: {ctx.command_path} --help)") from None


def _exit_code(err: BaseException) -> int:
    from ..errors import (
        ConfigError,
        EffectKeyError,
        EffectRefused,
        InvalidTransition,
        PayloadError,
        PayloadMismatch,
        StaleLease,
        StoreError,
        UnknownEffect,
    )

    if isinstance(err, StoreError):
        return EXIT_STORE
    if isinstance(err, (UnknownEffect, ConfigError, EffectKeyError, PayloadError)):
        return EXIT_BAD_INPUT
    if isinstance(err, (InvalidTransition, EffectRefused, StaleLease, PayloadMismatch)):
        return EXIT_FAILED
    return EXIT_FAILED


def handle_errors(fn: F) -> F:
    """Run a command body; an effectgate error becomes one line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..errors import EffectGateError

        try:
            return fn(*args, **kwargs)
        except EffectGateError as err:
            fail(err.message.splitlines()[0] if err.message else type(err).__name__,
                 _exit_code(err))

    return wrapper  # type: ignore[return-value]


def gate_options(fn: F) -> F:
    """``--url``, ``--namespace`` and ``--gate`` (a ``module:attribute`` Gate to use, with
    its policy, compensators and reconcilers)."""
    fn = click.option(
        "--gate", "gate_ref", metavar="MODULE:ATTR", default=None,
        help="Use the Gate object your code defines (with its policy and compensators), "
             "e.g. myapp.effects:gate. Overrides --url and --namespace.",
    )(fn)
    fn = click.option(
        "--namespace", "-n", default="default", show_default=True, envvar="EFFECTGATE_NAMESPACE",
        help="The namespace whose effects to act on.",
    )(fn)
    fn = click.option(
        "--url", default=None, envvar="EFFECTGATE_URL", metavar="URL",
        callback=lambda ctx, param, value: normalise_url(value),
        help="Store URL (default: $EFFECTGATE_URL, else sqlite:///.effectgate/effects.db). "
             "Postgres: postgresql://user@host/db (postgres:// is accepted too).",
    )(fn)
    return fn


def normalise_url(url: str | None) -> str | None:
    """``postgres://`` and ``postgresql://`` (the spellings libpq, Heroku and most hosts
    print) as the ``postgresql+psycopg://`` URL the store opens; anything else unchanged."""
    if url is None:
        return None
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def given(ctx: click.Context, name: str) -> bool:
    """True when the parameter ``name`` was given on the command line (not a default or an
    environment variable)."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE


def exclusive(ctx: click.Context, *groups: tuple[str, ...]) -> None:
    """Refuse (exit 2) when two options of one group were both given on the command line.

    Each group names click parameter names; the message names their flags."""
    flags = {p.name: (p.opts[0] if p.opts else p.name) for p in ctx.command.params}
    for group in groups:
        present = [name for name in group if given(ctx, name)]
        if len(present) > 1:
            shown = " and ".join(str(flags.get(n, n)) for n in present)
            raise BadInput(f"{shown} exclude each other (see: {ctx.command_path} --help)")


def output_options(fn: F) -> F:
    """``--json`` (a JSON document, for scripts) and ``--plain`` (tab-separated lines, no
    colour, no header), as one ``output`` argument: "table", "json" or "plain"."""
    fn = click.option("--plain", "as_plain", is_flag=True,
                      help="Print tab-separated lines without colour or header, for scripts.")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool = False, as_plain: bool = False, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        exclusive(ctx, ("as_json", "as_plain"))
        output = "json" if as_json else "plain" if as_plain else "table"
        return fn(*args, output=output, **kwargs)

    return wrapper  # type: ignore[return-value]


def _load_gate(ref: str) -> Any:
    from ..errors import ConfigError
    from ..gate import Gate

    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--gate takes MODULE:ATTRIBUTE (e.g. myapp.effects:gate), not {ref!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"--gate: cannot import {module_name!r}: {err}") from None
    value = getattr(module, attribute, None)
    if not isinstance(value, Gate):
        raise ConfigError(f"--gate: {ref} is not an effectgate.Gate")
    return value


@contextmanager
def open_gate(url: str | None, namespace: str, gate_ref: str | None = None, *,
              read_only: bool = False) -> Iterator[Any]:
    """The gate a command acts on; closed afterwards. A store that cannot be reached becomes
    :class:`StoreError` (exit 3), a malformed URL :class:`ConfigError` (exit 2).

    ``read_only=True`` (commands that only read) opens an existing store without creating or
    migrating anything: a mistyped URL is an error (exit 3), never an empty store. A gate
    from ``--gate`` is used as your code made it."""
    from ..gate import Gate

    if gate_ref:
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            exclusive(ctx, ("gate_ref", "url"), ("gate_ref", "namespace"))
    gate = (_load_gate(gate_ref) if gate_ref
            else Gate(normalise_url(url), namespace=namespace, read_only=read_only))
    try:
        yield gate
    finally:
        if not gate_ref:
            gate.close()
