"""The ``effectgate`` command line. Each command lives in its own module and is imported only
when it runs, so ``effectgate --help`` stays fast and no framework is imported for ``ls``.

Exit codes: 0 success; 1 a check failed (``verify``) or the operation was refused;
2 bad input (usage, unknown key or id); 3 the store could not be reached.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["main"]

# command name -> "module:attribute" (modules under effectgate.cli)
COMMANDS: dict[str, str] = {
    "demo": "demo:demo",
    "verify": "verify:verify",
    "ls": "read:ls",
    "show": "read:show",
    "resolve": "ops:resolve",
    "approve": "ops:approve",
    "deny": "ops:deny",
    "unwind": "ops:unwind",
    "prune": "ops:prune",
    "bench": "bench:bench",
    "mcp": "mcp:mcp",
    "principals": "principals:principals",
    "console": "console:console",
    "watch": "watch:watch",
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(f"{__name__}.{module_name}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{module_name}":
                return None
            raise
        command: Any = getattr(module, attribute)
        return command  # type: ignore[no-any-return]


@click.group(cls=LazyGroup)
@click.version_option(package_name="effectgate")
def main() -> None:
    """effectgate: make an agent's side effects happen at most once."""
