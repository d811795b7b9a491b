"""An effectgate error raised into a framework that stops only on its own exception type.

Some frameworks turn every ordinary exception from a tool into a tool result and run on
(Microsoft Agent Framework lets only ``MiddlewareFailure`` through). With
``on_refusal="raise"`` the refusal must stop the run *and* stay catchable as the effectgate
error it is: :func:`as_framework_error` gives an instance of a class deriving from both
(``except eg.EffectAmbiguous`` and ``except MiddlewareFailure`` both catch it), with the
same fields.
"""

from __future__ import annotations

import threading
from typing import Any

from effectgate import EffectGateError

__all__ = ["as_framework_error"]

_types: dict[tuple[type[BaseException], type[BaseException]], type[BaseException]] = {}
_lock = threading.Lock()


def as_framework_error(error: BaseException, base: type[BaseException], *,
                       module: str, init: dict[str, Any] | None = None) -> BaseException:
    """``error`` as an instance of ``type(error)`` and ``base`` both (``error`` itself when
    it is no effectgate error or already a ``base``). ``module`` names the class's module (the
    adapter's); ``init`` sets attributes the framework's own ``__init__`` would have set."""
    if not isinstance(error, EffectGateError) or isinstance(error, base):
        return error
    kind = type(error)
    with _lock:
        dual = _types.get((kind, base))
        if dual is None:
            dual = type(kind.__name__, (kind, base), {"__module__": module,
                                                      "__doc__": kind.__doc__})
            _types[(kind, base)] = dual
    converted = dual.__new__(dual)
    converted.__dict__.update(error.__dict__)
    converted.__dict__.update(init or {})
    converted.args = error.args
    return converted
