"""Typed readers for plan fields: one message form, ``<path>: <expected> (got <found>)``.

Every reader takes the mapping, the key and the mapping's YAML path and either returns a value
of the expected Python type or raises :class:`PlanError` naming the full path of the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import PlanError

MISSING: Any = object()


def join(path: str, key: str | int) -> str:
    """The YAML path of ``key`` under ``path`` (``a.b``, ``a[3]``; no leading dot at the root)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def got(value: Any) -> str:
    """How a found value is shown in messages (``'two'``, ``True``, ``[4, 12]``, ``a list``)."""
    if value is MISSING:
        return "nothing"
    return repr(value)


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    """``value`` itself, if it is a mapping."""
    if not isinstance(value, Mapping):
        raise PlanError(path, f"expected a mapping (got {got(value)})")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    """``value`` itself, if it is a list."""
    if not isinstance(value, list):
        raise PlanError(path, f"expected a list (got {got(value)})")
    return value


def check_keys(
    m: Mapping[str, Any], path: str, allowed: Iterable[str], required: Iterable[str] = ()
) -> None:
    """Reject unknown keys (listing the allowed ones) and missing required keys."""
    allowed = list(allowed)
    for key in m:
        if key not in allowed:
            raise PlanError(
                join(path, str(key)), f"unknown key; expected one of {', '.join(allowed)}"
            )
    for key in required:
        if key not in m:
            raise PlanError(join(path, key), "required key is missing")


def _fetch(m: Mapping[str, Any], key: str, path: str, default: Any) -> Any:
    if key in m:
        return m[key]
    if default is MISSING:
        raise PlanError(join(path, key), "required key is missing")
    return default


def _is_int(v: Any) -> bool:
    # bool is a subclass of int, but `nodes: true` is a mistake, not 1
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def get_int(
    m: Mapping[str, Any], key: str, path: str, default: Any = MISSING, minimum: int = 1
) -> int:
    """An integer >= ``minimum`` (1: "positive", 0: "non-negative")."""
    v = _fetch(m, key, path, default)
    if not _is_int(v) or v < minimum:
        what = {1: "a positive integer", 0: "a non-negative integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise PlanError(join(path, key), f"expected {what} (got {got(v)})")
    return int(v)


def get_int_in(m: Mapping[str, Any], key: str, path: str, choices: range, default: Any) -> int:
    """An integer in ``choices`` (e.g. ``range(4)`` for a ZeRO stage)."""
    v = _fetch(m, key, path, default)
    if not _is_int(v) or v not in choices:
        lo, hi = choices[0], choices[-1]
        raise PlanError(join(path, key), f"expected an integer in {lo}..{hi} (got {got(v)})")
    return int(v)


def get_number(
    m: Mapping[str, Any],
    key: str,
    path: str,
    default: Any = MISSING,
    *,
    positive: bool = True,
    at_most: float | None = None,
    at_least: float | None = None,
) -> float:
    """A finite number as float: > 0 when ``positive``, else >= 0; optional bounds."""
    v = _fetch(m, key, path, default)
    ok = _is_number(v) and (v > 0 if positive else v >= 0)
    if ok and at_most is not None:
        ok = v <= at_most
    if ok and at_least is not None:
        ok = v >= at_least
    if not ok:
        lo = "0" if at_least is None else f"{at_least:g}"
        if at_most is not None:
            what = (
                f"a number in ({lo}, {at_most:g}]"
                if positive
                else f"a number in [{lo}, {at_most:g}]"
            )
        elif at_least is not None:
            what = f"a number >= {at_least:g}"
        else:
            what = "a positive number" if positive else "a non-negative number"
        raise PlanError(join(path, key), f"expected {what} (got {got(v)})")
    return float(v)


def get_bool(m: Mapping[str, Any], key: str, path: str, default: Any = MISSING) -> bool:
    """``true`` or ``false`` (YAML booleans only; 0/1 are not accepted)."""
    v = _fetch(m, key, path, default)
    if not isinstance(v, bool):
        raise PlanError(join(path, key), f"expected true or false (got {got(v)})")
    return v


def get_str(m: Mapping[str, Any], key: str, path: str, default: Any = MISSING) -> str:
    """A non-empty string."""
    v = _fetch(m, key, path, default)
    if not isinstance(v, str) or not v.strip():
        raise PlanError(join(path, key), f"expected a non-empty string (got {got(v)})")
    return v


def get_enum(
    m: Mapping[str, Any], key: str, path: str, choices: Iterable[str], default: Any = MISSING
) -> str:
    """One of ``choices`` (listed in the message when the value is not)."""
    choices = list(choices)
    v = _fetch(m, key, path, default)
    if not isinstance(v, str) or v not in choices:
        raise PlanError(join(path, key), f"expected one of {', '.join(choices)} (got {got(v)})")
    return v


def get_range(m: Mapping[str, Any], key: str, path: str) -> tuple[int, int]:
    """A half-open ``[start, stop)`` pair of non-negative integers, written as a 2-list."""
    v = _fetch(m, key, path, MISSING)
    if not isinstance(v, list | tuple) or len(v) != 2 or not all(_is_int(x) and x >= 0 for x in v):
        raise PlanError(
            join(path, key), f"expected [start, stop) as two non-negative integers (got {got(v)})"
        )
    return int(v[0]), int(v[1])
