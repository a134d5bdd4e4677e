"""Hostile input on the Python API and the CLI's newer surfaces (issue 32, issue 31's rough
edges): a trace replayed on another plan's network, a manifest edited after tracing, wrong
argument types, bad numbers for bench-collective and calibrate, a traffic job beside a
pipelined plan, a search spec whose micro-batch divides nothing, a typo in a sweep axis, the
common flags, integer nanosecond columns. Each error is one line naming the place (option,
file and field, argument), no traceback, in bounded time and memory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from attack_runner import assert_clean_error, run_cli

import xsim_adapters as xs
from xsim_adapters import api
from xsim_adapters.errors import ArgumentTypeError, TraceError
from xsim_adapters.search import search

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "workloads"


def _plan_text(name: str, nodes: int, gpn: int, gtype: str = "H100-80GB", tp: int = 2,
               pp: int = 2, extra: str = "") -> str:
    dp = nodes * gpn // (tp * pp)
    return (f"name: {name}\nmodel: tiny-gpt\ntraining: {{global_batch: {2 * dp}, "
            f"micro_batch: 1}}\ndevice_groups:\n  g: {{type: {gtype}, nodes: {nodes}, "
            f"gpus_per_node: {gpn}}}\nreplicas:\n  uniform: {{group: g, tp: {tp}, pp: {pp}, "
            f"dp: {dp}}}\n{extra}")


@pytest.fixture(scope="module")
def small() -> tuple[xs.Timeline, object, object]:
    plan = xs.load_plan(_plan_text("small8", 1, 8))
    trace = xs.generate(plan)
    return plan, trace, xs.run(trace, topology=xs.build_topology(plan))


# ---------------------------------------------------------------- trace vs topology


def test_run_refuses_a_trace_on_a_topology_with_other_ranks(small) -> None:
    plan, trace, _ = small
    other = xs.build_topology(xs.load_plan(_plan_text("big16", 2, 8)))
    with pytest.raises(TraceError, match=r"the trace has 8 ranks \(manifest ranks\) but the "
                                         r"topology has 16 GPUs"):
        xs.run(trace, topology=other)


def test_run_refuses_other_servers_and_other_device_types(small) -> None:
    plan, trace, _ = small
    servers = xs.build_topology(xs.load_plan(_plan_text("two-by-4", 2, 4)))
    with pytest.raises(TraceError, match=r"manifest ranks\[4\]\.node: the trace puts rank 4 "
                                         r"on server 0, the topology on server 1 \(4 ranks"):
        xs.run(trace, topology=servers)
    types = xs.build_topology(xs.load_plan(_plan_text("a100", 1, 8, "A100-80GB")))
    with pytest.raises(TraceError, match=r"ranks\[0\]\.device_type: the trace has "
                                         r"'H100-80GB' on rank 0, the topology 'A100-80GB'"):
        xs.run(trace, topology=types)


def test_every_backend_gets_the_check_before_it_starts(small, monkeypatch) -> None:
    """The check is in api.run, before the backend is even looked up: ns-3 and htsim (which
    may not be installed here) cannot be reached with a mismatched pair."""
    plan, trace, _ = small
    other = xs.build_topology(xs.load_plan(_plan_text("big16", 2, 8)))

    def no_backend(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("the backend was reached")

    monkeypatch.setattr(api, "_backend", no_backend)
    for name in ("flow", "ns3", "htsim"):
        with pytest.raises(TraceError, match="but the topology has 16 GPUs"):
            xs.run(trace, name, topology=other)


def test_run_with_a_plan_and_another_plans_trace_is_refused(small) -> None:
    plan, _, _ = small
    other = xs.generate(xs.load_plan(_plan_text("big16", 2, 8)))
    with pytest.raises(TraceError, match="plan_digest: the trace was generated from a plan"):
        xs.run(plan, trace=other)


def test_write_trace_refuses_another_plans_plan_yaml(small, tmp_path: Path) -> None:
    plan, trace, _ = small
    other = xs.load_plan(_plan_text("big16", 2, 8))
    with pytest.raises(TraceError, match=r"write_trace\(\): plan: the trace was generated "
                                         "from another plan"):
        xs.write_trace(trace, tmp_path / "t", plan=other)
    assert not (tmp_path / "t").exists()


# ---------------------------------------------------------------- manifest vs plan.yaml

SLOW = "perturb:\n  slow:\n    - {rank: 5, factor: 3.0, from_us: 100, until_us: 20000}\n"


def _traced(d: Path, text: str) -> Path:
    from xsim_adapters.cli import main

    (d / "p.yaml").write_text(text)
    assert main(["trace", str(d / "p.yaml"), "-o", str(d / "t"), "-q"]) == 0
    return d / "t"


@pytest.fixture(scope="module")
def slowed_trace(tmp_path_factory) -> Path:
    return _traced(tmp_path_factory.mktemp("slow"), _plan_text("slowed", 1, 8, extra=SLOW))


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory) -> Path:
    return _traced(tmp_path_factory.mktemp("plain"), _plan_text("plain", 1, 8))


@pytest.mark.parametrize("edit", ["removed", "changed", "added-to-a-plain-trace"])
def test_a_manifest_whose_slowdowns_disagree_with_its_plan_is_refused(
        slowed_trace: Path, plain_trace: Path, tmp_path: Path, edit: str) -> None:
    t = tmp_path / "t"
    record = {"ranks": [5], "factor": 3.0, "from_ns": 100000.0, "until_ns": 20000000.0}
    shutil.copytree(plain_trace if edit.startswith("added") else slowed_trace, t)
    m = json.loads((t / "manifest.json").read_text())
    if edit == "removed":
        assert m["compute_slowdowns"] == [record]
        del m["compute_slowdowns"]
        want = "has 0 interval compute slowdowns but plan.yaml"
    elif edit == "changed":
        m["compute_slowdowns"][0]["factor"] = 1.5
        want = "gives 1, different ones"
    else:  # a plan without slowdowns, a manifest that claims one
        assert "compute_slowdowns" not in m
        m["compute_slowdowns"] = [record]
        want = "has 1 interval compute slowdowns but plan.yaml"
    (t / "manifest.json").write_text(json.dumps(m))
    out = run_cli(["run", str(t), "-o", str(tmp_path / "r"), "--no-plots", "-q"])
    assert_clean_error(out, f"{t}/manifest.json: compute_slowdowns: ")
    assert want in out.stderr
    with pytest.raises(TraceError, match="compute_slowdowns"):
        xs.run(t)  # the Python API reads the directory the same way
    assert not (tmp_path / "r").exists()


def test_untouched_traces_still_run_and_the_slowdown_acts(slowed_trace: Path,
                                                          plain_trace: Path) -> None:
    assert xs.run(slowed_trace).makespan_ns > xs.run(plain_trace).makespan_ns


# ---------------------------------------------------------------- argument types


def _cases(small):
    plan, trace, tl = small
    met = xs.metrics(trace, tl)
    return [
        ("run", "plan_or_trace", lambda: xs.run({"name": "x"}), "got dict"),
        ("run", "plan_or_trace", lambda: xs.run(None), "got None"),
        ("run", "plan_or_trace", lambda: xs.run(3), "got int 3"),
        ("run", "backend", lambda: xs.run(plan, None), "got None"),
        ("run", "topology", lambda: xs.run(trace, topology=plan), "got Plan"),
        ("run", "options", lambda: xs.run(plan, options="seed=1"), "got str 'seed=1'"),
        ("run", "trace", lambda: xs.run(plan, trace="t"), "got str 't'"),
        ("generate", "plan", lambda: xs.generate("workloads/homogeneous-h100.yaml"),
         "got str 'workloads/homogeneous-h100.yaml'"),
        ("generate", "plan", lambda: xs.generate(None), "got None"),
        ("build_topology", "plan", lambda: xs.build_topology({}), "got dict"),
        ("build_topology", "plan", lambda: xs.build_topology(trace), "got Trace"),
        ("metrics", "trace", lambda: xs.metrics("x", tl), "got str 'x'"),
        ("metrics", "timeline", lambda: xs.metrics(trace, None), "got None"),
        ("metrics", "timeline", lambda: xs.metrics(trace, tl.frame), "got DataFrame"),
        ("write_trace", "trace", lambda: xs.write_trace("x", "/nonexistent/t"), "got str"),
        ("write_trace", "directory", lambda: xs.write_trace(trace, None), "got None"),
        ("write_trace", "plan", lambda: xs.write_trace(trace, "/nonexistent/t", plan={}),
         "got dict"),
        ("write_trace", "force", lambda: xs.write_trace(trace, "/nonexistent/t", force="yes"),
         "got str 'yes'"),
        ("read_trace", "directory", lambda: xs.read_trace(None), "got None"),
        ("read_trace", "directory", lambda: xs.read_trace(trace), "got Trace"),
        ("load_plan", "source", lambda: xs.load_plan(None), "got None"),
        ("load_plan", "source", lambda: xs.load_plan(plan), "got Plan"),
        ("load_plan", "source", lambda: xs.load_plan(b"name: x"), "got bytes"),
        ("compare_backends", "plan", lambda: xs.compare_backends("p.yaml"), "got str 'p.yaml'"),
        ("compare_backends", "backends", lambda: xs.compare_backends(plan, "flow,ns3"),
         "got str 'flow,ns3'"),
        ("compare_backends", "backends[1]", lambda: xs.compare_backends(plan, ["flow", 3]),
         "got int 3"),
        ("compare_backends", "options['ns3']",
         lambda: xs.compare_backends(plan, ["flow", "ns3"], {"ns3": "x"}), "got str 'x'"),
        ("compare", "tl_b", lambda: xs.compare(trace, tl, None), "got None"),
        ("compare", "trace", lambda: xs.compare(plan, tl, tl), "got Plan"),
        ("write_report", "met", lambda: xs.write_report({"a": 1}, "/nonexistent/r"),
         "got dict"),
        ("write_report", "out_dir", lambda: xs.write_report(met, 3), "got int 3"),
        ("get_backend", "name", lambda: xs.get_backend(None), "got None"),
        ("get_backend", "options", lambda: xs.get_backend("flow", [1]), "got list"),
        ("add_perturbation_cost", "plan", lambda: api.add_perturbation_cost(met, "p"),
         "got str 'p'"),
        ("link_metrics", "topology", lambda: api.link_metrics(trace, tl, None), "got None"),
        # xsim_adapters.search.search (api.search left api.py: api sits below search, 26)
        ("search", "spec", lambda: search(None), "got None"),
        ("search", "jobs", lambda: search("s.yaml", jobs="2"), "got str '2'"),
    ]


def test_wrong_argument_types_name_function_argument_expected_and_got(small) -> None:
    for func, arg, call, got in _cases(small):
        with pytest.raises(TypeError) as info:
            call()
        assert isinstance(info.value, ArgumentTypeError), (func, arg, info.value)
        msg = str(info.value)
        assert msg.startswith(f"{func}(): {arg}: expected "), msg
        assert f"({got}" in msg and "\n" not in msg, msg
    assert not Path("/nonexistent").exists()


# ---------------------------------------------------------------- bench-collective


@pytest.mark.parametrize("argv,named", [
    (["-b", "8G", "-e", "1K"], "--minbytes: 8G is larger than --maxbytes 1K"),
    (["-b", "nan"], "--minbytes: expected a byte count"),
    (["-b", "-5"], "--minbytes: expected a byte count"),
    (["-b", "0", "-e", "4K"], "--minbytes: expected 1 byte to 1 TiB (got '0')"),
    (["-b", "abc"], "--minbytes: expected a byte count such as 1024, 64K, 8M or 1G"),
    (["-e", "1e30"], "--maxbytes: expected 1 byte to 1 TiB"),
    (["-e", "2T"], "--maxbytes: expected 1 byte to 1 TiB"),
    (["-e", "1P"], "--maxbytes: expected a byte count"),
    (["-e", "inf"], "--maxbytes: expected a byte count"),
    (["--servers", "8192", "-e", "1K"], "65536 GPUs with auto channels: one all_reduce would "
                                        "be about 68,718,428,162 flows"),
    (["--gpus-per-server", "4096", "-e", "1K"], "MAX_TRACE_OPS"),
    (["--nic-gbps", "nan", "-e", "2K"], "nic_gbps: expected a number"),
])
def test_bench_collective_refuses_bad_numbers(argv, named) -> None:
    assert_clean_error(run_cli(["bench-collective", *argv]), named)


@pytest.mark.parametrize("argv,named", [
    (["--servers", "0"], "argument --servers: expected an integer >= 1 (got 0)"),
    (["--servers", "x"], "argument --servers: expected an integer >= 1 (got 'x')"),
    (["--gpus-per-server", "-8"], "argument --gpus-per-server: expected an integer >= 1"),
    (["--channels", "-3"], "argument --channels: expected 0 (auto) to 1024"),
    (["--channels", "100000000"], "argument --channels: expected 0 (auto) to 1024"),
])
def test_bench_collective_usage_errors_are_argparse_lines(argv, named) -> None:
    out = run_cli(["bench-collective", *argv])
    assert out.code == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"xsim bench-collective: error: {named}" \
        or named in out.stderr.strip().splitlines()[-1], out.stderr


def test_bench_with_an_empty_size_list_is_refused_not_the_default_sweep() -> None:
    from xsim_adapters.bench_collective import bench, bench_plan
    from xsim_adapters.errors import PlanError

    with pytest.raises(PlanError, match="no sizes to run"):
        bench(bench_plan("H100-80GB", 1, 2), sizes=[])


def test_bench_collective_prints_units(capsys) -> None:
    from xsim_adapters.cli import main

    assert main(["bench-collective", "--gpus-per-server", "2", "-b", "1K", "-e", "2K"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                                "algorithm"]
    assert [int(x.split()[0]) for x in lines[2:]] == [1024, 2048]


# ---------------------------------------------------------------- calibrate


@pytest.mark.parametrize("seconds", ["inf", "1e400", "nan", "-1", "0", "abc", "-inf"])
def test_calibrate_refuses_bad_seconds(seconds: str) -> None:
    item = f"{WORKLOADS / 'whatif-slow-gpu.yaml'}={seconds}"
    out = run_cli(["calibrate", "--measured", item, "--device-type", "H100-80GB"])
    assert out.code == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1
    assert "--measured: expected PLAN=SECONDS with SECONDS a finite number > 0" in out.stderr


def test_calibrate_fit_refuses_an_infinite_time() -> None:
    from xsim_adapters.calibrate import fit
    from xsim_adapters.errors import PlanError

    plan = xs.load_plan(_plan_text("cal", 1, 8))
    with pytest.raises(PlanError, match=r"calibrate.plans\[0\]: expected a finite positive"):
        fit([(plan, float("inf"))], "H100-80GB", predict=lambda p: 1.0)


# ---------------------------------------------------------------- traffic beside a pipeline


def test_remap_keeps_the_two_sides_of_a_p2p_cell() -> None:
    from xsim_adapters.jobs import remap_rank_list

    rmap = np.arange(100, 116)
    assert remap_rank_list("0,1;2,3", rmap) == "100,101;102,103"
    assert remap_rank_list("3,2,1,0", rmap) == "103,102,101,100"
    assert remap_rank_list("", rmap) == ""


def test_shipped_pipelined_plan_runs_beside_the_shipped_traffic(tmp_path: Path) -> None:
    """homogeneous-h100 (pp 2: p2p collectives) with tenants-permutation: ValueError on '3;4'
    before; now it runs and the job's slowdown is reported."""
    out = run_cli(["run", str(WORKLOADS / "homogeneous-h100.yaml"), "--job",
                   str(WORKLOADS / "traffic" / "tenants-permutation.yaml"), "-o",
                   str(tmp_path / "r"), "--no-plots", "-q"], timeout=120)
    assert out.code == 0, out.stderr[-3000:]
    jobs = pd.read_csv(tmp_path / "r" / "jobs.csv")
    assert list(jobs["job"]) == ["llama2-7b-16xh100", "tenants"]
    assert int(jobs["ranks"].iloc[0]) == 16


