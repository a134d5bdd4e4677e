"""Argument checks of the public Python API: a wrong type is one TypeError naming the
function, the argument, what was expected and what was got, before any work (not an
AttributeError deep inside)."""

from __future__ import annotations

import os
from typing import Any

from .errors import ArgumentTypeError

#: What a path argument accepts (bytes paths are not: plan errors name text paths).
PATH_TYPES: tuple[type, ...] = (str, os.PathLike)


def check_arg(func: str, name: str, value: Any, types: type | tuple[type, ...],
              expected: str, optional: bool = False) -> None:
    """Raise ArgumentTypeError unless ``value`` is an instance of ``types`` (or None, with
    ``optional``). ``expected`` says it in words, e.g. ``a Plan (xs.load_plan(path))``."""
    if value is None and optional:
        return
    # bool is an int, but True is never a count or a size a caller meant
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in _tuple(types)):
        return
    raise ArgumentTypeError(f"{func}(): {name}: expected {expected}"
                            f"{' or None' if optional else ''} (got {_describe(value)})")


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _describe(value: Any) -> str:
    """``str 'workloads/x.yaml'``, ``dict``, ``None``: the type, and a short value for text."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        text = repr(value)
        return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"
    return kind
