"""Output paths: the rule that keeps user data safe, and whole-directory atomic replacement.

The rule (docs/outputs.md): an output path (``-o`` of trace, run, compare, sweep, export) is
written only when it is absent, an empty directory, or this tool's own earlier output. An
output directory is recognised by its stamp ``.xsim-output`` (JSON: tool, version, kind and the
list of files xsim wrote there) or, for outputs older than the stamp, by holding nothing but
the files xsim writes. Anything else is refused with one line saying how to proceed:

- a directory holding a file xsim did not write (even inside an xsim output): refused, the
  file is named; xsim never deletes it, ``--force`` or not;
- an earlier xsim output of another kind (a trace where a run goes): refused unless ``--force``;
- a file where a directory goes: refused.

A directory output is written whole into a temporary sibling ``.xsim-tmp-<name>-<pid>-XXXXXXXX``
(same parent, so same filesystem) and swapped in by one ``renameat2(RENAME_EXCHANGE)`` where
the kernel has it (two renames otherwise, with SIGINT/SIGTERM blocked between them); the old
output is then removed. A kill at any instant leaves the old output or the new one, whole.
Concurrent writers into one path do not mix: each swaps in its own complete directory, and
the last one to finish wins. Temporary siblings left by a SIGKILLed run (stamped, owner dead)
are removed by the next run that writes beside them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ._proc import _LIBC, TOOL, pid_alive
from ._version import __version__
from .errors import OutputError

STAMP = ".xsim-output"
LOCK = ".xsim-lock"  # a sweep filling its directory holds it: {pid}
TMP_PREFIX = ".xsim-tmp-"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # <linux/fs.h>

# Files each kind of output writes, for outputs written before the stamp existed. A path ending
# in "/" is a trace directory (checked against its manifest).
_RUN_FILES = {"trace/", "timeline.parquet", "ranks.csv", "summary.json", "timeline.png",
              "timeline.perfetto.json"}
LEGACY_FILES: dict[str, set[str]] = {
    "run": _RUN_FILES,
    "sweep": {"sweep.csv", "sweep.parquet", "sweep.yaml", "sweep.rows.jsonl"},
    "compare": {"trace/", "compare.csv", "compare_ranks.csv", "compare.png"},
}
SWEEP_STAMP_FILES = tuple(sorted(LEGACY_FILES["sweep"]))  # a sweep fills its directory later
_TMP_RE = re.compile(re.escape(TMP_PREFIX) + r".*-(\d+)-[A-Za-z0-9_]{8}(?:\.tmp)?")


def _files(root: Path) -> list[str]:
    """Every file (and symlink) below ``root``, relative, ``/``-separated, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for n in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            out.append((rel / n).as_posix())
    return sorted(out)


