"""Optional frameworks: one guard for every integration's imports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["missing_extra", "requires_extra"]


def missing_extra(framework: str, extra: str, err: ImportError) -> ImportError:
    """The ImportError raised when a framework's extra is not installed."""
    return ImportError(
        f"effectgate.integrations.{framework} needs the {extra!r} extra: "
        f'pip install ".[{extra}]" in the effectgate clone ({err})'
    )


@contextlib.contextmanager
def requires_extra(framework: str, extra: str) -> Iterator[None]:
    """Wrap a framework's imports: a missing package raises an ImportError naming the extra::

        with requires_extra("langchain", "langchain"):
            from langchain_core.tools import BaseTool
    """
    try:
        yield
    except ImportError as err:
        raise missing_extra(framework, extra, err) from err
