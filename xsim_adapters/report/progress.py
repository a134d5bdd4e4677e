"""A dependency-free progress bar on stderr.

Silent unless the stream is a terminal, so logs and CI output stay clean; ``force=True`` or the
environment variable ``XSIM_PROGRESS=1`` turns it on anyway (``XSIM_PROGRESS=0`` turns it off).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def progress_enabled(stream: TextIO, force: bool | None = None) -> bool:
    """Whether a bar should be drawn on ``stream`` (see the module docstring for the rule)."""
    if force is not None:
        return force
    env = os.environ.get("XSIM_PROGRESS")
    if env in ("0", "1"):
        return env == "1"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressBar:
    """``with ProgressBar(total, "label") as bar: bar.advance(n, "what")``.

    Redraws at most every ``min_interval_s`` seconds (and always at the end) with ``\\r`` so
    it stays on one line; prints a newline when closed.
    """

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None,
                 force: bool | None = None, width: int = 30, min_interval_s: float = 0.1) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(self.stream, force)
        self.width = width
        self.min_interval_s = min_interval_s
        self.done = 0
        self.note = ""
        self._last_draw = -1.0
        self._t0 = time.monotonic()

    def advance(self, n: int = 1, note: str = "") -> None:
        """Count ``n`` more units done; ``note`` says what is happening now."""
        self.done = min(self.done + n, self.total)
        if note:
            self.note = note
        self._draw(final=self.done >= self.total)

    def render(self) -> str:
        """The bar as text, e.g. ``run [#######-------]  2/5  40% 1.2s running flow``."""
        frac = self.done / self.total
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._t0
        text = f"{self.label} [{bar}] {self.done}/{self.total} {frac:4.0%} {elapsed:.1f}s"
        return f"{text} {self.note}".rstrip()

    def _draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        self.stream.write("\r\x1b[K" + self.render())
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(final=True)
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False

    def __enter__(self) -> ProgressBar:
        self._draw(final=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
