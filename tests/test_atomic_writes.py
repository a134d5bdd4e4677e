"""Every output file is written atomically and with the permissions a plain write would give."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from xsim_adapters._atomic import write_atomic, write_text_atomic


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        p = write_text_atomic(tmp_path / "a" / "out.txt", "hello\n")
    finally:
        os.umask(old)
    assert p.read_text() == "hello\n"
    assert _mode(p) == 0o644


def test_a_failing_writer_leaves_neither_target_nor_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_text("previous")

    def boom(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(target, boom)
    assert target.read_text() == "previous"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