# ---------------------------------------------------------------- search spec


@pytest.mark.parametrize("mb,named", [
    ("[3]", "space.micro_batch: each size must divide a global batch (64); 3 divides none"),
    ("[1, 3]", "3 divides none"),
    ("[128]", "128 divides none"),
])
def test_search_spec_micro_batch_that_divides_nothing(tmp_path: Path, mb: str,
                                                      named: str) -> None:
    text = (WORKLOADS / "search" / "h100-a100-16gpu.yaml").read_text()
    spec = tmp_path / "s.yaml"
    spec.write_text(text.replace("micro_batch: [1, 2]", f"micro_batch: {mb}"))
    assert_clean_error(run_cli(["search", str(spec), "-o", str(tmp_path / "o"), "-q"]), named)
    assert not (tmp_path / "o").exists()


def test_search_global_batch_without_a_dividing_micro_batch(tmp_path: Path) -> None:
    text = (WORKLOADS / "search" / "h100-a100-16gpu.yaml").read_text()
    spec = tmp_path / "s.yaml"
    spec.write_text(text.replace("global_batch: 64 ", "global_batch: [64, 50] ")
                    .replace("micro_batch: [1, 2]", "micro_batch: [4]"))
    assert_clean_error(run_cli(["search", str(spec), "-o", str(tmp_path / "o")]),
                       "training.global_batch: 50: no micro-batch size of space.micro_batch")


