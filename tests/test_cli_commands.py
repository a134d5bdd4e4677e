"""The ``xsim`` command line: help, validate, backends, option parsing and error handling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from xsim_adapters import cli

HETERO = REPO / "workloads" / "hetero-dp-h100-a100.yaml"
SUBCOMMANDS = ("validate", "trace", "run", "compare", "sweep", "export", "calibrate", "backends",
               "bench-collective", "search", "schema", "import")


def test_no_arguments_prints_help_and_exits_2(capsys) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: xsim")
    for name in SUBCOMMANDS:
        assert name in err


def test_the_help_tests_cover_every_subcommand() -> None:
    choices = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_full_sentence_help(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as ei:
        cli.main([name, "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: xsim {name}")
    sub = cli.build_parser()._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
    assert sub.description and sub.description[0].isupper() and sub.description.endswith(".")
    for action in sub._actions:
        if action.help and action.dest != "help":
            assert action.help[0].isupper() and action.help.endswith("."), action.help


def test_console_script_runs_help() -> None:
    r = subprocess.run([sys.executable, "-m", "xsim_adapters.cli", "backends", "--help"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "availability" in r.stdout


def test_backends_lists_flow_as_available(capsys) -> None:
    assert cli.main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    flow = [ln for ln in lines if ln.split()[0] == "flow"]
    assert flow and flow[0].split()[1] == "available"


def test_validate_prints_replicas_and_memory(capsys) -> None:
    assert cli.main(["validate", str(HETERO)]) == 0
    out = capsys.readouterr().out
    assert "plan 'llama2-7b-h100-a100': valid" in out
    assert "16 ranks on 2 servers" in out
    assert "replica 0: pp 1, tp [8]" in out
    assert "replica 1: pp 2, tp [4,4]" in out
    assert "layers [0,18) [18,32)" in out
    assert "memory per device (GB)" in out
    out_caps = out.count(" / 85.52 (") + out.count(" / 42.95 (")  # the driver-reported GB
    assert out_caps == 3  # one line per stage
    assert "replica 1 stage 1 A100-40GB tp 4: " in out


def test_invalid_plan_is_one_line_error_exit_1(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HETERO.read_text().replace("tp: 4, layers: [0, 18]", "tp: 3, layers: [0, 18]"))
    assert cli.main(["validate", str(bad)]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("xsim: error: ")
    assert "replicas[1].stages[0]" in lines[0]
    assert "Traceback" not in cap.err


def test_missing_plan_file_is_an_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    assert cli.main(["validate", str(tmp_path / "nope.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("xsim: error: ") and "nope.yaml" in err and "Traceback" not in err


def test_unknown_backend_is_one_line_error(tmp_path: Path, capsys) -> None:
    rc = cli.main(["run", str(HETERO), "--backend", "ns4", "-o", str(tmp_path / "o"),
                   "--no-plots"])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("xsim: error: unknown backend 'ns4'; known backends: ")
    assert "flow" in err[0]


def test_broken_trace_directory_is_one_line_error(tmp_path: Path, capsys) -> None:
    d = tmp_path / "trace"
    d.mkdir()
    (d / "manifest.json").write_text("{ not json")
    assert cli.main(["run", str(d), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 3 and err[0].startswith("xsim: error: ")


def test_unknown_option_is_one_line_error_with_suggestion(tmp_path: Path, capsys) -> None:
    rc = cli.main(["run", str(HETERO), "--option", "trasnport=udp", "-o", str(tmp_path / "o"),
                   "--no-plots"])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xsim: error: unknown option 'trasnport' for backend flow; allowed:"
                   " engine, progress, seed"]
    assert not (tmp_path / "o").exists()  # refused before any work


def test_bad_option_value_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    rc = cli.main(["run", str(HETERO), "--option", "seed=-1", "-o", str(tmp_path / "o")])
    assert rc == 1
    assert capsys.readouterr().err.strip() == (
        "xsim: error: flow: option seed: expected an integer >= 0 and <= 2147483647 (got -1)")
    assert not (tmp_path / "o").exists()


def test_backends_options_lists_each_backends_options(capsys) -> None:
    assert cli.main(["backends", "--options"]) == 0
    out = capsys.readouterr().out
    assert "    --option seed (int >= 0 and <= 2147483647, default 1): " in out
    assert "    --option progress (callable, default None): " in out


def test_compare_needs_two_backends(tmp_path: Path, capsys) -> None:
    assert cli.main(["compare", str(HETERO), "--backends", "flow,flow", "-o",
                     str(tmp_path)]) == 1
    assert "at least two different names" in capsys.readouterr().err


def test_validate_groups_identical_replicas(capsys) -> None:
    assert cli.main(["validate", str(REPO / "workloads" / "llama2-70b-1024gpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "1024 ranks on 128 servers" in out
    assert "    replicas 0-15: pp 4, tp [8,8,8,8], " in out
    assert "    replicas 16-23: pp 8, " in out
    assert len(out.splitlines()) < 30  # a short summary, not one line per replica and stage


def test_span_and_runs_helpers() -> None:
    from xsim_adapters.cli.fmt import runs, span

    assert span("replica", [3]) == "replica 3"
    assert span("replica", [0, 1, 2]) == "replicas 0-2"
    assert span("replica", [0, 2]) == "replicas 0,2"
    assert runs(["a", "a", "b", "a"]) == [([0, 1], "a"), ([2], "b"), ([3], "a")]


def test_export_goal_and_chakra(tmp_path: Path, capsys) -> None:
    plan = REPO / "workloads" / "uneven-layers.yaml"
    goal = tmp_path / "t.goal"
    assert cli.main(["export", str(plan), "--format", "goal", "-o", str(goal)]) == 0
    text = goal.read_text()
    assert text.startswith("num_ranks 12\n")
    assert [ln for ln in text.splitlines() if ln.startswith("rank ")] == [
        f"rank {r} {{" for r in range(12)]
    assert cli.main(["export", str(plan), "--format", "chakra", "-o", str(tmp_path / "et")]) == 0
    assert sorted(p.name for p in (tmp_path / "et").iterdir()) == sorted(  # the stamp:
        [".xsim-output"] + [f"et.{r}.et" for r in range(12)] + ["comm_groups.json"])  # outputs.md
    assert "wrote 12 Chakra ET" in capsys.readouterr().out
