"""Times as the terminal prints them, one home for the summary lines and the pictures."""

from __future__ import annotations

#: (threshold and scale in ns, unit), largest first: a time is shown in the largest unit it
#: reaches, so 1,257,000,000 ns is ``1.257 s``, never ``1.26e+03 ms``.
TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"))


def fmt_ns(ns: float | None) -> str:
    """``ns`` nanoseconds with three decimals in s, ms or us (``1.257 s``, ``42.132 ms``), or
    whole ns below 1 us; ``n/a`` for None."""
    if ns is None:
        return "n/a"
    for scale, unit in TIME_UNITS:
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def axis_unit(span_ns: float) -> tuple[float, str]:
    """(ns per axis unit, unit) for an axis spanning ``span_ns``: the unit :func:`fmt_ns` would
    print the span in (ns below 1 us)."""
    for scale, unit in TIME_UNITS:
        if abs(span_ns) >= scale:
            return scale, unit
    return 1.0, "ns"
