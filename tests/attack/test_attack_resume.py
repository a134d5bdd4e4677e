"""Hostile ``--resume`` rows files (search and sweep) and search budgets.

A rows file is input: a record that is not what a run writes is dropped and its work done
again (one warning line says how many and why), never trusted; a file that cannot be read
safely (a FIFO, a link to /dev/zero, a directory, over the size cap) is one error line in
bounded time. Budgets are validated (one line naming the option) and bound the whole command,
enumeration included. Every CLI case runs in a forked, memory-limited child (attack_runner).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from attack_runner import assert_clean_error, run_cli
from test_output_paths import tiny_plans  # (tests/ is on pytest's pythonpath)

from xsim_adapters.search import spec_from_dict
from xsim_adapters.search.space import choices, structures
from xsim_adapters.sweep.rowsfile import (
    MAX_ROW_LINE_BYTES,
    MAX_ROWS_FILE_BYTES,
    check_record,
    read_rows,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "data" / "search" / "small-4gpu.yaml"
SEARCH_ROWS = "search.rows.jsonl"
SWEEP_ROWS = "sweep.rows.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write_lines(path: Path, recs: list[Any]) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def _warnings(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("xsim: warning:")]


# ---------------------------------------------------------------- search: one tampered row

@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Path:
    """A finished search of the small spec (3 simulations per pass) to tamper with."""
    out = tmp_path_factory.mktemp("search") / "s"
    r = run_cli(["search", str(SMALL), "-o", str(out), "--max-evaluations", "3", "--top", "2"],
                timeout=180)
    assert r.code == 0, r.stderr[-3000:]
    return out


def _victim(out: Path) -> int:
    """The line index of a main-pass row that is not the best plan's: trusted with a better
    time, it would become the best."""
    best = json.loads((out / "summary.json").read_text())["search"]["best"]
    recs = _lines(out / SEARCH_ROWS)
    return next(i for i, r in enumerate(recs) if r["overrides"]["candidate"] != best)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(rec: dict[str, Any]) -> Any:
        rec["row"][key] = value
        return rec
    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(rec: dict[str, Any]) -> Any:
        del rec["row"][key]
        return rec
    return mutate


def _whole(value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda rec: value


# (id, mutation of the victim record, text the warning must hold)
ROW_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("negative-time", _set("iteration_time_ns", -5),
     "row.iteration_time_ns: expected a finite number > 0 (got -5)"),
    ("nan-time", _set("iteration_time_ns", math.nan),
     "row.iteration_time_ns: expected a finite number > 0 (got nan)"),
    ("inf-time", _set("iteration_time_ns", math.inf), "(got inf)"),
    ("zero-time", _set("iteration_time_ns", 0), "(got 0)"),
    ("text-time", _set("iteration_time_ns", "fast"), "(got 'fast')"),
    ("list-time", _set("iteration_time_ns", [1, 2]), "(got [1, 2])"),
    ("bool-time", _set("iteration_time_ns", True), "(got True)"),
    ("huge-int-time", _set("iteration_time_ns", 10**400), "row.iteration_time_ns"),
    ("missing-time", _drop("iteration_time_ns"), "row.iteration_time_ns: required key is missing"),
    ("missing-mfu", _drop("mfu"), "row.mfu: required key is missing"),
    ("negative-ranks", _set("ranks", -1), "row.ranks: expected a non-negative integer (got -1)"),
    ("fractional-ops", _set("num_ops", 2.5), "row.num_ops: expected a non-negative integer"),
    ("text-mfu", _set("mfu", "high"), "row.mfu: expected a finite number >= 0 (got 'high')"),
    ("negative-tokens", _set("tokens_per_s", -1.0), "row.tokens_per_s"),
    ("dict-plan", _set("plan", {"a": 1}), "row.plan: expected a name"),
    ("error-not-text", _set("error", 0), "row.error: expected a string (got 0)"),
    ("row-a-list", lambda rec: {**rec, "row": [1, 2]}, "row: expected a mapping (got [1, 2])"),
    ("bad-digest", lambda rec: {**rec, "digest": "abc"}, "digest: expected 64 hex digits"),
    ("record-a-list", _whole([1, 2]), "expected a JSON object (got [1, 2])"),
    ("not-json", _whole("{not json"), "not a JSON record"),
    ("deep-nesting", _whole("[" * 100_000 + "]" * 100_000), "not a JSON record"),
    ("huge-line", _whole(json.dumps({"pad": "x" * (MAX_ROW_LINE_BYTES + 10)})),
     f"longer than {MAX_ROW_LINE_BYTES:,} bytes"),
]


@pytest.mark.parametrize("mutate,named", [c[1:] for c in ROW_CASES], ids=[c[0] for c in ROW_CASES])
def test_a_bad_search_row_is_simulated_again_not_trusted(searched, tmp_path, mutate, named):
    out = tmp_path / "s"
    shutil.copytree(searched, out, symlinks=True)
    recs: list[Any] = _lines(out / SEARCH_ROWS)
    k = _victim(out)
    line_no = k + 1
    recs[k] = mutate(recs[k])
    _write_lines(out / SEARCH_ROWS, recs)
    before = json.loads((searched / "summary.json").read_text())
    r = run_cli(["search", str(SMALL), "-o", str(out), "--max-evaluations", "3", "--top", "2",
                 "--resume"], timeout=120)
    assert r.code == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    warns = _warnings(r.stderr)
    assert len(warns) == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert f"{SEARCH_ROWS}: 1 simulation row not valid, simulated again" in warns[0]
    assert f"(line {line_no}: " in warns[0] and named in warns[0], warns[0]
    assert len(warns[0]) < 1000
    after = json.loads((out / "summary.json").read_text())
    assert after["simulated_now"] == 1  # only the dropped row's candidate ran again
    assert after["search"] == before["search"]  # the same best plan and time as before
    assert after["search"]["best_iteration_time_ns"] > 0
    frame = pd.read_csv(out / "candidates.csv")
    ok = frame[frame["status"] == "evaluated"]["iteration_time_ns"]
    assert len(ok) and (ok > 0).all() and ok.map(math.isfinite).all()


def test_a_resumed_time_below_the_proven_bound_is_simulated_again(searched, tmp_path):
    """1 ns is a well-formed time, but no simulation of that candidate can give it (its lower
    bound is proven below every simulated time): trusted, it would be the best plan."""
    out = tmp_path / "s"
    shutil.copytree(searched, out, symlinks=True)
    recs = _lines(out / SEARCH_ROWS)
    k = _victim(out)
    key = recs[k]["overrides"]["candidate"]
    recs[k]["row"]["iteration_time_ns"] = 1
    _write_lines(out / SEARCH_ROWS, recs)
    before = json.loads((searched / "summary.json").read_text())
    r = run_cli(["search", str(SMALL), "-o", str(out), "--max-evaluations", "3", "--top", "2",
                 "--resume"], timeout=120)
    assert r.code == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warns = _warnings(r.stderr)
    assert len(warns) == 1, r.stderr[-3000:]
    assert (f"{SEARCH_ROWS}: 1 simulation row below the proven lower bound, simulated again "
            f"instead of trusted ({key}: 1 ns is below its lower bound ") in warns[0], warns[0]
    after = json.loads((out / "summary.json").read_text())
    assert after["simulated_now"] == 1 and after["search"] == before["search"]


def _rows_path_case(kind: str) -> Callable[[Path], None]:
    def build(rows: Path) -> None:
        rows.unlink()
        if kind == "fifo":
            os.mkfifo(rows)
        elif kind == "dev-zero":
            rows.symlink_to("/dev/zero")
        elif kind == "directory":
            rows.mkdir()
        elif kind == "oversized":  # sparse: no disk used, but over the cap
            with open(rows, "wb") as fh:
                fh.truncate(MAX_ROWS_FILE_BYTES + 1)
    return build


@pytest.mark.parametrize("kind,named", [
    ("fifo", "is a FIFO, not a regular file"),
    ("dev-zero", "is a device or socket, not a regular file"),
    ("directory", "is a directory, not a regular file"),
    ("oversized", f"is more than the {MAX_ROWS_FILE_BYTES:,} a rows file may hold"),
])
def test_a_search_rows_file_that_is_not_a_bounded_regular_file_is_one_error(
        searched, tmp_path, kind, named):
    out = tmp_path / "s"
    shutil.copytree(searched, out, symlinks=True)
    _rows_path_case(kind)(out / SEARCH_ROWS)
    r = run_cli(["search", str(SMALL), "-o", str(out), "--resume"], timeout=30)
    assert_clean_error(r, SEARCH_ROWS, max_seconds=20)
    assert named in r.stderr, r.stderr


# ---------------------------------------------------------------- sweep

@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, Path]:
    """A finished two-variant sweep of a tiny plan: (plan, OUT)."""
    d = tmp_path_factory.mktemp("sweep")
    plan, _ = tiny_plans(d)
    out = d / "sw"
    r = run_cli(["sweep", str(plan), "--set", "training.global_batch=2,8", "-o", str(out)],
                timeout=180)
    assert r.code == 0, r.stderr[-3000:]
    return plan, out


@pytest.mark.parametrize("value,named", [
    (-5, "(got -5)"), (math.nan, "(got nan)"), ("1e3", "(got '1e3')"),
])
def test_a_bad_sweep_row_is_run_again_and_never_the_answer(swept, tmp_path, value, named):
    plan, src = swept
    out = tmp_path / "sw"
    shutil.copytree(src, out, symlinks=True)
    before = pd.read_csv(src / "sweep.csv")
    slow = int(before["iteration_time_ns"].idxmax())  # trusted at -5 it would be the fastest
    recs = _lines(out / SWEEP_ROWS)
    k = next(i for i, r in enumerate(recs) if r["variant"] == slow)
    recs[k]["row"]["iteration_time_ns"] = value
    _write_lines(out / SWEEP_ROWS, recs)
    r = run_cli(["sweep", str(plan), "--set", "training.global_batch=2,8", "-o", str(out),
                 "--resume"], timeout=120)
    assert r.code == 0, r.stderr[-3000:]
    warns = _warnings(r.stderr)
    assert len(warns) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{SWEEP_ROWS}: 1 row not valid, simulated again" in warns[0]
    why = f"line {k + 1}: row.iteration_time_ns: expected a finite number > 0 {named}"
    assert why in warns[0], warns[0]
    after = pd.read_csv(out / "sweep.csv")
    assert list(after["iteration_time_ns"]) == list(before["iteration_time_ns"])


def test_a_sweep_rows_fifo_is_one_error_not_a_hang(swept, tmp_path):
    plan, src = swept
    out = tmp_path / "sw"
    shutil.copytree(src, out, symlinks=True)
    _rows_path_case("fifo")(out / SWEEP_ROWS)
    r = run_cli(["sweep", str(plan), "--set", "training.global_batch=2,8", "-o", str(out),
                 "--resume"], timeout=30)
    assert_clean_error(r, SWEEP_ROWS, max_seconds=20)


# ---------------------------------------------------------------- the reader itself

def _rec(**row: Any) -> dict[str, Any]:
    base = {"plan": "p", "ranks": 8, "num_ops": 100, "iteration_time_ns": 1000,
            "tokens_per_s": 5.0, "mfu": 0.4, "error": ""}
    return {"digest": "a" * 64, "variant": 0, "overrides": {}, "row": {**base, **row}}


def test_reader_keeps_valid_rows_skips_failed_ones_and_counts_the_rest(tmp_path):
    ok = _rec()
    failed = {**_rec(), "digest": "b" * 64, "row": {"error": "PlanError: x", "wall_s": 0.1}}
    bad = {**_rec(iteration_time_ns=-1), "digest": "c" * 64}
    nan_ok = {**_rec(bubble_fraction=math.nan, wall_s=math.nan), "digest": "d" * 64}
    path = tmp_path / "rows.jsonl"
    _write_lines(path, [ok, failed, bad, nan_ok])
    with open(path, "a") as fh:
        fh.write('{"digest": "e')  # a last line cut short by a kill: ignored without a word
    rows = read_rows(path)
    assert sorted(rows) == ["a" * 64, "d" * 64]
    assert rows.dropped == ["line 3: row.iteration_time_ns: expected a finite number > 0 "
                            "(got -1)"]
    assert rows.warning() == (f"{path}: 1 row not valid, simulated again instead of trusted "
                              "(line 3: row.iteration_time_ns: expected a finite number > 0 "
                              "(got -1))")


def test_reader_warning_names_three_reasons_and_counts_every_one(tmp_path):
    path = tmp_path / "rows.jsonl"
    _write_lines(path, [{**_rec(ranks=-i), "digest": f"{i:064x}"} for i in range(1, 6)])
    w = read_rows(path).warning()
    assert w is not None and w.startswith(f"{path}: 5 rows not valid")
    assert w.count("row.ranks") == 3 and w.endswith("; and 2 more)")


@pytest.mark.parametrize("key,value,ok", [
    ("slowdown_pct", -3.5, True), ("slowdown_pct", math.nan, False),
    ("job1", "traffic", True), ("job1", 3, False),
    ("job1_iteration_time_ns", 0, False), ("coarsened", "yes", False),
    ("mfu_H100-80GB", math.nan, True), ("mean_compute_ns", -1, False),
    ("phase_dp_ns", [1], False), ("wall_s", math.inf, False),
])
def test_every_row_key_is_checked_like_a_run_writes_it(key, value, ok):
    got = check_record(_rec(**{key: value}))
    assert isinstance(got, tuple) == ok, got


# ---------------------------------------------------------------- budgets

@pytest.mark.parametrize("option,value,expected", [
    ("--max-seconds", "nan", "expected a finite number of seconds > 0 (got 'nan')"),
    ("--max-seconds", "inf", "(got 'inf')"),
    ("--max-seconds", "0", "(got '0')"),
    ("--max-seconds", "-1", "(got '-1')"),
    ("--max-seconds", "soon", "(got 'soon')"),
    ("--max-evaluations", "0", "expected a positive integer (got '0')"),
    ("--max-evaluations", "-3", "(got '-3')"),
    ("--max-evaluations", "2.5", "(got '2.5')"),
    ("--top", "0", "expected a positive integer (got '0')"),
    ("--top", "-1", "(got '-1')"),
])
def test_bad_search_budgets_are_one_line_naming_the_option(tmp_path, option, value, expected):
    r = run_cli(["search", str(SMALL), "-o", str(tmp_path / "s"), f"{option}={value}"],
                timeout=30)
    assert_clean_error(r, f"{option}: {expected}" if "expected" in expected else option)
    assert expected in r.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was written


@pytest.mark.parametrize("value", [".nan", ".inf", "0", "-2"])
def test_bad_spec_budget_seconds_is_one_line_naming_the_key(tmp_path, value):
    text = SMALL.read_text().replace("budget: {wave: 2}", f"budget: {{wave: 2, seconds: {value}}}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert_clean_error(run_cli(["search", str(spec), "-o", str(tmp_path / "s")], timeout=30),
                       "budget.seconds: expected a positive number")


BIG_SPACE = 150_312  # 6,263 structures x 24 training choices


def _big_spec() -> dict[str, Any]:
    """The 64-GPU three-type cluster, a toy model, two shapes per group and 24 training
    choices: 150,312 candidates, phase 1 about 1.4 ms each (3.5 minutes in all)."""
    raw = yaml.safe_load((ROOT / "workloads" / "search" / "three-types-64gpu.yaml").read_text())
    raw["model"] = {"layers": 8, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 8,
                    "seq_len": 256, "vocab": 1024}
    raw["training"]["global_batch"] = [128, 256]
    raw["space"].update(shapes_per_group=2, micro_batch=[1, 2],
                        recompute=["none", "selective", "full"], schedules=["1f1b", "gpipe"])
    return raw


def test_max_seconds_bounds_the_whole_search_enumeration_included(tmp_path):
    raw = _big_spec()
    spec = spec_from_dict(raw, None)
    assert len(structures(spec)) * len(choices(spec)) == BIG_SPACE  # (every one has one resharding)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "s"
    # Before the budget bounded phase 1, this ran for minutes (the enumeration of the whole
    # space) and then reported only the seconds after it; 20 s is a generous bound for 2 s.
    r = run_cli(["search", str(path), "-o", str(out), "--max-seconds", "2",
                 "--no-baselines", "--top", "1"], timeout=90)
    assert r.seconds < 20, f"took {r.seconds:.1f} s"
    assert r.code in (0, 1) and "Traceback" not in r.stderr, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["space_size"] == BIG_SPACE
    assert s["analysed"] < BIG_SPACE and not s["proven_optimal"]
    assert s["search"]["not_analysed"] == BIG_SPACE - s["analysed"]
    assert sum(s["prune_counts"].values()) == BIG_SPACE
    assert s["prune_counts"]["not_reached:budget"] >= BIG_SPACE - s["analysed"]
    assert len(pd.read_csv(out / "candidates.csv")) == s["analysed"]
    # the reported time is the command's, enumeration included
    assert s["enumerate_s"] <= s["wall_s"] <= r.seconds
