"""Finding and running the xsim-htsim driver binary."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from xsim_adapters._proc import child_preexec
from xsim_adapters.errors import BackendError

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


def run_driver(argv: list[str], wall_limit_s: float | None) -> None:
    """Run the driver; raise BackendError with its own stderr if it fails, crashes or overruns."""
    try:
        # subprocess.run kills the driver on timeout, Ctrl-C and SIGTERM (Terminated);
        # child_preexec makes the kernel kill it if this process is SIGKILLed.
        proc = subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=wall_limit_s,
            check=False, preexec_fn=child_preexec(),
        )
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace").strip()
        # The driver prints a progress line every ~10 s: the last one says how far it got.
        last = err.splitlines()[-1] if err else ""
        raise BackendError(
            f"htsim: the driver exceeded the wall limit of {wall_limit_s} s and was stopped"
            + (f"; it said: {last}" if last else "")
        ) from None
    except OSError as e:
        raise BackendError(f"htsim: cannot start the driver {argv[0]}: {e}") from None
    err = proc.stderr.decode(errors="replace").strip()
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        raise BackendError(
            f"htsim: the driver crashed ({name})" + (f"; it said: {err}" if err else "")
        )
    if proc.returncode != 0:
        raise BackendError(
            f"htsim: the driver failed (exit {proc.returncode}): "
            + (err or "no message on stderr")
        )
