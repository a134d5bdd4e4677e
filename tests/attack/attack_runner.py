"""Run ``xsim`` (its ``main()``) on hostile input in a forked child with bounded memory and time.

The child inherits the already imported project (no interpreter start-up per case), limits its
address space to what the parent maps plus :data:`EXTRA_AS_BYTES`, runs ``main(argv)`` with
stderr captured, and exits with main's status (99 and a traceback on any escaping exception).
The parent kills it after ``timeout`` seconds.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

# Import what the commands import before forking, so each child starts warm (matplotlib alone
# takes seconds to import) and the address-space limit applies to the work, not to imports.
import xsim_adapters.api  # noqa: E402, F401
import xsim_adapters.cli  # noqa: E402, F401
import xsim_adapters.report.outputs  # noqa: E402, F401

EXTRA_AS_BYTES = 2 << 30  # 2 GiB of address space beyond the parent's mappings
TIMEOUT_S = 30.0


@dataclass
class Outcome:
    code: int  # exit status; -SIGKILL when killed at the timeout
    stderr: str
    seconds: float


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_cli(argv: Sequence[str], timeout: float = TIMEOUT_S, cwd: str | None = None) -> Outcome:
    """``xsim ARGV`` in a forked, memory-limited child; its exit code, stderr and duration."""
    err = tempfile.TemporaryFile()
    limit = _vm_size_bytes() + EXTRA_AS_BYTES
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 98
        try:
            os.dup2(err.fileno(), 2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the fd 2 set up above
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            if cwd:
                os.chdir(cwd)
            from xsim_adapters.cli import main

            code = main(list(argv))
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001 - reported to the parent as a traceback
            traceback.print_exc()
            code = 99
        finally:
            try:
                sys.stderr.flush()
                sys.stdout.flush()
            finally:
                os._exit(code)
    deadline = t0 + timeout
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        else:
            time.sleep(0.01)
    seconds = time.monotonic() - t0
    err.seek(0)
    text = err.read().decode("utf-8", "replace")
    err.close()
    code = os.waitstatus_to_exitcode(status)
    return Outcome(code, text, seconds)


def assert_clean_error(out: Outcome, named: str, max_seconds: float = 20.0) -> None:
    """Exit 1, no traceback, exactly one ``xsim: error:`` line naming ``named``, in time."""
    assert out.code == 1, f"exit {out.code}, stderr:\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("xsim: error:")]
    assert len(errors) == 1 and len(lines) == 1, f"not one error line:\n{out.stderr[:3000]}"
    assert named in errors[0], f"{named!r} not named in: {errors[0][:500]}"
    assert len(errors[0]) < 1000, f"error line of {len(errors[0])} characters"
    assert out.seconds < max_seconds, f"took {out.seconds:.1f} s"
