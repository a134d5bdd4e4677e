"""Backend options: one declaration per option, one validator for every backend.

Each backend declares its options as a tuple of :class:`Option` (class attribute ``options``);
:func:`check_options` is the only place an option mapping is checked, by every backend's ``run``,
by ``xsim run`` / ``compare`` / ``sweep`` before any work, and by the Python sweep API:

- an unknown key is an error naming the backend, suggesting the closest known name
  (``difflib``) and listing every allowed one;
- a value is checked against the option's type, its allowed values or its range;
- the result holds every declared option, absent ones at their default.

Command-line ``--option KEY=VALUE`` items are read here too (:func:`parse_option_items`), values
as YAML scalars, and aimed at one backend with a ``backend.`` prefix
(:func:`split_backend_options`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._suggest import closest
from .errors import OptionError

#: The types an option may declare. ``path``: a str or os.PathLike; ``callable``: any callable
#: (API only, e.g. a progress callback; it cannot be given on the command line).
OPTION_TYPES = ("int", "float", "str", "bool", "path", "callable")


@dataclass(frozen=True)
class Option:
    """One backend option.

    ``type``: one of :data:`OPTION_TYPES`. ``default``: the value when absent (``None`` means
    "decided by the backend", and then ``None`` is also accepted as a value). ``choices``: the
    allowed values (for ``str``). ``low`` / ``high``: an inclusive range for numbers;
    ``low_open=True`` makes the lower bound exclusive (``> low``). ``doc``: one line.
    """

    name: str
    type: str
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def __post_init__(self) -> None:
        if self.type not in OPTION_TYPES:
            raise ValueError(f"option {self.name}: type must be one of {OPTION_TYPES}"
                             f" (got {self.type!r})")

    def describe(self) -> str:
        """``name (type, allowed, default X): doc`` on one line, for ``xsim backends``."""
        if self.choices is not None:
            allowed = "|".join(str(c) for c in self.choices)
        else:
            allowed = self.type + _range_text(self)
        return f"{self.name} ({allowed}, default {self.default!r}): {self.doc}"


def _range_text(o: Option) -> str:
    if o.low is None and o.high is None:
        return ""
    lo = "" if o.low is None else (f"> {_num(o.low)}" if o.low_open else f">= {_num(o.low)}")
    hi = "" if o.high is None else f"<= {_num(o.high)}"
    return " " + " and ".join(t for t in (lo, hi) if t)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


#: Options every backend accepts. ``progress`` is an API callback
#: ``callable(done_ops, total_ops)``; a backend that cannot report progress ignores it.
SEED = Option("seed", "int", 1, "random seed of the simulator (results are deterministic "
              "for a given seed)", low=0, high=2**31 - 1)
PROGRESS = Option("progress", "callable", None,
                  "API only: callable(done_ops, total_ops) called as the replay advances")
COMMON_OPTIONS: tuple[Option, ...] = (SEED, PROGRESS)


def _coerce(backend: str, o: Option, value: Any) -> Any:
    """``value`` checked (and for numbers given as text, converted) against ``o``."""
    where = f"{backend}: option {o.name}"
    if value is None:
        if o.default is None:
            return None
        raise OptionError(f"{where}: expected {_expected(o)} (got None)")
    if o.type in ("int", "float") and isinstance(value, str):
        # `--option wall_limit_s=1e3` arrives as text (YAML reads 1e3 as a string).
        try:
            value = int(value) if o.type == "int" else float(value)
        except ValueError:
            raise OptionError(f"{where}: expected {_expected(o)} (got {_short(value)})") from None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool)
        and math.isfinite(value),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "path": isinstance(value, str | os.PathLike) and str(value) != "",
        "callable": callable(value),
    }[o.type]
    if not ok:
        raise OptionError(f"{where}: expected {_expected(o)} (got {_short(value)})")
    if o.choices is not None and value not in o.choices:
        close = closest(value, o.choices)
        hint = f"; did you mean {close!r}?" if close else ""
        raise OptionError(f"{where}: must be one of {', '.join(map(str, o.choices))}"
                          f" (got {_short(value)}){hint}")
    if o.type in ("int", "float"):
        below = o.low is not None and (value <= o.low if o.low_open else value < o.low)
        above = o.high is not None and value > o.high
        if below or above:
            raise OptionError(f"{where}: expected {_expected(o)} (got {_short(value)})")
    return float(value) if o.type == "float" else value


def _expected(o: Option) -> str:
    kind = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
            "path": "a file or directory path", "callable": "a callable"}[o.type]
    return kind + _range_text(o)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unknown_option_message(backend: str, key: str, allowed: Sequence[str]) -> str:
    """``unknown option 'protcol' for backend htsim; did you mean 'protocol'? allowed: ...``"""
    close = closest(key, allowed)
    hint = f"; did you mean {close!r}?" if close else ";"
    return (f"unknown option {_short(key)} for backend {backend}{hint}"
            f" allowed: {', '.join(sorted(allowed))}")


def check_options(backend: str, declared: Sequence[Option],
                  options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every declared option of ``backend``, validated, absent ones at their default.

    Raises OptionError (a BackendError and a ValueError) for an unknown key or a bad value;
    the message names the backend and the option.
    """
    by_name = {o.name: o for o in declared}
    given = dict(options or {})
    for key in given:
        if key not in by_name:
            raise OptionError(unknown_option_message(backend, str(key), list(by_name)))
    return {name: _coerce(backend, o, given[name]) if name in given else o.default
            for name, o in by_name.items()}


def parse_option_items(items: Sequence[str]) -> dict[str, Any]:
    """``["k=v", ...]`` from ``--option`` -> dict; values are read as YAML scalars
    (``3``, ``0.5``, ``true``, ``ndp``); an empty value is the empty string."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"--option {_short(item)}: expected KEY=VALUE"
                              " (e.g. --option seed=1)")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def split_backend_options(opts: Mapping[str, Any], backends: Sequence[str],
                          declared: Mapping[str, Sequence[Option]] | None = None,
                          ) -> dict[str, dict[str, Any]]:
    """Options for each of several backends (``xsim compare``).

    ``ns3.transport=dctcp`` goes to ns3 only. An unprefixed key goes to every backend that
    declares it (every backend when ``declared`` is None); a key no backend declares is an
    error, with the closest known name.
    """
    per: dict[str, dict[str, Any]] = {b: {} for b in backends}
    for k, v in opts.items():
        head, dot, rest = k.partition(".")
        if dot and head in per:
            per[head][rest] = v
            continue
        if declared is None:
            targets = list(backends)
        else:
            targets = [b for b in backends if any(o.name == k for o in declared.get(b, ()))]
            if not targets:
                names = sorted({o.name for b in backends for o in declared.get(b, ())})
                raise OptionError(unknown_option_message(", ".join(backends), k, names))
        for b in targets:
            per[b][k] = v
    return per


def option_table(declared: Sequence[Option]) -> list[str]:
    """One line per option (:meth:`Option.describe`), in declaration order."""
    return [o.describe() for o in declared]


__all__ = [
    "COMMON_OPTIONS",
    "OPTION_TYPES",
    "PROGRESS",
    "SEED",
    "Option",
    "check_options",
    "option_table",
    "parse_option_items",
    "split_backend_options",
    "unknown_option_message",
]