# ---------------------------------------------------------------- sweep axes


@pytest.mark.parametrize("axis,named", [
    ("training.micro_bach=1,2", "axis training.micro_bach: unknown key micro_bach under "
                                "training; did you mean micro_batch?"),
    ("traning.micro_batch=1", "unknown key traning under the plan's top level; did you mean "
                              "training?"),
    ("replicas[0].stage[0].tp=1", "unknown key stage under replicas[0]; did you mean stages?"),
    ("device_groups.h100.nodez=1", "under device_groups.h100; did you mean nodes?"),
    ("training[0]=1", "axis training[0]: training is not a list in a plan"),
    ("bogus=1", "unknown key bogus under the plan's top level (known keys: collectives,"),
])
def test_sweep_axis_typo_fails_before_anything_runs(tmp_path: Path, axis: str,
                                                    named: str) -> None:
    out = tmp_path / "o"
    res = run_cli(["sweep", str(WORKLOADS / "whatif-slow-gpu.yaml"), "--set", axis, "-o",
                   str(out), "-q"])
    assert_clean_error(res, named)
    assert not out.exists()  # nothing ran, nothing was written or replaced


@pytest.mark.parametrize("path", [
    "training.micro_batch", "replicas[1].stages[0].layers", "device_groups.h100.nodes",
    "model.layers", "model.moe.num_experts", "collectives.resharding",
    "network.scale_out.link_gbps", "replicas.uniform.tp", "perturb.slow[0].factor",
    "device_types.H100-80GB.efficiency", "training.overlap.tp_comm", "network.links[0].gbps",
    "seed",
])
def test_valid_axis_paths_pass_the_check(path: str) -> None:
    from xsim_adapters.sweep.spec import check_axis_paths

    check_axis_paths({path: [1]})


