"""The search's budgets on the command line, and the one deadline every phase checks.

``budget.seconds`` (or ``--max-seconds``) bounds the whole command: reading the spec, phase 1
(the enumeration and bounds), every pass (main and baselines) and confirmation, measured from
the command's start on the monotonic clock. Phase 1 may use at most
:data:`ENUMERATION_SHARE` of it, so a space too large to analyse in time still gets
simulations over the part analysed; the candidates it did not reach are ``not_reached:budget``
and the result is not proven. Bounds are not refined past the deadline, and simulations still
running at it are killed (:class:`.evaluate.KeptPoolExecutor`; a Ray round finishes).
``budget.evaluations`` (``--max-evaluations``) counts simulations per pass, so it gives the
same result on any machine.
"""

from __future__ import annotations

import math
import time

from ..errors import XsimError

ENUMERATION_SHARE = 0.5  # of a seconds budget, at most, for phase 1 (the rest: simulations)


def parse_seconds(text: str | None, option: str = "--max-seconds") -> float | None:
    """``text`` as a budget in seconds: a finite number > 0; XsimError naming ``option``."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise XsimError(f"{option}: expected a finite number of seconds > 0 (got {text!r})")
    return v


def parse_count(text: str | None, option: str) -> int | None:
    """``text`` as a positive integer count; XsimError naming ``option``."""
    if text is None:
        return None
    try:
        v = int(text.strip())
    except ValueError:
        v = 0
    if v < 1:
        raise XsimError(f"{option}: expected a positive integer (got {text!r})")
    return v


class Deadline:
    """The monotonic instant a ``seconds`` budget ends (never, for None), counted from
    ``start`` (the command's start: :func:`time.monotonic` seconds)."""

    def __init__(self, seconds: float | None, start: float | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self.seconds = seconds
        self.at = math.inf if seconds is None else self.start + seconds

    def passed(self) -> bool:
        """True once the budget is spent."""
        return self.at != math.inf and time.monotonic() >= self.at

    def enumeration_deadline(self) -> float:
        """The monotonic instant phase 1 must stop at (inf without a seconds budget)."""
        if self.seconds is None:
            return math.inf
        return self.start + ENUMERATION_SHARE * self.seconds

    def elapsed(self) -> float:
        """Wall seconds since the start."""
        return time.monotonic() - self.start
