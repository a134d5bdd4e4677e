"""Sweeps keep what finished: a crashing variant is one failed row, a dead worker process is
one failed row, and every row is on disk (OUT/sweep.rows.jsonl) as soon as it finishes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_output_paths import tiny_plans

from xsim_adapters import api
from xsim_adapters.sweep import LocalExecutor, RowLog, read_rows, run_spec, spec_for


def _die_on_two(t: int) -> dict:
    if t == 2:
        os._exit(3)  # as an out-of-memory kill or a segfault in native code would
    return {"t": t, "error": ""}


def test_a_dead_worker_is_one_failed_row_and_the_others_finish():
    seen: list[tuple[int, dict]] = []
    rows = LocalExecutor(2).map(_die_on_two, [2, 1], on_result=lambda i, r: seen.append((i, r)))
    assert rows[1] == {"t": 1, "error": ""}
    assert rows[0]["error"].startswith("crash: the worker process running this variant died")
    assert sorted(i for i, _ in seen) == [0, 1]  # each reported once, as it finished


def test_a_crashing_variant_is_a_failed_row_and_rows_are_written_as_they_finish(
        tmp_path, monkeypatch):
    a, _ = tiny_plans(tmp_path)
    real_run = api.run
    log_path = tmp_path / "rows.jsonl"
    lines_at_call: list[int] = []

    def flaky(trace, backend, topology, options):
        lines_at_call.append(len(log_path.read_text().splitlines()))
        if trace.manifest["plan_name"] == "tiny-a" and trace.num_ops > 900:  # global_batch 8
            raise ZeroDivisionError("division by zero in a backend")
        return real_run(trace, backend, topology, options)

    monkeypatch.setattr(api, "run", flaky)
    spec = spec_for(a, {"training.global_batch": [2, 8, 4]})
    with RowLog(log_path) as log:
        _, frame = run_spec(spec, LocalExecutor(1), rows_log=log)
    errors = list(frame["error"])
    assert errors[0] == "" and errors[2] == ""
    assert errors[1].startswith("crash: ZeroDivisionError: division by zero in a backend (at ")
    assert lines_at_call == [0, 1, 2]  # each row was on disk before the next variant started
    recs = [json.loads(ln) for ln in log_path.read_text().splitlines()]
    assert [r["variant"] for r in recs] == [0, 1, 2]
    assert len(read_rows(log_path)) == 2  # only successful rows count as finished
    # A line cut short by a kill is ignored, the others are kept.
    with open(log_path, "a") as fh:
        fh.write('{"digest": "abc", "row": {"err')
    assert len(read_rows(log_path)) == 2
    # Resuming from the log runs nothing that finished.
    calls_before = len(lines_at_call)
    _, again = run_spec(spec, LocalExecutor(1), done=read_rows(log_path))
    assert len(lines_at_call) == calls_before + 1  # only the crashed variant ran again
    kept = frame["iteration_time_ns"].iloc[[0, 2]]
    assert list(again["iteration_time_ns"].iloc[[0, 2]]) == list(kept)


def test_rows_file_of_an_absent_path_is_empty(tmp_path: Path):
    assert read_rows(tmp_path / "none.jsonl") == {}


def test_a_second_writer_is_refused_while_a_sweep_holds_its_directory(tmp_path, capsys):
    import subprocess

    from xsim_adapters import _outdir, cli
    from xsim_adapters.errors import OutputError

    a, _ = tiny_plans(tmp_path)
    out = tmp_path / "sw"
    out.mkdir()
    _outdir.write_stamp(out, "sweep", [])
    other = subprocess.Popen(["sleep", "30"])  # a live process standing in for another sweep
    try:
        (out / ".xsim-lock").write_text(f"{other.pid}\n")
        for argv in (["sweep", str(a), "--set", "training.micro_batch=1", "-o", str(out)],
                     ["run", str(a), "-o", str(out), "--force"]):
            assert cli.main(argv) == 1
            err = capsys.readouterr().err
            assert f"another xsim process (pid {other.pid}) is writing this output" in err
        with pytest.raises(OutputError, match=f"pid {other.pid}"), _outdir.writer_lock(out):
            pass
    finally:
        other.kill()
        other.wait()
    # The holder is gone (as after a SIGKILL): the lock is taken over, then released.
    with _outdir.writer_lock(out):
        assert (out / ".xsim-lock").read_text().strip() == str(os.getpid())
    assert sorted(p.name for p in out.iterdir()) == [".xsim-output"]
