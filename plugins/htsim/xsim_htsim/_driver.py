"""Finding and running the xsim-htsim driver binary."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from xsim_adapters.backend_api import BackendError, child_preexec

ENV_VAR = "XSIM_HTSIM_DRIVER"
BINARY = "xsim-htsim"
# Where `make -C plugins/htsim/driver HTSIM_DIR=...` puts the binary in a source checkout.
IN_TREE = Path(__file__).resolve().parent.parent / "driver" / BINARY
BUILD_HINT = (
    "build it with `make -C plugins/htsim/driver HTSIM_DIR=/path/to/csg-htsim` (HTSIM_DIR: an"
    " htsim build made by htsim's own instructions, holding sim/libhtsim.a and the headers of"
    f" sim/), then set {ENV_VAR} to the binary or put it on PATH; see docs/htsim.md"
)


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_driver(explicit: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """(path, "") of the driver, or (None, a reason naming every place looked and how to build).

    Order: ``explicit`` (the ``driver=`` option), then ``$XSIM_HTSIM_DRIVER``, then
    ``xsim-htsim`` on PATH, then the in-tree build location.
    """
    if explicit is not None:
        p = Path(explicit)
        if _executable(p):
            return p, ""
        return None, f"htsim driver not found: option driver={explicit} is not an executable file"
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env)
        if _executable(p):
            return p, ""
        return None, (
            f"htsim driver not found: {ENV_VAR}={env} is not an executable file; {BUILD_HINT}"
        )
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path), ""
    if _executable(IN_TREE):
        return IN_TREE, ""
    return None, (
        f"htsim driver not found: {ENV_VAR} is not set, no '{BINARY}' on PATH, and no {IN_TREE};"
        f" {BUILD_HINT}"
    )


#: A progress line of the driver (replay.cpp, Replayer::report).
PROGRESS_LINE = re.compile(
    r"xsim-htsim: progress: (\d+) of (\d+) ops done, sim t=(\d+) ns")


def run_driver(argv: list[str], wall_limit_s: float | None,
               on_progress: Callable[[int, int, float], None] | None = None) -> float | None:
    """Run the driver; raise BackendError with its own stderr if it fails, crashes or overruns.

    The driver's stderr is read while it runs: each progress line calls ``on_progress(done_ops,
    total_ops, sim_ns)``. Returns the ``time.perf_counter()`` of the first progress line (the
    replay's start, after the driver read its input and built the network), or None.
    """
    try:
        # child_preexec makes the kernel kill the driver if this process is SIGKILLed.
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=child_preexec())
    except OSError as e:
        raise BackendError(f"htsim: cannot start the driver {argv[0]}: {e}") from None
    lines: list[str] = []
    started: list[float] = []
    failure: list[BaseException] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append(line)
            m = PROGRESS_LINE.match(line)
            if m:
                if not started:
                    started.append(time.perf_counter())
                if on_progress is not None and not failure:
                    try:
                        on_progress(int(m.group(1)), int(m.group(2)), float(m.group(3)))
                    except BaseException as exc:  # raised again in the caller's thread
                        failure.append(exc)

    reader = threading.Thread(target=read, name="xsim-htsim-stderr", daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=wall_limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join()
        err = "\n".join(lines).strip()
        # The driver prints a progress line every so often: the last one says how far it got.
        last = err.splitlines()[-1] if err else ""
        raise BackendError(
            f"htsim: the driver exceeded the wall limit of {wall_limit_s} s and was stopped"
            + (f"; it said: {last}" if last else "")
        ) from None
    except BaseException:  # Ctrl-C, SIGTERM: the driver must not run on
        proc.kill()
        proc.wait()
        raise
    reader.join()
    if failure:
        raise failure[0]
    # Progress lines are not messages: an error shows what the driver said besides them.
    err = "\n".join(ln for ln in lines if not PROGRESS_LINE.match(ln)).strip()
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        raise BackendError(
            f"htsim: the driver crashed ({name})" + (f"; it said: {err}" if err else "")
        )
    if rc != 0:
        raise BackendError(
            f"htsim: the driver failed (exit {rc}): " + (err or "no message on stderr")
        )
    return started[0] if started else None