def _read_stamp(root: Path) -> dict | None:
    try:
        stamp = json.loads((root / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(stamp, dict) and stamp.get("tool") == TOOL and isinstance(
            stamp.get("files"), list):
        return stamp
    return None


def _trace_files(root: Path, prefix: str = "") -> set[str] | None:
    """The files a trace directory written by xsim holds (from its manifest), or None."""
    try:
        manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
        groups = list(manifest["groups"])
        if "schema_version" not in manifest:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    names = {"manifest.json", "plan.yaml", "deps.parquet", "collectives.parquet", STAMP}
    names |= {f"groups/{g}.parquet" for g in groups if isinstance(g, str)}
    return {prefix + n for n in names}


def _legacy(root: Path, files: list[str]) -> tuple[str | None, set[str]]:
    """(kind, files xsim wrote) of an unstamped directory, or (None, empty set)."""
    owned = _trace_files(root)
    if owned is not None:
        return "trace", owned
    if files and all(re.fullmatch(r"et\.\d+\.json", f) for f in files):
        return "chakra", set(files)
    tops = {f.split("/", 1)[0] for f in files}
    for kind, names in LEGACY_FILES.items():
        owned, ok = set(), True
        for top in tops:
            if top in names:
                owned.add(top)
            elif f"{top}/" in names or (kind == "compare" and (root / top).is_dir()):
                sub = _trace_files(root / top, f"{top}/") if top == "trace" else {
                    f"{top}/{n}" for n in _RUN_FILES - {"trace/"}}
                if sub is None:
                    ok = False
                    break
                owned |= sub
            else:
                ok = False
                break
        anchor = {"run": "summary.json", "sweep": "sweep.csv", "compare": "compare.csv"}[kind]
        if ok and (anchor in tops or (kind == "sweep" and "sweep.rows.jsonl" in tops)):
            return kind, owned
    return None, set()


def inspect_output(path: Path) -> tuple[str, set[str], list[str]]:
    """(state, owned, foreign): state is ``absent``, ``empty``, ``file``, ``foreign`` or the
    kind of xsim output there; ``foreign`` lists the files xsim did not write."""
    if not os.path.lexists(path):
        return "absent", set(), []
    if path.is_symlink() or not path.is_dir():
        return "file", set(), []
    files = _files(path)
    if not files:
        return "empty", set(), []
    stamp = _read_stamp(path)
    if stamp is not None:
        kind, owned = str(stamp.get("kind")), {str(f) for f in stamp["files"]} | {STAMP, LOCK}
        return kind, owned, [f for f in files if f not in owned]
    legacy, owned = _legacy(path, files)
    if legacy is None:
        return "foreign", set(), files
    return legacy, owned, [f for f in files if f not in owned]


def _show(files: list[str], limit: int = 3) -> str:
    more = len(files) - limit
    return ", ".join(files[:limit]) + (f" and {more} more" if more > 0 else "")


def check_output(path: str | os.PathLike[str], kind: str, force: bool = False) -> Path:
    """The absolute output path if xsim may write a ``kind`` output there; else OutputError
    with one line saying why and how to proceed. ``force`` allows replacing an xsim output of
    another kind, never a file xsim did not write."""
    target = Path(os.path.realpath(path))
    if target.parent == target:
        raise OutputError(f"{path}: cannot write an output over the filesystem root")
    holder = lock_holder(target)
    if holder is not None:
        raise OutputError(
            f"{path}: another xsim process (pid {holder}) is writing this output; wait for it"
            " to finish, or choose another -o path")
    state, _, foreign = inspect_output(target)
    if state in ("absent", "empty"):
        return target
    if state == "file":
        raise OutputError(
            f"{path}: exists and is a file, not a directory; xsim will not replace it"
            " (choose another -o path, or move the file away)")
    if state == "foreign":
        raise OutputError(
            f"{path}: exists and is not an xsim output (it holds {_show(foreign)}); xsim"
            " never deletes files it did not write: choose another -o path or empty it")
    if foreign:
        raise OutputError(
            f"{path}: is an xsim {state} output but also holds {_show(foreign)}, which xsim"
            " did not write; move those away or choose another -o path")
    if state != kind and not force:
        raise OutputError(
            f"{path}: holds an earlier xsim {state} output, not a {kind} output; pass --force"
            f" to replace it, or choose another -o path")
    return target


def check_output_file(path: str | os.PathLike[str], what: str,
                      is_ours: Callable[[Path], bool]) -> Path:
    """The absolute path if xsim may write the single-file output ``what`` there: absent, or
    an existing file ``is_ours`` recognises (an earlier output of the same kind)."""
    target = Path(os.path.realpath(path))
    if not os.path.lexists(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_siblings(target.parent)
        return target
    if target.is_dir():
        raise OutputError(f"{path}: is a directory; xsim writes the {what} as a file: choose"
                          " another -o path")
    if not is_ours(target):
        raise OutputError(f"{path}: exists and is not an xsim {what}; xsim will not replace it"
                          " (choose another -o path, or move the file away)")
    clean_stale_siblings(target.parent)
    return target


def lock_holder(root: Path) -> int | None:
    """The pid of the live xsim process holding ``root/.xsim-lock`` (not this one), or None."""
    try:
        pid = int((root / LOCK).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and pid_alive(pid) else None


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold ``root/.xsim-lock`` (this pid) while writing into ``root`` in place (a sweep); a
    second writer is refused with OutputError. A lock whose process is dead is taken over."""
    lock = root / LOCK
    tmp = root / f"{LOCK}.{os.getpid()}.tmp"
    tmp.write_text(f"{os.getpid()}\n")
    try:
        for _ in range(3):
            try:
                os.link(tmp, lock)  # atomic: fails if the lock exists, never half-written
                break
            except FileExistsError:
                holder = lock_holder(root)
                if holder is not None:
                    raise OutputError(
                        f"{root}: another xsim process (pid {holder}) is writing this output;"
                        " wait for it to finish, or choose another -o path") from None
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # left by a process that is gone
        else:
            raise OutputError(f"{root}: cannot take the lock {LOCK}")
    finally:
        tmp.unlink()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


def write_stamp(root: Path, kind: str, files: Iterable[str] | None = None) -> None:
    """Write ``root/.xsim-output`` listing ``files`` (default: every file now under root)."""
    listed = sorted(set(files if files is not None else _files(root)) - {STAMP})
    stamp = {"tool": TOOL, "version": __version__, "kind": kind, "pid": os.getpid(),
             "files": listed}
    tmp = root / f".{STAMP}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, root / STAMP)


def clean_stale_siblings(parent: Path) -> int:
    """Remove ``.xsim-tmp-*`` entries in ``parent`` left by dead xsim processes: directories
    only if stamped; files (atomic-write temporaries) by name. Returns how many."""
    removed = 0
    try:
        entries = list(parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        m = _TMP_RE.fullmatch(entry.name)
        if not m or pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                if (entry / STAMP).is_file():
                    shutil.rmtree(entry)
                    removed += 1
            elif entry.name.endswith(".tmp"):
                entry.unlink()
                removed += 1
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the paths ``a`` and ``b`` (Linux renameat2); False if unsupported."""
    if _LIBC is None or not hasattr(_LIBC, "renameat2"):
        return False
    rc = _LIBC.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def swap_in(tmp: Path, target: Path) -> None:
    """Put the finished directory ``tmp`` at ``target``; an old ``target`` is removed after."""
    old: Path | None = None
    with _signals_blocked():
        try:
            os.rename(tmp, target)  # absent or empty target
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            if _exchange(tmp, target):
                old = tmp
            else:
                old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}-{os.getpid()}-",
                                            dir=target.parent))
                write_stamp(old, "old", [])
                os.rename(target, old / "old")
                os.rename(tmp, target)
    if old is not None:
        if not (old / STAMP).exists():  # an unstamped (older) output: mark it ours to clean
            with contextlib.suppress(OSError):
                write_stamp(old, "old", [])
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def output_dir(path: str | os.PathLike[str], kind: str, force: bool = False,
               expect: Iterable[str] = ()) -> Iterator[Path]:
    """Write a ``kind`` output directory at ``path`` as one unit.

    Checks the rule (:func:`check_output`), then yields an empty temporary sibling to write
    into; on normal exit stamps it, checks ``path`` again (it may have changed meanwhile) and
    swaps it in. On any exception, Ctrl-C or SIGTERM the temporary sibling is removed and
    ``path`` is untouched. ``expect``: files written into ``path`` later (listed in the stamp
    as xsim's, e.g. a sweep's incremental rows file).
    """
    target = check_output(path, kind, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}-{os.getpid()}-",
                                dir=target.parent))
    try:
        write_stamp(tmp, kind, [])  # first: a stale sibling is recognisable as ours
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        write_stamp(tmp, kind, set(_files(tmp)) | set(expect))
        check_output(target, kind, force)
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
