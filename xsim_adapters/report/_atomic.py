"""Atomic file writes: write a temporary sibling, then ``os.replace`` it over the target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file to ``path``.

    The temporary file sits in the same directory (same filesystem, so the rename is atomic)
    and is removed if ``writer`` raises, so a crash never leaves a half-written ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    def _w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return write_atomic(path, _w)
