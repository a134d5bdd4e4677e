"""Hostile output paths (docs/outputs.md, issue 32 part 0): every command that writes replaces
a path only when it is absent, empty or stamped as xsim's own; a directory is never taken for
an xsim output by its file names; temporaries never take a user's file; a replacement survives
disk full and signals whole; stamps and locks are read bounded, regular files only.

Commands run in a forked, memory- and time-limited child (:mod:`attack_runner`) where a hang
or a crash is possible, so that a hang fails the case instead of the suite.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attack_runner import assert_clean_error, run_cli

from xsim_adapters.cli import main

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from test_output_paths import tiny_plans  # noqa: E402

SEARCH_SPEC = REPO / "tests" / "data" / "search" / "small-4gpu.yaml"
BENCH = ["bench-collective", "--servers", "1", "--gpus-per-server", "2", "-b", "1K", "-e", "2K"]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.is_symlink()}


def _temps(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".xsim-tmp-*"))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def plans(tmp_path: Path) -> tuple[Path, Path]:
    return tiny_plans(tmp_path)


# ---------------------------------------------------------------- user files are never replaced


def test_schema_replaces_only_an_absent_empty_or_own_schema_file(tmp_path):
    user = tmp_path / "notes.json"
    user.write_text('{"mine": true}\n')
    assert_clean_error(run_cli(["schema", "-o", str(user)]), "not an xsim plan JSON Schema")
    assert user.read_text() == '{"mine": true}\n'
    empty = tmp_path / "empty.json"
    empty.touch()
    assert main(["schema", "-o", str(empty)]) == 0
    own = empty.read_text()
    assert json.loads(own)["title"] == "xsim-adapters plan"
    empty.write_text(own.replace('"type": "object"', '"type": "object" ', 1))  # an older one
    assert main(["schema", "-o", str(empty)]) == 0 and empty.read_text() == own
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert_clean_error(run_cli(["schema", "-o", str(fifo)]), "not an xsim plan JSON Schema")
    assert_clean_error(run_cli(["schema", "-o", str(tmp_path)]), "is a directory")
    assert not _temps(tmp_path)


def test_bench_collective_follows_the_output_rule(tmp_path):
    user = tmp_path / "bench"
    user.mkdir()
    (user / "bench.csv").write_text("size,busbw\n1024,3.5\n")  # the user's own measurements
    assert_clean_error(run_cli([*BENCH, "-o", str(user)]), "not an xsim output")
    assert_clean_error(run_cli([*BENCH, "-o", str(user), "--force"]), "not an xsim output")
    assert (user / "bench.csv").read_text() == "size,busbw\n1024,3.5\n"
    out = tmp_path / "b"
    assert main([*BENCH, "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".xsim-output", "bench.csv", "bench.png"]
    assert json.loads((out / ".xsim-output").read_text())["kind"] == "bench"
    assert main([*BENCH, "-e", "4K", "-o", str(out)]) == 0  # its own output: replaced whole
    assert len((out / "bench.csv").read_text().splitlines()) == 1 + 3


def test_a_user_directory_with_xsim_file_names_is_not_taken_for_an_output(plans, tmp_path):
    run_like = tmp_path / "results"
    run_like.mkdir()
    (run_like / "summary.json").write_text('{"experiment": 7}\n')
    trace_like = tmp_path / "dataset"
    trace_like.mkdir()
    (trace_like / "manifest.json").write_text(json.dumps(
        {"schema_version": 3, "groups": [], "num_ops": 0}))
    (trace_like / "plan.yaml").write_text("my: plan\n")
    for cmd, d in (("run", run_like), ("trace", trace_like), ("compare", run_like)):
        before = _tree(d)
        for extra in ([], ["--force"]):
            assert_clean_error(run_cli([cmd, str(plans[0]), "-o", str(d), *extra]),
                               "not an xsim output (no .xsim-output stamp")
            assert _tree(d) == before
    assert not _temps(tmp_path)


def test_a_user_file_or_directory_named_like_a_temporary_is_never_deleted(plans, tmp_path):
    dead = _dead_pid()
    f = tmp_path / f".xsim-tmp-notes-{dead}-abcdefgh.tmp"
    f.write_text("user data")
    d = tmp_path / f".xsim-tmp-notes-{dead}-abcdefgh"
    d.mkdir()
    (d / ".xsim-output").write_text('{"tool": "someone-else", "kind": "x", "files": []}')
    (d / "data.csv").write_text("1,2\n")
    absurd = tmp_path / ".xsim-tmp-notes-99999999999999999999-abcdefgh"
    absurd.mkdir()
    assert main(["trace", str(plans[0]), "-o", str(tmp_path / "t")]) == 0
    assert f.read_text() == "user data" and (d / "data.csv").read_text() == "1,2\n"
    assert absurd.is_dir()


# ---------------------------------------------------------------- locks


def test_run_force_never_writes_into_a_directory_a_search_holds(plans, tmp_path, monkeypatch):
    """The search's directory is locked from the moment it exists (here: while it enumerates
    its space), so `run --force` from another process is refused naming the holder."""
    from xsim_adapters.search import bnb

    out = tmp_path / "s"
    seen = []
    real = bnb.enumerate_space

    def enumerate_and_race(*a, **k):
        seen.append(run_cli(["run", str(plans[0]), "--no-plots", "--force", "-o", str(out)]))
        return real(*a, **k)

    monkeypatch.setattr(bnb, "enumerate_space", enumerate_and_race)
    assert main(["search", str(SEARCH_SPEC), "-o", str(out), "--max-evaluations", "2",
                 "--top", "1", "--no-baselines"]) == 0
    assert_clean_error(seen[0], f"another xsim process (pid {os.getpid()}) is writing")
    assert json.loads((out / ".xsim-output").read_text())["kind"] == "search"
    assert not (out / ".xsim-lock").exists() and not _temps(tmp_path)


def test_the_swap_is_refused_when_a_sweep_locks_the_directory_meanwhile(plans, tmp_path,
                                                                        monkeypatch):
    from xsim_adapters import api

    out = tmp_path / "sw"
    assert main(["sweep", str(plans[0]), "--set", "training.micro_batch=1", "-o", str(out)]) == 0
    before = _tree(out)
    holder = subprocess.Popen(["sleep", "60"])  # stands in for a sweep that starts meanwhile
    real = api.metrics

    def lock_then_metrics(*a, **k):
        (out / ".xsim-lock").write_text(f"{holder.pid}\n")
        return real(*a, **k)

    monkeypatch.setattr(api, "metrics", lock_then_metrics)
    try:
        assert_clean_error(run_cli(["run", str(plans[1]), "--no-plots", "--force", "-o",
                                    str(out)]), f"another xsim process (pid {holder.pid})")
    finally:
        holder.kill()
        holder.wait()
    assert {k: v for k, v in _tree(out).items() if k != ".xsim-lock"} == before
    assert not _temps(tmp_path)


@pytest.mark.parametrize("content", ["-5\n", "0\n", "99999999999999999999\n", "4194305\n",
                                     "abc\n", "\xff\xfe\n", "1" * 100])
def test_an_absurd_lock_names_no_holder(plans, tmp_path, content):
    out = tmp_path / "t"
    assert main(["trace", str(plans[0]), "-o", str(out)]) == 0
    (out / ".xsim-lock").write_bytes(content.encode("utf-8", "surrogateescape"))
    res = run_cli(["trace", str(plans[1]), "-o", str(out)])
    assert res.code == 0, res.stderr
    assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-b"


@pytest.mark.parametrize("what", ["fifo", "devzero", "huge", "dir"])
@pytest.mark.parametrize("which", [".xsim-lock", ".xsim-output"])
def test_special_stamp_and_lock_files_never_hang_or_crash(plans, tmp_path, what, which):
    out = tmp_path / "t"
    assert main(["trace", str(plans[0]), "-o", str(out)]) == 0
    p = out / which
    p.unlink(missing_ok=True)
    if what == "fifo":
        os.mkfifo(p)
    elif what == "devzero":
        p.symlink_to("/dev/zero")
    elif what == "huge":
        with open(p, "wb") as fh:
            fh.truncate(8 << 30)  # sparse: 8 GiB of zeros
    else:
        p.mkdir()
    res = run_cli(["trace", str(plans[1]), "-o", str(out)], timeout=60)
    if which == ".xsim-lock" and what == "dir":
        assert_clean_error(res, ".xsim-lock is not a lock file xsim can take over")
    elif which == ".xsim-lock":  # no live holder: the output is ours and replaced
        assert res.code == 0, res.stderr
        assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-b"
    else:  # not ours any more: refused, saying why
        why = {"fifo": "is not a regular file", "devzero": "is a symbolic link",
               "huge": "is larger than", "dir": "is not a regular file"}[what]
        assert_clean_error(res, f"its .xsim-output {why}")
    assert res.seconds < 20


# ---------------------------------------------------------------- disk full and signals


def _old_and_new(cmd: list[str], out: Path, monkeypatch, patch: tuple[object, str],
                 new: list[str]) -> None:
    """``cmd`` into ``out`` once; then ``cmd + new`` (a different result) with ``patch``
    (module, name) raising ENOSPC: one line, exit 1, the first output whole, no temporary."""
    assert main([*cmd, "-o", str(out)]) == 0
    before = _tree(out)
    monkeypatch.setattr(*patch, _enospc)
    res = run_cli([*cmd, *new, "-o", str(out)], timeout=120)
    assert_clean_error(res, "No space left on device", max_seconds=100)
    assert _tree(out) == before
    assert not _temps(out.parent)


def test_disk_full_while_replacing_a_run_keeps_the_old_run(plans, tmp_path, monkeypatch):
    from xsim_adapters.report import outputs

    _old_and_new(["run", str(plans[0]), "--no-plots"], tmp_path / "r", monkeypatch,
                 (outputs, "write_csv"), ["--links"])


def test_disk_full_while_replacing_a_sweep_keeps_the_old_sweep(plans, tmp_path, monkeypatch):
    from xsim_adapters.sweep import results

    _old_and_new(["sweep", str(plans[0]), "--set", "training.global_batch=2,4"],
                 tmp_path / "sw", monkeypatch, (results, "write_sweep"), ["--set", "seed=3"])


def test_disk_full_while_replacing_a_search_keeps_the_old_search(tmp_path, monkeypatch):
    from xsim_adapters.search import outputs

    _old_and_new(["search", str(SEARCH_SPEC), "--max-evaluations", "2", "--top", "1",
                  "--no-baselines"], tmp_path / "s", monkeypatch, (outputs, "write_pareto"),
                 ["--max-evaluations", "3"])


def test_disk_full_while_replacing_a_bench_keeps_the_old_bench(tmp_path, monkeypatch):
    from xsim_adapters import bench_collective

    _old_and_new(BENCH, tmp_path / "b", monkeypatch, (bench_collective, "plot"),
                 ["-e", "4K"])


def test_disk_full_in_a_single_file_write_keeps_the_old_file(tmp_path, monkeypatch):
    goal = tmp_path / "s.goal"
    plan = tiny_plans(tmp_path)[0]
    assert main(["export", str(plan), "--format", "goal", "-o", str(goal)]) == 0
    before = goal.read_bytes()
    monkeypatch.setattr(os, "replace", _enospc)
    assert_clean_error(run_cli(["export", str(plan), "--format", "goal", "-o", str(goal)]),
                       "No space left on device")
    assert goal.read_bytes() == before and not _temps(tmp_path)


def test_a_crashed_search_never_blocks_the_next_one(tmp_path, monkeypatch):
    """Killed (os._exit, as SIGKILL: no cleanup runs) while writing pareto.png, after
    candidates and top/: its temporary stays inside OUT. The next search into that OUT runs,
    and resumes."""
    from xsim_adapters._atomic import write_atomic
    from xsim_adapters.search import outputs

    out = tmp_path / "s"
    argv = ["search", str(SEARCH_SPEC), "-o", str(out), "--max-evaluations", "2", "--top",
            "1", "--no-baselines"]
    monkeypatch.setattr(outputs, "write_pareto",
                        lambda path, *a: write_atomic(path, lambda tmp: os._exit(9)))
    assert run_cli(argv, timeout=120).code == 9
    assert (out / "candidates.csv").is_file() and not (out / "summary.json").exists()
    assert [p.name.split("-")[2] for p in out.glob(".xsim-tmp-*")] == ["pareto.png"]
    monkeypatch.undo()
    assert main(argv) == 0
    assert not list(out.glob(".xsim-tmp-*"))  # the dead run's temporary went with the old
    assert main([*argv, "--resume"]) == 0
    assert {"summary.json", "pareto.png", "best.yaml"} <= {p.name for p in out.iterdir()}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "plugins" / "ns3"), str(REPO / "plugins" / "htsim")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _job_plans(d: Path) -> list[Path]:
    import yaml

    paths = []
    for name in ("ja", "jb"):
        p = d / f"{name}.yaml"
        p.write_text(yaml.safe_dump({
            "name": name, "model": {"preset": "llama2-7b", "seq_len": 512, "layers": 2},
            "training": {"global_batch": 2, "micro_batch": 1},
            "device_groups": {"h": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 1}},
            "replicas": [{"stages": [{"group": "h", "devices": [i, i + 1], "tp": 1,
                                      "layers": [0, 2]}]} for i in (0, 1)]}))
        paths.append(p)
    return paths


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("mode", ["job", "baseline"])
def test_a_signal_while_writing_leaves_the_old_output_and_one_line(tmp_path, sig, mode):
    """SIGTERM / Ctrl-C once the new output is being written beside the old one."""
    if mode == "job":
        a, b = _job_plans(tmp_path)
        cmd = ["run", str(a), "--job", str(b)]
    else:
        a = tmp_path / "p.yaml"
        a.write_text(tiny_plans(tmp_path)[0].read_text()
                     + "perturb: {slow: [{rank: 0, factor: 2.0}]}\n")
        cmd = ["run", str(a), "--baseline"]
    out = tmp_path / "out"
    assert main([*cmd, "-o", str(out)]) == 0
    before = _tree(out)
    log = tmp_path / "log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xsim_adapters.cli", *cmd, "-o", str(out)], env=_env(),
            stdout=subprocess.DEVNULL, stderr=fh,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while proc.poll() is None and not _temps(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    err = log.read_text()
    if rc == 0:  # it finished first: the new output is whole
        pytest.skip("the run finished before the signal")
    word = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert (rc, err.strip()) == (143 if sig == signal.SIGTERM else 130, f"xsim: {word}")
    assert _tree(out) == before
    assert not _temps(tmp_path)


# ---------------------------------------------------------------- paths that are not UTF-8


@pytest.mark.parametrize("cmd", [["schema"], ["trace", "{a}"], ["run", "{a}", "--no-plots"],
                                 ["sweep", "{a}", "--set", "training.micro_batch=1"],
                                 ["search", str(SEARCH_SPEC)], BENCH,
                                 ["export", "{a}", "--format", "goal"]])
def test_an_output_path_that_is_not_utf8_is_one_line(plans, tmp_path, cmd):
    name = os.fsdecode(b"out-\xff\xfe")
    argv = [c.format(a=plans[0]) for c in cmd] + ["-o", str(tmp_path / name)]
    assert_clean_error(run_cli(argv, timeout=60), "out-\\xff\\xfe: the path is not valid UTF-8")
    assert sorted(os.listdir(tmp_path)) == ["a.yaml", "b.yaml"]