def test_sweep_python_api_checks_axis_paths_too() -> None:
    from xsim_adapters.sweep import sweep
    from xsim_adapters.sweep.spec import SweepError

    with pytest.raises(SweepError, match="did you mean micro_batch"):
        sweep(str(WORKLOADS / "whatif-slow-gpu.yaml"), {"training.micro_bach": [1, 2]})


def test_sweep_with_too_many_variants_fails_before_expanding(tmp_path: Path) -> None:
    values = ",".join(str(i) for i in range(1, 2001))
    res = run_cli(["sweep", str(WORKLOADS / "whatif-slow-gpu.yaml"), "--set", f"seed={values}",
                   "--set", f"training.micro_batch={values}", "--set", f"model.layers={values}",
                   "-o", str(tmp_path / "o")], timeout=20)
    assert_clean_error(res, "axes: 8,000,000,000 variants (2000 x 2000 x 2000), more than the "
                            "100,000 one sweep may run (MAX_VARIANTS", max_seconds=10)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_absurd_local_jobs_are_refused_before_any_worker(tmp_path: Path, command: str) -> None:
    args = ([str(WORKLOADS / "whatif-slow-gpu.yaml"), "--set", "seed=1,2"] if command == "sweep"
            else [str(WORKLOADS / "search" / "h100-a100-16gpu.yaml")])
    res = run_cli([command, *args, "--jobs", "100000", "-o", str(tmp_path / "o")])
    assert_clean_error(res, "jobs: at most 256 local worker processes (MAX_LOCAL_JOBS")
    assert not (tmp_path / "o").exists()


