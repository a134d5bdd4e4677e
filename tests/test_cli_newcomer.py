"""What a newcomer meets first on the command line: ``--version``, one clear line for a path
that is neither a plan nor a trace directory, outputs under ``out/`` by default, one error
prefix, and README commands that write under ``out/``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from test_output_paths import tiny_plans

import xsim_adapters
from xsim_adapters import cli


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("xsim: error: "), err
    assert err.count("error") == 1, err  # one prefix, not "xsim: error: xsim sweep: error"
    return err


def test_version_prints_the_package_version() -> None:
    r = subprocess.run([sys.executable, "-m", "xsim_adapters.cli", "--version"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0
    assert r.stdout.strip() == f"xsim {xsim_adapters.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", xsim_adapters.__version__)


def _bad_inputs(d: Path) -> dict[str, Path]:
    (d / "somedir").mkdir()
    (d / "somedir" / "notes.txt").write_text("hello\n")
    (d / "Makefile").write_text("all:\n\techo hi\n")  # extension-less text
    (d / "blob.bin").write_bytes(bytes(range(256)))  # binary
    return {"directory": d / "somedir", "extension-less": d / "Makefile",
            "binary": d / "blob.bin"}


@pytest.mark.parametrize("kind", ["directory", "extension-less", "binary"])
@pytest.mark.parametrize("argv", [
    ["validate"], ["trace"], ["run"], ["compare", "--backends", "flow,asap"],
    ["export", "--format", "goal"], ["sweep", "--set", "training.micro_batch=1"],
])
def test_a_path_that_is_no_plan_nor_trace_is_one_clear_line(tmp_path: Path, capsys,
                                                             monkeypatch, kind, argv) -> None:
    monkeypatch.chdir(tmp_path)
    path = _bad_inputs(tmp_path)[kind]
    cmd, rest = argv[0], argv[1:]
    assert cli.main([cmd, str(path), *rest]) == 1
    err = _one_error(capsys)
    assert str(path) in err
    assert "not a plan file (.yaml or .yml)" in err
    if cmd in ("run", "compare", "export"):
        assert "or a trace directory (with manifest.json)" in err
    if kind == "directory":
        assert " is a directory, not" in err
    assert not (tmp_path / "out").exists()  # refused before any output


def test_a_missing_path_says_so(tmp_path: Path, capsys) -> None:
    assert cli.main(["run", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "o")]) == 1
    assert "plan file not found" in _one_error(capsys)


def test_sweep_errors_have_one_prefix(capsys) -> None:
    assert cli.main(["sweep"]) == 1
    assert _one_error(capsys) == "xsim: error: give a PLAN, a --sweep file, or both"


def test_outputs_default_under_out_named_after_the_input(tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    a, _ = tiny_plans(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["trace", str(a)]) == 0
    assert (tmp_path / "out" / "a-trace" / "manifest.json").is_file()
    assert cli.main(["run", str(a), "--no-plots"]) == 0
    assert (tmp_path / "out" / "a-run" / "summary.json").is_file()
    # a trace directory as input: named after the directory
    assert cli.main(["run", "out/a-trace", "--no-plots"]) == 0
    assert (tmp_path / "out" / "a-trace-run" / "ranks.csv").is_file()
    assert cli.main(["export", str(a), "--format", "goal"]) == 0
    assert (tmp_path / "out" / "a-export-goal.goal").read_text().startswith("num_ranks 4\n")
    assert cli.main(["export", str(a), "--format", "chakra"]) == 0
    assert (tmp_path / "out" / "a-export-chakra" / "et.0.et").is_file()
    assert cli.main(["sweep", str(a), "--set", "training.micro_batch=1,2"]) == 0
    assert (tmp_path / "out" / "a-sweep" / "sweep.csv").is_file()
    out = capsys.readouterr().out
    assert "wrote out/a-run/" in out and "wrote out/a-sweep/" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "a-export-chakra", "a-export-goal.goal", "a-run", "a-sweep", "a-trace", "a-trace-run"]
    # the same command again replaces its own earlier output (it is stamped as xsim's)
    assert cli.main(["run", str(a), "--no-plots"]) == 0


def _readme_commands() -> list[list[str]]:
    """Every ``xsim ...`` command of the README's code blocks (continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part.split("#", 1)[0])
                if words[:1] == ["xsim"]:
                    cmds.append(words)
    return cmds


def test_readme_commands_write_only_under_out() -> None:
    cmds = _readme_commands()
    writers = [c for c in cmds if c[1] in ("run", "trace", "compare", "sweep", "export")]
    assert len(writers) >= 6
    for c in writers:
        if "-o" in c:
            assert c[c.index("-o") + 1].startswith("out/"), c
        # otherwise the default is out/<plan name>-<command> (tested above)
    assert cli.build_parser().parse_args(writers[0][1:]).command == writers[0][1]


def _readme_shell_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [ln.split("#", 1)[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
            for ln in block.splitlines() if ln.split("#", 1)[0].strip()]


def test_ci_runs_exactly_the_readme_test_command_and_the_fast_markers_exist() -> None:
    import tomllib

    lines = _readme_shell_lines()
    # the README's first block: venv, install + run, then the test command
    assert lines[0].startswith("python3 -m venv .venv")
    assert lines[1].startswith("python -m pip install -e \".[test,ray,chakra]\"")
    assert "xsim run" in lines[1]
    assert lines[2] == "python -m pytest -q"
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    # CI installs what the README installs (the extras the Ray and Chakra tests need)
    readme_pkgs = lines[1].split("&&")[0].split("install", 1)[1].split()
    ci_install = [ln for ln in ci if "pip install" in ln]
    assert len(ci_install) == 1
    assert [w for w in ci_install[0].split("install", 1)[1].split() if not w.startswith("--")] \
        == readme_pkgs
    assert [ln for ln in ci if "pytest" in ln] == [lines[2]]
    fast = [ln for ln in lines if ln.startswith("python -m pytest -q -m ")]
    assert fast == ['python -m pytest -q -m "not slow and not ns3"']
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    names = {m.split(":")[0] for m in conf["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"slow", "ns3"} <= names
    assert conf["project"]["requires-python"] == ">=3.11"
    assert "Python >= 3.11" in (REPO / "README.md").read_text()
