"""The progress bar of ``xsim run``, ``compare``, ``sweep`` (and any command driving backends),
drawn by tqdm on stderr.

Silent unless the stream is a terminal, so logs and CI output stay clean; ``force=True`` (the
``--progress`` flag) or the environment variable ``XSIM_PROGRESS=1`` turns it on anyway,
``force=False`` (``--quiet``) or ``XSIM_PROGRESS=0`` turns it off.

The bar counts steps (load, build, replay per backend, metrics, write). A step's label is shown
the moment it changes, never throttled away; a running backend moves the bar inside its replay
step through the backend progress hook (:meth:`ProgressBar.replay_hook`), and those numeric
updates are throttled by time (tqdm's ``mininterval``). Packet-level backends measure the step
in simulated time (against the busiest GPU's compute) and call the hook at least every second
(:meth:`~xsim_adapters.backends.base.ReplayProgress.tick`), so the bar and its elapsed clock
keep moving while a replay completes no op for minutes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm


class _Tqdm(tqdm):
    # No monitor thread: our updates come from the caller's thread, and a thread left behind
    # by a bar would outlive short commands and tests.
    monitor_interval = 0


#: Least wall time between two redraws for numbers only, in s (a new label is drawn at once).
MIN_INTERVAL_S = 0.1

#: Highest fraction of a replay step shown from simulated time before the replay ends: the
#: estimate it is measured against is a lower bound, so the bar waits at 99% rather than
#: claiming the end.
SIM_FRACTION_CAP = 0.99


def progress_enabled(stream: TextIO, force: bool | None = None) -> bool:
    """Whether a bar should be drawn on ``stream`` (see the module docstring for the rule)."""
    if force is not None:
        return force
    env = os.environ.get("XSIM_PROGRESS")
    if env in ("0", "1"):
        return env == "1"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _fmt_sim(sim_ns: float) -> str:
    """Simulated time with a readable unit: ``850 ns``, ``12.3 us``, ``4.56 ms``, ``1.23 s``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if sim_ns >= scale:
            return f"{sim_ns / scale:.3g} {unit}"
    return f"{sim_ns:.0f} ns"


class ProgressBar:
    """``with ProgressBar(3, "xsim run") as bar: bar.step("building the topology");
    hook = bar.replay_hook("flow"); ...; bar.step("writing outputs")``, or, counting units
    (``xsim sweep``): ``bar.advance(1)``. Closing the bar completes it.

    ``labels`` records every label in the order it was set (shown or not), for callers and
    tests. Numeric redraws happen at most every ``min_interval_s`` seconds; a new label is
    drawn at once. ``unit``: what ``total`` counts, shown after the count.
    """

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None,
                 force: bool | None = None, min_interval_s: float | None = None,
                 unit: str = "steps") -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(self.stream, force)
        self.done = 0.0  # whole steps plus the running step's fraction
        self.note = ""
        self.labels: list[str] = []
        self.started = 0  # steps started with step() / replay_hook()
        self._closed = False
        self._bar = _Tqdm(
            total=self.total, desc=label, file=self.stream, disable=not self.enabled,
            mininterval=MIN_INTERVAL_S if min_interval_s is None else min_interval_s,
            miniters=0, leave=True, dynamic_ncols=True,
            # steps show the running step's fraction; other units (variants) are whole
            bar_format="{desc} {percentage:3.0f}%|{bar:24}| "
                       + ("{n:.1f}" if unit == "steps" else "{n:.0f}")
                       + f"/{{total}} {unit} [{{elapsed}}]{{postfix}}",
        )

    def advance(self, n: float = 1, note: str = "") -> None:
        """Count ``n`` more steps done; ``note`` (if given) is the step now running."""
        self._move(min(self.done + n, self.total))
        if note:
            self.set_label(note)

    def step(self, note: str) -> None:
        """End the running step (if any: the bar moves to its end) and start the next one,
        labelled ``note``. ``total`` counts these steps."""
        self.labels.append(note)
        self.note = note
        self._bar.set_postfix_str(note, refresh=False)
        if self.started:
            self._move(min(float(self.started), self.total))
        self.started += 1
        self._bar.refresh()  # the new label is drawn now, whatever the throttle says

    def set_label(self, note: str) -> None:
        """Show ``note`` as the current step, drawn immediately (label changes are never
        dropped by the throttle)."""
        self.labels.append(note)
        self.note = note
        self._bar.set_postfix_str(note, refresh=False)
        self._bar.refresh()

    def replay_hook(self, backend: str) -> Callable[..., None]:
        """A backend progress hook (``hook(done_ops, total_ops, sim_ns=None,
        expected_sim_ns=None)``) that moves the bar through the replay's step as it advances
        and labels it ``running BACKEND: done/total ops, sim T``. Starts that step
        (:meth:`step`) labelled ``running BACKEND``.

        The step's fraction is the op count's, or, given ``expected_sim_ns`` (an estimate of
        the iteration, e.g. the busiest GPU's compute), the simulated time's against it, kept
        below :data:`SIM_FRACTION_CAP` until the replay ends (an estimate can be short). A
        packet-level replay completes most ops early and then spends minutes on a few large
        flows: simulated time keeps moving there, the op count does not. The fraction never
        goes back. A call with nothing new still redraws, so the elapsed clock moves."""
        self.step(f"running {backend}")
        base = self.started - 1.0
        shown = [0.0]  # the step's fraction drawn so far (monotonic)

        def hook(done_ops: int, total_ops: int, sim_ns: float | None = None,
                 expected_sim_ns: float | None = None) -> None:
            finished = done_ops >= total_ops
            if finished:
                frac = 1.0
            elif expected_sim_ns and sim_ns is not None:
                frac = min(sim_ns / expected_sim_ns, SIM_FRACTION_CAP)
            else:
                frac = done_ops / total_ops if total_ops > 0 else 1.0
            shown[0] = max(shown[0], frac)
            text = f"running {backend}: {done_ops:,}/{total_ops:,} ops"
            if sim_ns is not None:
                text += f", sim {_fmt_sim(sim_ns)}"
                if expected_sim_ns:
                    text += f" (busiest GPU computes {_fmt_sim(expected_sim_ns)})"
            self.note = text
            # numbers only: throttled by tqdm's mininterval (the label itself was drawn above)
            self._bar.set_postfix_str(text, refresh=False)
            self._move(min(base + shown[0], self.total))
            if finished:
                self._bar.refresh()  # the replay's end is always shown
            else:
                self._bar.update(0)  # redraws (elapsed clock) when mininterval has passed

        return hook

    def _move(self, done: float) -> None:
        # forward only: a lower value (a source that went back) leaves the bar where it is
        if done > self.done:
            self._bar.update(done - self.done)
            self.done = done

    def render(self) -> str:
        """The bar as tqdm draws it (``xsim run  40%|#####...| 2.0/5 steps [00:01], running
        flow``), or "" when the bar is off."""
        return "" if not self.enabled or self._closed else str(self._bar)

    def close(self, note: str = "done") -> None:
        """Complete the bar (unless an exception is propagating), label it ``note`` and end
        the line."""
        if self._closed:
            return
        self._move(float(self.total))
        self.set_label(note)
        self._bar.close()
        self._closed = True

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:  # leave the bar where it stopped, labelled with the failed step
            self._bar.close()
            self._closed = True
