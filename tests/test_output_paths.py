"""Output paths never destroy user data (docs/outputs.md): what `-o` may replace, what it
refuses with one line, and the temporary siblings a killed run leaves behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from xsim_adapters import _outdir, api, cli
from xsim_adapters.errors import OutputError

TINY = """\
name: {name}
model: {{preset: llama2-7b, layers: 4, seq_len: 256}}
training: {{global_batch: {batch}, micro_batch: 1, schedule: 1f1b}}
device_groups:
  h100: {{type: H100-80GB, nodes: 1, gpus_per_node: 4}}
network:
  scale_out: {{topology: leaf_spine, link_gbps: 400, latency_us: 1.0}}
replicas:
  uniform: {{group: h100, tp: 2, pp: 2, dp: 1}}
"""


def tiny_plans(d: Path) -> tuple[Path, Path]:
    """Two small plans with different names and op counts."""
    a, b = d / "a.yaml", d / "b.yaml"
    a.write_text(TINY.format(name="tiny-a", batch=4))
    b.write_text(TINY.format(name="tiny-b", batch=8))
    return a, b


@pytest.fixture
def plans(tmp_path: Path) -> tuple[Path, Path]:
    return tiny_plans(tmp_path)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("xsim: error: "), err
    assert "Traceback" not in err
    return err


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_trace_into_a_foreign_directory_is_refused_and_its_files_kept(plans, tmp_path, capsys):
    proj = tmp_path / "myproject"
    (proj / "src").mkdir(parents=True)
    (proj / "thesis.tex").write_text("\\chapter{One}\n")
    (proj / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    before = _tree(proj)
    assert cli.main(["trace", str(plans[0]), "-o", str(proj)]) == 1
    err = _error(capsys)
    assert "not an xsim output" in err and "src/main.c" in err and "thesis.tex" in err
    assert _tree(proj) == before
    assert cli.main(["trace", str(plans[0]), "-o", str(proj), "--force"]) == 1  # never
    assert _tree(proj) == before
    with pytest.raises(OutputError, match="not an xsim output"):
        api.write_trace(api.generate(api.load_plan(plans[0])), proj)
    assert _tree(proj) == before
    assert not list(tmp_path.glob(".xsim-tmp-*"))


@pytest.mark.parametrize("command", [
    ["trace", "{a}", "-o", "{out}"],
    ["run", "{a}", "--no-plots", "-o", "{out}"],
    ["compare", "{a}", "--backends", "flow,ns3", "-o", "{out}"],
    ["sweep", "{a}", "--set", "training.micro_batch=1", "-o", "{out}"],
    ["export", "{a}", "--format", "chakra", "-o", "{out}"],
    ["export", "{a}", "--format", "goal", "-o", "{out}"],
])
def test_an_existing_user_file_is_never_replaced(plans, tmp_path, capsys, command):
    out = tmp_path / "notes.txt"
    out.write_text("my notes\n")
    argv = [c.format(a=plans[0], out=out) for c in command]
    assert cli.main(argv) == 1
    err = _error(capsys)
    assert str(out) in err and ("is a file" in err or "not an xsim GOAL" in err)
    assert out.read_text() == "my notes\n"


def test_a_previous_trace_is_replaced_and_another_kind_needs_force(plans, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["trace", str(plans[0]), "-o", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-a"
    stamp = json.loads((out / ".xsim-output").read_text())
    assert stamp["kind"] == "trace" and "groups/h100.parquet" in stamp["files"]
    assert cli.main(["trace", str(plans[1]), "-o", str(out)]) == 0  # own output: replaced
    assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-b"
    capsys.readouterr()
    assert cli.main(["run", str(plans[0]), "--no-plots", "-o", str(out)]) == 1
    assert "holds an earlier xsim trace output" in _error(capsys)
    assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-b"
    assert cli.main(["run", str(plans[0]), "--no-plots", "-o", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".xsim-output", "ranks.csv", "summary.json", "timeline.parquet", "trace"]
    assert json.loads((out / "summary.json").read_text())["plan"] == "tiny-a"
    assert not list(tmp_path.glob(".xsim-tmp-*"))


def test_run_keeps_a_user_file_inside_its_own_output(plans, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["run", str(plans[0]), "--no-plots", "-o", str(out)]) == 0
    notes = out / "trace" / "notes.txt"
    notes.write_text("why this run\n")
    before = _tree(out)
    for extra in ([], ["--force"]):
        capsys.readouterr()
        assert cli.main(["run", str(plans[1]), "--no-plots", "-o", str(out), *extra]) == 1
        err = _error(capsys)
        assert "trace/notes.txt" in err and "did not write" in err
        assert _tree(out) == before
    notes.unlink()
    assert cli.main(["run", str(plans[1]), "--no-plots", "-o", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["plan"] == "tiny-b"


def test_an_unstamped_directory_is_never_taken_for_an_xsim_output(plans, tmp_path, capsys):
    """A run whose stamp is gone (as an xsim older than the stamp wrote it) holds only the
    file names a run writes, as a user's directory with its own summary.json may: both are
    refused, whole, with one line that says how to go on (docs/outputs.md)."""
    out = tmp_path / "out"
    assert cli.main(["run", str(plans[0]), "-o", str(out)]) == 0
    (out / ".xsim-output").unlink()
    assert _outdir.inspect_output(out)[0] == "foreign"
    before = _tree(out)
    capsys.readouterr()
    for extra in ([], ["--force"]):
        assert cli.main(["run", str(plans[1]), "--no-plots", "-o", str(out), *extra]) == 1
        err = _error(capsys)
        assert "not an xsim output (no .xsim-output stamp" in err and "empty it" in err
        assert _tree(out) == before


def test_an_empty_directory_is_used_and_goal_replaces_only_goal(plans, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["export", str(plans[0]), "--format", "chakra", "-o", str(empty)]) == 0
    assert (empty / "et.0.et").is_file()
    goal = tmp_path / "s.goal"
    assert cli.main(["export", str(plans[0]), "--format", "goal", "-o", str(goal)]) == 0
    first = goal.read_text()
    assert first.startswith("num_ranks 4\n")
    assert cli.main(["export", str(plans[1]), "--format", "goal", "-o", str(goal)]) == 0
    assert goal.read_text() != first and goal.read_text().startswith("num_ranks 4\n")
    assert cli.main(["export", str(plans[0]), "--format", "goal", "-o", str(empty)]) == 1
    assert "is a directory" in _error(capsys)


def test_stale_siblings_of_dead_runs_are_removed_and_nothing_else(plans, tmp_path):
    dead, live = _dead_pid(), _outdir.os.getpid()
    stale = tmp_path / f".xsim-tmp-out-{dead}-abcdefgh"
    stale.mkdir()
    _outdir.write_stamp(stale, "run", [])
    (stale / "summary.json").write_text("{}")
    unstamped = tmp_path / f".xsim-tmp-out-{dead}-zzzzzzzz"
    unstamped.mkdir()
    (unstamped / "mine.txt").write_text("user data under a confusing name")
    stale_file = tmp_path / f".xsim-tmp-x.csv-{dead}-q1w2e3r4.tmp"  # a user's file (or an
    stale_file.write_text("half")  # older xsim's temporary): a file is never taken by its name
    stale_sub = tmp_path / f".xsim-tmp-x.csv-{dead}-q1w2e3r5"  # what write_atomic leaves now
    stale_sub.mkdir()
    _outdir.write_stamp(stale_sub, "tmp", [])
    (stale_sub / "x.csv").write_text("half")
    alive = tmp_path / f".xsim-tmp-out-{live}-abcdefgh"
    alive.mkdir()
    _outdir.write_stamp(alive, "run", [])
    assert cli.main(["trace", str(plans[0]), "-o", str(tmp_path / "out")]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".xsim-tmp-"))
    assert left == sorted([unstamped.name, alive.name, stale_file.name])
    assert stale_file.read_text() == "half"


def test_swap_without_renameat2_leaves_the_new_output_whole(plans, tmp_path, monkeypatch):
    out = tmp_path / "t"
    trace = api.generate(api.load_plan(plans[0]))
    api.write_trace(trace, out)
    monkeypatch.setattr(_outdir, "_exchange", lambda a, b: False)
    api.write_trace(api.generate(api.load_plan(plans[1])), out)
    assert json.loads((out / "manifest.json").read_text())["plan_name"] == "tiny-b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml", "t"]


def test_a_failure_while_writing_leaves_the_old_output_and_no_temporary(plans, tmp_path,
                                                                       monkeypatch):
    out = tmp_path / "t"
    api.write_trace(api.generate(api.load_plan(plans[0])), out)
    before = _tree(out)

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(api, "write_trace_files", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        api.write_trace(api.generate(api.load_plan(plans[1])), out)
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml", "t"]
