"""Reading a rows file back for ``--resume`` (``sweep.rows.jsonl``, ``search.rows.jsonl``).

A rows file is input like any other: it may have been edited, truncated, replaced by a FIFO or
a link to ``/dev/zero``. It is read bounded (a regular file only, at most
:data:`MAX_ROWS_FILE_BYTES`, each line at most :data:`MAX_ROW_LINE_BYTES`), and every record is
checked as a fresh run would have written it (:func:`check_record`): a 64-hex digest, a
mapping row with ``error`` "", an iteration time that is a finite number > 0, counts that are
non-negative integers, every other metric a number (finite, or NaN where a run can give NaN).
A record that fails is dropped, so its variant or candidate is simulated again, never trusted;
:class:`ResumedRows` keeps why, and the commands print one warning line saying how many and
the first reasons. A file that cannot be read safely at all is one OutputError line.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import OutputError
from ..plan._fields import shown

MAX_ROWS_FILE_BYTES = 1 << 28  # 256 MiB: a 200,000-candidate search writes about 120 MB
MAX_ROW_LINE_BYTES = 1 << 20  # 1 MiB: a row of a 16k-GPU, 8-type sweep is under 4 KB
MAX_REASONS_SHOWN = 3  # reasons named in the warning line (the count covers every one)
_DIGEST = re.compile(r"[0-9a-f]{64}")
_JOB_NAME = re.compile(r"job\d+")
# Keys every successful row has (lean_row of the search, summary_row of a sweep).
_REQUIRED = ("plan", "ranks", "num_ops", "iteration_time_ns", "tokens_per_s", "mfu")
_COUNTS = ("ranks", "num_ops")
_POSITIVE = ("iteration_time_ns", "tokens_per_s", "alone_iteration_ns")
_SIGNED = ("slowdown_pct",)  # a job may run faster beside another (negative slowdown)
# Metrics a successful run may leave NaN (no ranks in a pipeline window, no peak known).
_NAN_OK = ("bubble_fraction", "mfu_", "tflops_per_gpu_", "wall_s", "cpu_s")


class ResumedRows(dict[str, dict[str, Any]]):
    """digest -> row of every valid successful record (the last one wins), and ``dropped``:
    ``line N: why`` of every record that failed a check (its work is done again)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[str] = []
        self.path: str = ""

    def warning(self, what: str = "row") -> str | None:
        """One line: how many records were dropped and the first reasons; None if none."""
        n = len(self.dropped)
        if not n:
            return None
        shown_ = "; ".join(self.dropped[:MAX_REASONS_SHOWN])
        more = f"; and {n - MAX_REASONS_SHOWN} more" if n > MAX_REASONS_SHOWN else ""
        return (f"{self.path}: {n} {what}{'s' if n != 1 else ''} not valid, simulated again "
                f"instead of trusted ({shown_}{more})")