def test_compare_backends_given_twice_run_once() -> None:
    from xsim_adapters.cli.args import parse_backends
    from xsim_adapters.errors import XsimError

    assert parse_backends("flow, ns3,flow") == ["flow", "ns3"]
    with pytest.raises(XsimError, match="at least two different names"):
        parse_backends("flow,flow")


def test_sweep_file_that_is_not_a_file() -> None:
    assert_clean_error(run_cli(["sweep", "--sweep", "/dev/null"]),
                       "/dev/null: not a regular file (expected a sweep YAML file)")


# ---------------------------------------------------------------- common flags


def _subparsers():
    import argparse

    from xsim_adapters.cli import build_parser

    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_subcommand_accepts_q_and_force_has_one_help() -> None:
    from xsim_adapters.cli import FORCE_HELP

    writers = {"trace", "export", "run", "compare", "sweep", "search"}
    for name, sp in _subparsers().items():
        flags = {o: a for a in sp._actions for o in a.option_strings}
        assert "-q" in flags and "--quiet" in flags, name
        if name in writers:
            assert flags["--force"].help == FORCE_HELP, name
    out = run_cli(["search", "/nonexistent/spec.yaml", "-q"])
    assert out.code == 1 and "unrecognized arguments" not in out.stderr, out.stderr


