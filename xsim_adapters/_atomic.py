"""Atomic file writes: write a temporary sibling, then ``os.replace`` it over the target.

Every file xsim writes goes through here, so a crash never leaves a half-written file that
looks whole, and every output gets the permissions a plain ``open(path, "w")`` would give
(``mkstemp`` creates its files 0600).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file to ``path``.

    The temporary file sits in the same directory (same filesystem, so the rename is atomic)
    and is removed if ``writer`` raises, so a crash never leaves a half-written ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The name says who owns it (pid) so a run after a SIGKILL can remove it (see _outdir).
    fd, tmp = tempfile.mkstemp(prefix=f".xsim-tmp-{path.name}-{os.getpid()}-", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    def _w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return write_atomic(path, _w)