def _number(v: Any) -> float | None:
    """``v`` as a float if it is a JSON number (not a bool), else None (huge ints: inf)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf


def check_value(key: str, v: Any) -> str | None:
    """Why ``v`` is not what a run writes for the row key ``key``; None if it is."""
    if key == "plan":
        return None if v is None or isinstance(v, str) else f"expected a name (got {shown(v)})"
    if key == "coarsened":
        return None if isinstance(v, bool) else f"expected true or false (got {shown(v)})"
    if _JOB_NAME.fullmatch(key):
        return None if isinstance(v, str) else f"expected a job name (got {shown(v)})"
    x = _number(v)
    if key in _COUNTS:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        return None if ok else f"expected a non-negative integer (got {shown(v)})"
    nan_ok = key.startswith(_NAN_OK)
    if x is not None and math.isnan(x) and nan_ok:
        return None
    if key in _POSITIVE or key.endswith("_iteration_time_ns"):
        ok = x is not None and math.isfinite(x) and x > 0
        return None if ok else f"expected a finite number > 0 (got {shown(v)})"
    if key in _SIGNED or key.endswith("_slowdown_pct"):
        ok = x is not None and math.isfinite(x)
        return None if ok else f"expected a finite number (got {shown(v)})"
    ok = x is not None and math.isfinite(x) and x >= 0
    return None if ok else f"expected a finite number >= 0 (got {shown(v)})"


def check_record(rec: Any) -> tuple[str, dict[str, Any]] | str | None:
    """(digest, row) of a valid successful record; None for a valid record of a failed run
    (not a result: its work is done again, as always); else why the record is not valid."""
    if not isinstance(rec, dict):
        return f"expected a JSON object (got {shown(rec)})"
    digest, row = rec.get("digest"), rec.get("row")
    if not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
        return f"digest: expected 64 hex digits (got {shown(digest)})"
    if not isinstance(row, dict):
        return f"row: expected a mapping (got {shown(row)})"
    variant = rec.get("variant")
    if "variant" in rec and not (isinstance(variant, int) and not isinstance(variant, bool)
                                 and variant >= 0):
        return f"variant: expected a non-negative integer (got {shown(variant)})"
    if "overrides" in rec and not isinstance(rec["overrides"], dict):
        return f"overrides: expected a mapping (got {shown(rec['overrides'])})"
    error = row.get("error")
    if not isinstance(error, str):
        return f"row.error: expected a string (got {shown(error)})"
    if error:
        return None
    for key in _REQUIRED:
        if key not in row:
            return f"row.{key}: required key is missing"
    for key, v in row.items():
        if key == "error":
            continue
        why = check_value(str(key), v)
        if why is not None:
            return f"row.{shown(key) if not isinstance(key, str) else key}: {why}"
    return digest, row


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file; None if absent.

    Opened non-blocking (a FIFO does not wait for a writer) and checked with fstat before any
    byte is read: a FIFO, a device (a link to /dev/zero), a socket or a directory is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OutputError(f"{path}: cannot read the rows file ({e.strerror or e}); remove it"
                          " or run without --resume") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory"
                if stat.S_ISDIR(st.st_mode) else "a device or socket")
        raise OutputError(f"{path}: is {kind}, not a regular file; xsim resumes only from a"
                          " rows file it wrote: remove it, or run without --resume")
    if st.st_size > MAX_ROWS_FILE_BYTES:
        os.close(fd)
        raise OutputError(f"{path}: {st.st_size:,} bytes is more than the "
                          f"{MAX_ROWS_FILE_BYTES:,} a rows file may hold (MAX_ROWS_FILE_BYTES);"
                          " remove it, or run without --resume")
    return fd


def read_rows(path: str | os.PathLike[str]) -> ResumedRows:
    """digest -> row of every valid successful record of a rows file (the last one wins), with
    the records dropped and why (:class:`ResumedRows`). A last line cut short by a kill is
    ignored without a word; an absent file gives no rows. OutputError (one line) for a file
    that is not a regular file or is over :data:`MAX_ROWS_FILE_BYTES`."""
    out = ResumedRows()
    out.path = str(path)
    fd = _open_regular(Path(path))
    if fd is None:
        return out
    budget = MAX_ROWS_FILE_BYTES  # the file may grow while it is read: stop at the cap
    with os.fdopen(fd, "rb") as fh:
        line_no = 0
        while budget > 0:
            raw = fh.readline(min(MAX_ROW_LINE_BYTES + 1, budget))
            if not raw:
                break
            budget -= len(raw)
            line_no += 1
            if len(raw) > MAX_ROW_LINE_BYTES:
                out.dropped.append(f"line {line_no}: longer than {MAX_ROW_LINE_BYTES:,} bytes")
                while raw and not raw.endswith(b"\n") and budget > 0:  # skip the rest of it
                    raw = fh.readline(min(MAX_ROW_LINE_BYTES, budget))
                    budget -= len(raw)
                continue
            if not raw.strip():
                continue
            _take(out, raw, line_no, last=not raw.endswith(b"\n"))
    return out


def _take(out: ResumedRows, raw: bytes, line_no: int, last: bool) -> None:
    """Check one line and keep its row or the reason it was dropped."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if not last:  # (a last line without its newline was cut short by a kill)
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            out.dropped.append(f"line {line_no}: not a JSON record ({why})")
        return
    got = check_record(rec)
    if isinstance(got, str):
        out.dropped.append(f"line {line_no}: {got}")
    elif got is not None:  # (a failed run's record: its work is done again, as always)
        digest, row = got
        out[digest] = row


def warn_dropped(rows: Any, what: str = "row") -> None:
    """Print the one warning line of :meth:`ResumedRows.warning` on stderr, if any."""
    import sys

    line = rows.warning(what) if isinstance(rows, ResumedRows) else None
    if line:
        print(f"xsim: warning: {line}", file=sys.stderr)
