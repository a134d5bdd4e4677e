"""How the ``xsim`` commands print numbers: durations, bytes, percentages and runs of ids."""

from __future__ import annotations

from collections.abc import Sequence

from .._units import fmt_ns  # one home with the pictures (report/plot.py)

__all__ = ["fmt_bytes", "fmt_ns", "fmt_pct", "runs", "span"]


def fmt_pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal (``n/a`` for None)."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def fmt_bytes(n: int) -> str:
    """Bytes in decimal units: ``512 B``, ``3.4 MB``, ``1.2 TB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def runs(items: Sequence[str]) -> list[tuple[list[int], str]]:
    """Consecutive equal items grouped: [(indices, item), ...]."""
    out: list[tuple[list[int], str]] = []
    for i, text in enumerate(items):
        if out and out[-1][1] == text:
            out[-1][0].append(i)
        else:
            out.append(([i], text))
    return out


def span(word: str, ids: Sequence[int]) -> str:
    """``replica 3``, ``replicas 0-15`` or ``replicas 0,2,5``."""
    if len(ids) == 1:
        return f"{word} {ids[0]}"
    if list(ids) == list(range(ids[0], ids[-1] + 1)):
        return f"{word}s {ids[0]}-{ids[-1]}"
    return f"{word}s " + ",".join(map(str, ids))
