"""Output paths: the one rule that keeps user data safe, and atomic replacement (docs/outputs.md).

The rule: an output path (``-o`` of every command that writes: schema, trace, run, compare,
sweep, search, export, bench-collective) is written only when it is absent, empty, or stamped
as this tool's own earlier output. A directory is xsim's only by its stamp ``.xsim-output``
(JSON: tool, version, kind, pid and the list of files xsim wrote there), never by the names of
the files it holds; a single file only by its content (:func:`check_output_file`). Anything
else is refused with one line saying how to proceed:

- a directory holding a file xsim did not write (even inside an xsim output): refused, the
  file is named; xsim never deletes it, ``--force`` or not;
- an earlier xsim output of another kind (a trace where a run goes): refused unless ``--force``;
- a file where a directory goes: refused.

Every temporary xsim makes is a directory ``.xsim-tmp-<name>-<pid>-XXXXXXXX`` (``mkdtemp``: a
fresh name, created exclusively) beside its target (same filesystem), stamped before anything
else is put in it: a file is written inside it and renamed over its target; a directory output
is written whole into it and swapped in by one ``renameat2(RENAME_EXCHANGE)`` (two renames
where the kernel lacks it, SIGINT/SIGTERM held between them), under the target's writer
lock. A failure at any instant (disk full, exception, Ctrl-C, SIGTERM, SIGKILL) leaves the old
output whole. Only temporaries that carry the stamp and whose pid is dead are removed later;
no file is ever deleted for its name alone.

Stamps and locks are read bounded and as regular files only (:func:`read_small_file`): a FIFO,
a symbolic link, a huge file or an absurd pid is "not ours" / "no live holder".
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
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ._proc import _LIBC, TOOL, pid_alive
from ._version import __version__
from .errors import OutputError

STAMP = ".xsim-output"
LOCK = ".xsim-lock"  # the writer filling or swapping a directory holds it: "{pid}\n"
TMP_PREFIX = ".xsim-tmp-"
STAMP_MAX_BYTES = 16 << 20  # a stamp lists every file: 100k Chakra ranks take ~2 MB
LOCK_MAX_BYTES = 64  # "<pid>\n"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # <linux/fs.h>
_NAME_IN_TMP = 64  # characters of the target's name kept in a temporary's name (NAME_MAX 255)

SWEEP_STAMP_FILES = ("sweep.csv", "sweep.parquet", "sweep.rows.jsonl", "sweep.yaml")
# mkdtemp's suffix is 8 characters of [a-z0-9_]; a pid has at most 7 digits (PID_MAX_LIMIT)
_TMP_RE = re.compile(re.escape(TMP_PREFIX) + r".*-(\d{1,7})-[a-z0-9_]{8}")


# ---------------------------------------------------------------- bounded reading


def read_small_file(path: str | os.PathLike[str], limit: int) -> tuple[bytes | None, str]:
    """(content, "") of ``path`` if it is a regular file (not through a symbolic link) of at
    most ``limit`` bytes; else (None, why: "is absent", "is a symbolic link", "is not a regular
    file", "is larger than N bytes", "cannot be read: ..."). Never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "is absent"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "is a symbolic link"
        return None, f"cannot be read: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if st.st_size > limit:
            return None, f"is larger than {limit} bytes"
        chunks, size = [], 0
        while size <= limit:
            b = os.read(fd, limit + 1 - size)
            if not b:
                break
            chunks.append(b)
            size += len(b)
    except OSError as e:
        return None, f"cannot be read: {e.strerror}"
    finally:
        os.close(fd)
    if size > limit:
        return None, f"is larger than {limit} bytes"
    return b"".join(chunks), ""


def read_stamp(root: Path) -> tuple[dict | None, str]:
    """(stamp, "") of directory ``root`` if its ``.xsim-output`` is an xsim stamp; else
    (None, why it is not one; "is absent" when there is none)."""
    data, why = read_small_file(root / STAMP, STAMP_MAX_BYTES)
    if data is None:
        return None, why
    try:
        stamp = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "is not JSON"
    if not (isinstance(stamp, dict) and stamp.get("tool") == TOOL
            and isinstance(stamp.get("kind"), str) and isinstance(stamp.get("files"), list)
            and all(isinstance(f, str) for f in stamp["files"])):
        return None, "is not an xsim stamp"
    return stamp, ""


def _tmp_pid(entry: Path) -> int | None:
    """The owner pid of ``entry`` if it is an xsim temporary: a real directory named
    ``.xsim-tmp-<name>-<pid>-XXXXXXXX`` holding an xsim stamp; else None."""
    m = _TMP_RE.fullmatch(entry.name)
    if m is None or entry.is_symlink() or not entry.is_dir():
        return None
    return int(m.group(1)) if read_stamp(entry)[0] is not None else None


# ---------------------------------------------------------------- what is at a path


def _files(root: Path) -> list[str]:
    """Every file (and symlink) below ``root``, relative, ``/``-separated, sorted; xsim's own
    temporaries (stamped ``.xsim-tmp-*`` directories, live or left by a kill) are left out."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        rel = d.relative_to(root)
        links = [n for n in dirnames if (d / n).is_symlink()]
        dirnames[:] = [n for n in dirnames if n not in links and _tmp_pid(d / n) is None]
        out.extend((rel / n).as_posix() for n in filenames + links)
    return sorted(out)


def inspect_output(path: Path) -> tuple[str, set[str], list[str]]:
    """(state, owned, foreign): state is ``absent``, ``empty``, ``file``, ``foreign`` or the
    kind of xsim output there; ``foreign`` lists the files xsim did not write. A directory
    holding nothing but a lock file is empty."""
    if not os.path.lexists(path):
        return "absent", set(), []
    if path.is_symlink() or not path.is_dir():
        return "file", set(), []
    files = _files(path)
    if not files or files == [LOCK]:
        return "empty", set(), []
    stamp, _ = read_stamp(path)
    if stamp is None:
        return "foreign", set(), files
    owned = set(stamp["files"]) | {STAMP, LOCK}
    return stamp["kind"], owned, [f for f in files if f not in owned]


def _show(files: list[str], limit: int = 3) -> str:
    more = len(files) - limit
    return ", ".join(files[:limit]) + (f" and {more} more" if more > 0 else "")


def _busy(path: str | os.PathLike[str], holder: int) -> OutputError:
    return OutputError(f"{path}: another xsim process (pid {holder}) is writing this output;"
                       " wait for it to finish, or choose another -o path")


def _absolute(path: str | os.PathLike[str]) -> Path:
    """The real absolute ``path``; OutputError unless it is valid UTF-8 (the Parquet and Arrow
    writers, and the stamp, need it to be)."""
    target = Path(os.path.realpath(path))
    try:
        str(target).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise OutputError(f"{shown}: the path is not valid UTF-8; xsim writes outputs only"
                          " under UTF-8 names: choose another -o path") from None
    return target


def check_output(path: str | os.PathLike[str], kind: str, force: bool = False) -> Path:
    """The absolute output path if xsim may write a ``kind`` output there; else OutputError
    with one line saying why and how to proceed. ``force`` allows replacing an xsim output of
    another kind, never a file xsim did not write."""
    target = _absolute(path)
    if target.parent == target:
        raise OutputError(f"{path}: cannot write an output over the filesystem root")
    holder = lock_holder(target)
    if holder is not None:
        raise _busy(path, holder)
    state, _, foreign = inspect_output(target)
    if state in ("absent", "empty"):
        return target
    if state == "file":
        raise OutputError(
            f"{path}: exists and is a file, not a directory; xsim will not replace it"
            " (choose another -o path, or move the file away)")
    if state == "foreign":
        stamp_why = read_stamp(target)[1]
        why = ("no .xsim-output stamp" if stamp_why == "is absent"
               else f"its {STAMP} {stamp_why}")
        raise OutputError(
            f"{path}: exists and is not an xsim output ({why}; it holds {_show(foreign)});"
            " xsim never deletes files it did not write: choose another -o path or empty it")
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
    """The absolute path if xsim may write the single-file output ``what`` there: absent, an
    empty regular file, or a file ``is_ours`` recognises by its content (an earlier output of
    the same kind; it must read bounded, e.g. with :func:`read_small_file`)."""
    target = _absolute(path)
    if os.path.lexists(target):
        if target.is_dir():
            raise OutputError(f"{path}: is a directory; xsim writes the {what} as a file:"
                              " choose another -o path")
        st = os.lstat(target)
        empty = stat.S_ISREG(st.st_mode) and st.st_size == 0
        if not empty and not (stat.S_ISREG(st.st_mode) and is_ours(target)):
            raise OutputError(f"{path}: exists and is not an xsim {what}; xsim will not"
                              " replace it (choose another -o path, or move the file away)")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(target.parent)
    return target


# ---------------------------------------------------------------- temporaries and files


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (which must not exist) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _stamp_bytes(kind: str, files: Iterable[str]) -> bytes:
    stamp = {"tool": TOOL, "version": __version__, "kind": kind, "pid": os.getpid(),
             "files": sorted(set(files) - {STAMP})}
    return (json.dumps(stamp, indent=1) + "\n").encode("utf-8")


@contextlib.contextmanager
def temp_dir(parent: Path, name: str, kind: str = "tmp") -> Iterator[Path]:
    """A new temporary directory ``parent/.xsim-tmp-<name>-<pid>-XXXXXXXX``, stamped (kind
    ``kind``, no files) before anything else goes in, and removed when the block exits in any
    way (whatever of it is still there: a directory renamed away meanwhile is not followed).
    Created and removed with SIGINT/SIGTERM held, so a signal never leaves half of one; a
    SIGKILL leaves a stamped one that :func:`clean_stale_siblings` recognises."""
    tmp: Path | None = None
    try:
        with _SignalHold():  # a signal that comes meanwhile is raised at its end, in the try
            tmp = Path(tempfile.mkdtemp(
                prefix=f"{TMP_PREFIX}{name[:_NAME_IN_TMP]}-{os.getpid()}-", dir=parent))
            _write_new(tmp / STAMP, _stamp_bytes(kind, []))
        yield tmp
    finally:
        if tmp is not None:
            with _SignalHold():
                _remove_temp(tmp)


def _remove_temp(tmp: Path) -> None:
    """Remove a stamped temporary, its stamp last (a kill meanwhile leaves it recognisable)."""
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return
    for e in entries:
        if e.name != STAMP:
            with contextlib.suppress(OSError):
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
    with contextlib.suppress(OSError):
        os.unlink(tmp / STAMP)
    with contextlib.suppress(OSError):
        os.rmdir(tmp)


def replace_file(path: str | os.PathLike[str], writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp)`` on a path inside a fresh stamped temporary directory beside
    ``path``, then rename the file over ``path``; the temporary goes in every case, so a
    failure (disk full, Ctrl-C) leaves ``path`` as it was. Permissions follow the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_dir(path.parent, path.name) as tmpdir:
        tmp = tmpdir / (path.name if path.name != STAMP else "stamp.json")  # not the marker
        writer(str(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    return path


def write_stamp(root: Path, kind: str, files: Iterable[str] | None = None) -> None:
    """Write ``root/.xsim-output`` listing ``files`` (default: every file now under root)."""
    data = _stamp_bytes(kind, files if files is not None else _files(root))
    replace_file(root / STAMP, lambda tmp: _write_new(Path(tmp), data))


def claim_files(root: Path, names: Iterable[str]) -> None:
    """Add ``names`` to the stamp of the xsim output ``root`` before writing them in place, so
    that a run killed while writing leaves nothing its stamp does not list (no-op when ``root``
    is not stamped, e.g. a directory the Python API was given)."""
    stamp, _ = read_stamp(root)
    if stamp is not None:
        write_stamp(root, stamp["kind"], set(stamp["files"]) | set(names))


def clean_stale_siblings(parent: Path) -> int:
    """Remove the temporaries (:func:`make_temp_dir`) in ``parent`` whose owner process is
    dead; nothing else (a file or an unstamped directory is never taken for one by its name).
    Returns how many."""
    removed = 0
    try:
        entries = list(parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        pid = _tmp_pid(entry)
        if pid is not None and not pid_alive(pid):
            _remove_temp(entry)
            removed += 1
    return removed


# ---------------------------------------------------------------- the writer lock


def lock_holder(root: Path) -> int | None:
    """The pid of the live process (not this one) holding ``root/.xsim-lock``, or None: a lock
    that is not a small regular file holding a pid a process can have names no holder."""
    data, _ = read_small_file(root / LOCK, LOCK_MAX_BYTES)
    try:
        pid = int((data or b"").decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return pid if pid != os.getpid() and pid_alive(pid) else None


def take_lock(root: Path) -> int:
    """Take ``root/.xsim-lock`` for this process (atomically: link of a complete file); returns
    its inode for :func:`release_lock`. A lock this process holds already is kept; one whose
    holder is gone (or that is not a valid lock) is taken over; a live holder: OutputError."""
    with temp_dir(root, "lock") as tmpdir:
        _write_new(tmpdir / LOCK, f"{os.getpid()}\n".encode())
        for _ in range(3):
            try:
                os.link(tmpdir / LOCK, root / LOCK)  # fails if the lock exists
                return os.lstat(root / LOCK).st_ino
            except FileExistsError:
                data, _ = read_small_file(root / LOCK, LOCK_MAX_BYTES)
                if data is not None and data.strip() == str(os.getpid()).encode():
                    return os.lstat(root / LOCK).st_ino  # carried in by output_dir(lock=True)
                holder = lock_holder(root)
                if holder is not None:
                    raise _busy(root, holder) from None
                try:
                    (root / LOCK).unlink()  # left by a process that is gone, or not a lock
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise OutputError(f"{root}: {LOCK} is not a lock file xsim can take over"
                                      f" ({e.strerror}); remove it, or choose another -o"
                                      " path") from None
        raise OutputError(f"{root}: cannot take the lock {LOCK}")


def release_lock(root: Path, ino: int) -> None:
    """Remove ``root/.xsim-lock`` if it is still the one :func:`take_lock` made (a directory
    swapped in meanwhile has its own, or none)."""
    with contextlib.suppress(OSError):
        if os.lstat(root / LOCK).st_ino == ino:
            (root / LOCK).unlink()


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold ``root/.xsim-lock`` while writing into ``root`` in place; a second writer is
    refused with OutputError naming the holder's pid."""
    ino = take_lock(root)
    try:
        yield
    finally:
        release_lock(root, ino)


# ---------------------------------------------------------------- directory outputs


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


class _SignalHold:
    """Hold SIGINT and SIGTERM over a step that must not be cut in two (a swap, making or
    removing a temporary): a signal that comes meanwhile is recorded and acted on when the
    block exits. Python handlers run in the main thread only, and a signal mask would not
    stop delivery to the other threads (Arrow's, OpenMP's), so the handlers are swapped."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> _SignalHold:
        self.pending: list[int] = []
        self.old: dict[int, object] = {}
        with contextlib.suppress(ValueError):  # not the main thread: no Python handler runs
            for s in self.SIGNALS:
                self.old[s] = signal.signal(s, lambda n, _f: self.pending.append(n))
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        if self.pending:
            n = self.pending[0]
            h = self.old.get(n)
            if callable(h):
                h(n, None)  # raises KeyboardInterrupt / Terminated as the signal would
            elif h == signal.SIG_DFL:
                os.kill(os.getpid(), n)


def swap_in(tmp: Path, target: Path) -> None:
    """Put the finished directory ``tmp`` at ``target``; an old ``target`` is removed after
    (it is stamped, or empty and then stamped here, so a kill meanwhile leaves a temporary
    the next run recognises)."""
    with _SignalHold():  # a signal meanwhile is acted on once the swap is whole
        try:
            os.rename(tmp, target)  # absent or empty target
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        if _exchange(tmp, target):  # the old output is now at tmp: the caller removes it
            if read_stamp(tmp)[0] is None:  # an empty directory (with a lock) was replaced
                with contextlib.suppress(OSError):
                    _write_new(tmp / STAMP, _stamp_bytes("old", []))
            return
        with temp_dir(target.parent, target.name, "old") as old:
            os.rename(target, old / "old")
            os.rename(tmp, target)


def _swap_checked(tmp: Path, target: Path, kind: str, force: bool) -> None:
    """Check the rule on ``target`` again and swap ``tmp`` in, holding ``target``'s writer lock
    across both when it is a directory (a sweep filling it meanwhile is not overwritten)."""
    for _ in range(3):
        check_output(target, kind, force)  # before touching it: never lock a user's directory
        if os.path.isdir(target) and not os.path.islink(target):
            ino = take_lock(target)  # OutputError naming the holder if another writer has it
            try:
                check_output(target, kind, force)
                swap_in(tmp, target)  # our lock leaves with the old directory
            finally:
                release_lock(target, ino)  # a no-op after the swap
            return
        try:
            os.rename(tmp, target)  # absent: atomic, and fails if a directory appeared
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise OutputError(f"{target}: changed while xsim was writing it; run again")


@contextlib.contextmanager
def output_dir(path: str | os.PathLike[str], kind: str, force: bool = False,
               expect: Iterable[str] = (), lock: bool = False) -> Iterator[Path]:
    """Write a ``kind`` output directory at ``path`` as one unit.

    Checks the rule (:func:`check_output`), then yields an empty stamped temporary sibling to
    write into; on normal exit stamps it with the files written (plus ``expect``: files that
    will be written in place later, e.g. a sweep's rows), checks ``path`` again under its lock
    and swaps it in. On any exception, Ctrl-C or SIGTERM the temporary is removed and ``path``
    is untouched. ``lock``: the new directory arrives holding this process's writer lock (for
    a directory filled in place next; release it with :func:`release_lock`).
    """
    target = check_output(path, kind, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(target.parent)
    with temp_dir(target.parent, target.name, kind) as tmp:  # removed whatever happens
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        write_stamp(tmp, kind, set(_files(tmp)) | set(expect))
        if lock:
            _write_new(tmp / LOCK, f"{os.getpid()}\n".encode())
        _swap_checked(tmp, target, kind, force)  # after it, tmp is gone or the old output


@contextlib.contextmanager
def fill_output(path: str | os.PathLike[str], kind: str, force: bool = False,
                resume: bool = False, expect: Iterable[str] = ()) -> Iterator[tuple[Path, bool]]:
    """An output filled file by file (sweep, search: rows must reach the disk as they finish):
    yields (the directory to write into, whether an earlier ``kind`` output there is kept),
    holding the writer lock on it throughout.

    - ``resume`` and an earlier ``kind`` output at ``path``: that directory, kept.
    - ``path`` absent or empty: a new stamped directory there, filled in place (a kill keeps
      the rows for ``--resume``).
    - an earlier output to replace: a temporary sibling, swapped in whole at the end; any
      failure (disk full, exception, Ctrl-C, SIGTERM, SIGKILL) leaves the old output whole.
    """
    target = check_output(path, kind, force)
    state = inspect_output(target)[0]
    if state in ("absent", "empty") or (resume and state == kind):
        if state == kind:
            for dirpath, _, _ in os.walk(target):
                clean_stale_siblings(Path(dirpath))  # what a killed run left inside
            ino = take_lock(target)
        else:
            with output_dir(target, kind, force, expect, lock=True):
                pass
            ino = os.lstat(target / LOCK).st_ino
        try:
            yield target, state == kind
        finally:
            release_lock(target, ino)
        return
    with output_dir(target, kind, force, expect) as tmp:
        yield tmp, False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
