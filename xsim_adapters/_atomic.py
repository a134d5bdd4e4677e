"""Atomic file writes: every file xsim writes goes through :func:`write_atomic`.

The file is written inside a fresh stamped temporary directory beside its target and renamed
over it (:func:`._outdir.replace_file`, the one implementation), so a crash never leaves a
half-written file that looks whole, a temporary never takes a user's file name, and every
output gets the permissions a plain ``open(path, "w")`` would give.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ._outdir import replace_file


def write_atomic(path: str | os.PathLike[str], writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file to ``path``.

    The temporary sits beside ``path`` (same filesystem, so the rename is atomic) and is
    removed if ``writer`` raises (disk full included), leaving ``path`` as it was.
    """
    return replace_file(path, writer)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    def _w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return write_atomic(path, _w)
