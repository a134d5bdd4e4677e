"""Typed readers for plan fields: one message form, ``<path>: <expected> (got <found>)``.

Every reader takes the mapping, the key and the mapping's YAML path and either returns a value
of the expected Python type or raises :class:`PlanError` naming the full path of the field.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from .._suggest import closest
from ..errors import PlanError

MISSING: Any = object()
MIN_POSITIVE = 1e-12  # the smallest positive float a plan field may hold (a tolerance, not a unit)

# While the JSON Schema of the plan format is generated (xsim_adapters.plan.schema), every
# reader below also reports what it accepts here, so the schema follows this code by itself.
RECORDER: Any = None


def note(path: str, fragment: dict[str, Any], default: Any = MISSING) -> None:
    """Report to the schema recorder, if one is active, that ``path`` accepts ``fragment``
    (a JSON Schema), with ``default`` when the field has one. Parsers call this where they
    accept a value without one of the readers below (a preset name, an alternative form)."""
    if RECORDER is not None:
        RECORDER.field(path, fragment, default)


def join(path: str, key: Any) -> str:
    """The YAML path of ``key`` under ``path`` (``a.b``, ``a[3]``; no leading dot at the root).

    A key that is not a plain printable string of at most 80 characters is shown bounded.
    """
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    if not (isinstance(key, str) and key.isprintable() and len(key) <= MAX_SHOWN_CHARS):
        key = shown(key)
    return f"{path}.{key}" if path else key


# Found values are shown bounded: a hostile plan can hold a 2 MiB string or a deeply shared
# structure, and an error message must neither take long to build nor flood the terminal.
MAX_SHOWN_CHARS = 80
_REPR = reprlib.Repr()
_REPR.maxstring = MAX_SHOWN_CHARS
_REPR.maxother = MAX_SHOWN_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3
_REPR.maxlong = 40

# Names of plans, device groups and device types: they become file names (one Parquet file
# per group) and labels, so they are restricted to a portable, path-free character set.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_NAME_RE = re.compile(NAME_PATTERN)


def shown(value: Any) -> str:
    """``repr(value)`` cut to at most :data:`MAX_SHOWN_CHARS` characters (bounded work)."""
    text = _REPR.repr(value)
    if len(text) > MAX_SHOWN_CHARS:
        text = text[: MAX_SHOWN_CHARS - 3] + "..."
    return text


def text(value: str, limit: int = 240) -> str:
    """A string (e.g. a file path) as is when printable and at most ``limit`` chars, else
    shown bounded like :func:`shown` (quoted, escaped, cut)."""
    if isinstance(value, str) and value.isprintable() and len(value) <= limit:
        return value
    return shown(value)


def got(value: Any) -> str:
    """How a found value is shown in messages (``'two'``, ``True``, ``[4, 12]``), bounded."""
    if value is MISSING:
        return "nothing"
    return shown(value)


def is_name(value: Any) -> bool:
    """True if ``value`` is a string matching :data:`NAME_PATTERN`."""
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None


def check_name(value: Any, path: str, what: str) -> str:
    """``value`` itself if it is a valid name (:data:`NAME_PATTERN`), else a PlanError."""
    if RECORDER is not None:
        RECORDER.name(value, path)
    if not is_name(value):
        raise PlanError(
            path,
            f"expected a {what} of 1-64 characters from A-Z a-z 0-9 . _ - starting with a "
            f"letter or digit (got {got(value)})",
        )
    return value


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    """``value`` itself, if it is a mapping."""
    if RECORDER is not None:
        RECORDER.container(path, "object")
    if not isinstance(value, Mapping):
        raise PlanError(path, f"expected a mapping (got {got(value)})")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    """``value`` itself, if it is a list."""
    if RECORDER is not None:
        RECORDER.container(path, "array")
    if not isinstance(value, list):
        raise PlanError(path, f"expected a list (got {got(value)})")
    return value


def check_keys(
    m: Mapping[str, Any], path: str, allowed: Iterable[str], required: Iterable[str] = ()
) -> None:
    """Reject unknown keys (listing the allowed ones) and missing required keys."""
    allowed = list(allowed)
    if RECORDER is not None:
        RECORDER.keys(path, allowed, list(required))
    for key in m:
        if key not in allowed:
            close = closest(key, allowed)
            hint = f" (did you mean {close}?)" if close else ""
            raise PlanError(join(path, key),
                            f"unknown key{hint}; expected one of {', '.join(allowed)}")
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
    m: Mapping[str, Any],
    key: str,
    path: str,
    default: Any = MISSING,
    minimum: int = 1,
    maximum: int | None = None,
    limit: str = "",
) -> int:
    """An integer >= ``minimum`` (1: "positive", 0: "non-negative") and <= ``maximum``.

    ``limit`` names why ``maximum`` is what it is (shown in the message when it is exceeded).
    """
    note(join(path, key), {"type": "integer", "minimum": minimum,
                           **({} if maximum is None else {"maximum": maximum})}, default)
    v = _fetch(m, key, path, default)
    if not _is_int(v) or v < minimum:
        what = {1: "a positive integer", 0: "a non-negative integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise PlanError(join(path, key), f"expected {what} (got {got(v)})")
    if maximum is not None and v > maximum:
        why = f" ({limit})" if limit else ""
        raise PlanError(join(path, key), f"expected at most {maximum}{why} (got {got(v)})")
    return int(v)


def get_int_in(m: Mapping[str, Any], key: str, path: str, choices: range, default: Any) -> int:
    """An integer in ``choices`` (e.g. ``range(4)`` for a ZeRO stage)."""
    note(join(path, key), {"type": "integer", "minimum": choices[0], "maximum": choices[-1]},
         default)
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
    frag: dict[str, Any] = {"type": "number"}
    if at_least is not None:
        frag["minimum"] = at_least
    elif positive:
        frag["exclusiveMinimum"] = 0
    else:
        frag["minimum"] = 0
    if at_most is not None:
        frag["maximum"] = at_most
    note(join(path, key), frag, default)
    v = _fetch(m, key, path, default)
    ok = _is_number(v) and (v > 0 if positive else v >= 0)
    if ok and positive and not _is_int(v) and v < MIN_POSITIVE:
        ok = False  # denormal-scale values (1e-300) overflow every division by them
    if ok and at_most is not None:
        ok = v <= at_most
    if ok and at_least is not None:
        ok = v >= at_least
    if not ok:
        tiny = _is_number(v) and 0 < v < MIN_POSITIVE and positive and at_least is None
        lo = f"{MIN_POSITIVE:g}" if tiny else "0" if at_least is None else f"{at_least:g}"
        if at_most is not None:
            what = (
                f"a number in ({lo}, {at_most:g}]"
                if positive and at_least is None and not tiny
                else f"a number in [{lo}, {at_most:g}]"
            )
        elif tiny:
            what = f"a number >= {lo}"
        elif at_least is not None:
            what = f"a number >= {at_least:g}"
        else:
            what = "a positive number" if positive else "a non-negative number"
        raise PlanError(join(path, key), f"expected {what} (got {got(v)})")
    return float(v)


def get_bool(m: Mapping[str, Any], key: str, path: str, default: Any = MISSING) -> bool:
    """``true`` or ``false`` (YAML booleans only; 0/1 are not accepted)."""
    note(join(path, key), {"type": "boolean"}, default)
    v = _fetch(m, key, path, default)
    if not isinstance(v, bool):
        raise PlanError(join(path, key), f"expected true or false (got {got(v)})")
    return v


def get_str(m: Mapping[str, Any], key: str, path: str, default: Any = MISSING) -> str:
    """A non-empty string."""
    note(join(path, key), {"type": "string", "pattern": r"\S"}, default)
    v = _fetch(m, key, path, default)
    if not isinstance(v, str) or not v.strip():
        raise PlanError(join(path, key), f"expected a non-empty string (got {got(v)})")
    return v


def get_enum(
    m: Mapping[str, Any], key: str, path: str, choices: Iterable[str], default: Any = MISSING
) -> str:
    """One of ``choices`` (listed in the message when the value is not)."""
    choices = list(choices)
    note(join(path, key), {"enum": choices}, default)
    v = _fetch(m, key, path, default)
    if not isinstance(v, str) or v not in choices:
        raise PlanError(join(path, key), f"expected one of {', '.join(choices)} (got {got(v)})")
    return v


def get_range(m: Mapping[str, Any], key: str, path: str) -> tuple[int, int]:
    """A half-open ``[start, stop)`` pair of non-negative integers, written as a 2-list."""
    note(join(path, key), {"type": "array", "items": {"type": "integer", "minimum": 0},
                           "minItems": 2, "maxItems": 2})
    v = _fetch(m, key, path, MISSING)
    if not isinstance(v, list | tuple) or len(v) != 2 or not all(_is_int(x) and x >= 0 for x in v):
        raise PlanError(
            join(path, key), f"expected [start, stop) as two non-negative integers (got {got(v)})"
        )
    return int(v[0]), int(v[1])
