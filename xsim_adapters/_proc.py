"""Child processes that die with their parent, and temporary directories that do not outlive it.

Every process xsim starts (the ns-3 worker, the htsim driver, sweep workers) asks the Linux
kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``, see prctl(2)), so a
SIGKILLed ``xsim`` leaves no simulator running. Temporary directories carry the owner's pid in
their name and a small stamp file; one whose owner is dead is removed by the next run.
SIGTERM is turned into :class:`Terminated` (a ``KeyboardInterrupt``) so the same ``finally``
blocks that clean up after Ctrl-C also run when xsim is terminated.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
TMP_STAMP = ".xsim-tmp-owner"  # inside every temporary directory: {"tool", "pid"}
TOOL = "xsim-adapters"
#: The largest pid Linux can hand out (PID_MAX_LIMIT, include/linux/threads.h, 64-bit): a pid
#: read from a file above it (or <= 0) names no process, and os.kill would overflow on it.
PID_MAX_LIMIT = 1 << 22

_LIBC = None
if sys.platform.startswith("linux"):
    try:  # loaded now, not after fork(): dlopen in a forked child of a threaded parent can hang
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc symbols visible
        _LIBC = None


class Terminated(KeyboardInterrupt):
    """xsim received SIGTERM; raised like Ctrl-C so cleanup code runs."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def install_sigterm_handler() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread (no-op elsewhere)."""
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, _on_sigterm)


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Ask for SIGKILL when this process's parent dies (Linux; False elsewhere).

    ``parent_pid``: the pid the parent had; if it is already gone (the parent died before this
    call, so the kernel will never signal), exit at once.
    """
    if _LIBC is None:
        return False
    ok = _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return ok


def child_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child die with this process
    (None where the kernel has no parent-death signal)."""
    if _LIBC is None:
        return None
    parent = os.getpid()

    def _preexec() -> None:
        die_with_parent(parent)

    return _preexec


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to another user); False for a pid
    no process can have (<= 0 or above :data:`PID_MAX_LIMIT`)."""
    if not 0 < pid <= PID_MAX_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_pid(name: str, prefix: str) -> int | None:
    m = re.fullmatch(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]+", name)
    return int(m.group(1)) if m else None


def clean_stale_tempdirs(prefix: str, root: str | os.PathLike[str] | None = None) -> int:
    """Remove ``root/<prefix><pid>-*`` directories made by :func:`owned_tempdir` whose owner
    process is dead and which carry its stamp; returns how many were removed."""
    base = Path(root or tempfile.gettempdir())
    removed = 0
    try:
        entries = list(base.iterdir())
    except OSError:
        return 0
    for entry in entries:
        pid = _stale_pid(entry.name, prefix)
        if pid is None or pid_alive(pid) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            stamp = json.loads((entry / TMP_STAMP).read_text())
        except (OSError, ValueError):
            continue  # not ours: never delete what we cannot recognise
        if isinstance(stamp, dict) and stamp.get("tool") == TOOL and stamp.get("pid") == pid:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[Path]:
    """A temporary directory ``<tmp>/<prefix><pid>-XXXXXXXX`` removed on exit (normal, exception,
    Ctrl-C, SIGTERM); first removes the ones dead xsim processes left behind (SIGKILL)."""
    clean_stale_tempdirs(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        (path / TMP_STAMP).write_text(json.dumps({"tool": TOOL, "pid": os.getpid()}))
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
