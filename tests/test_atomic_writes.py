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


def test_the_temporary_is_a_fresh_stamped_directory_and_disk_full_keeps_the_old_file(
        tmp_path: Path) -> None:
    import errno
    import json

    target = tmp_path / "out.csv"
    target.write_text("previous")
    # a user's files named like the temporaries of older versions are never touched
    lookalike = tmp_path / f".xsim-tmp-out.csv-{os.getpid()}-abcdefgh.tmp"
    lookalike.write_text("user")
    seen: list[Path] = []

    def full(tmp: str) -> None:
        seen.append(Path(tmp))
        stamp = json.loads((Path(tmp).parent / ".xsim-output").read_text())
        assert stamp["tool"] == "xsim-adapters" and stamp["kind"] == "tmp"
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(target, full)
    assert seen[0].name == "out.csv" and seen[0].parent.parent == tmp_path
    assert seen[0].parent.name.startswith(f".xsim-tmp-out.csv-{os.getpid()}-")
    assert target.read_text() == "previous" and lookalike.read_text() == "user"
    assert sorted(p.name for p in tmp_path.iterdir()) == [lookalike.name, "out.csv"]