def test_trace_accepts_q(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(_plan_text("q", 1, 8))
    from xsim_adapters.cli import main

    assert main(["trace", str(plan), "-o", str(tmp_path / "t"), "-q"]) == 0
    assert (tmp_path / "t" / "manifest.json").is_file()


# ---------------------------------------------------------------- integer ns columns


def test_integer_ns_keeps_values_and_only_converts_whole_numbers() -> None:
    from xsim_adapters.metrics.frames import integer_ns

    f = pd.DataFrame({"iteration_time_ns": [446576883.0, np.nan], "mean_x_ns": [1.5, 2.0],
                      "bubble_ns_diff": [-3.0, 0.0], "tokens_per_s": [1.0, 2.0],
                      "huge_ns": [1e300, 1.0]})
    g = integer_ns(f)
    assert str(g["iteration_time_ns"].dtype) == "Int64"
    assert g["iteration_time_ns"].iloc[0] == 446576883 and g["iteration_time_ns"].isna().iloc[1]
    assert g["mean_x_ns"].dtype == np.float64  # 1.5 would change: kept as it is
    assert str(g["bubble_ns_diff"].dtype) == "Int64"
    assert g["tokens_per_s"].dtype == np.float64 and g["huge_ns"].dtype == np.float64
    assert f["iteration_time_ns"].dtype == np.float64  # the input is not changed


def test_sweep_frame_and_files_have_integer_ns(tmp_path: Path) -> None:
    from xsim_adapters.cli import main

    out = tmp_path / "sw"
    assert main(["sweep", str(WORKLOADS / "whatif-slow-gpu.yaml"), "--set",
                 "training.micro_batch=1,3", "-o", str(out), "-q", "--allow-failures"]) == 0
    csv = (out / "sweep.csv").read_text().splitlines()
    header = csv[0].split(",")
    row = dict(zip(header, csv[1].split(","), strict=True))
    failed = dict(zip(header, csv[2].split(","), strict=True))
    ns = [c for c in header if c.endswith("_ns")]
    assert len(ns) > 20
    for c in ns:
        assert row[c].lstrip("-").isdigit(), (c, row[c])
        assert failed[c] == "", (c, failed[c])  # the failed variant: missing, not 0
    frame = pd.read_parquet(out / "sweep.parquet")
    assert str(frame["iteration_time_ns"].dtype) == "Int64"
    assert frame["iteration_time_ns"].isna().tolist() == [False, True]


def test_compare_csv_ns_rows_are_integers(small, tmp_path: Path) -> None:
    from xsim_adapters.metrics.compare import compare_metrics
    from xsim_adapters.report.outputs import write_csv

    plan, trace, tl = small
    met = xs.metrics(trace, tl)
    cmp = compare_metrics(met, met)
    write_csv(tmp_path / "compare.csv", cmp.metrics)
    write_csv(tmp_path / "compare_ranks.csv", cmp.ranks)
    rows = {r.split(",")[0]: r.split(",") for r in
            (tmp_path / "compare.csv").read_text().splitlines()[1:]}
    it = int(met.summary["iteration_time_ns"])
    assert rows["iteration_time_ns"][2] == str(it) and rows["iteration_time_ns"][5] == "0"
    assert "." in rows["mfu"][2]  # fractions stay fractions
    ranks = pd.read_csv(tmp_path / "compare_ranks.csv")
    assert ranks["iteration_time_ns_a"].dtype == np.int64
    assert cmp.metrics["value_a"].dtype == np.float64  # the API frame is not changed

