"""Several jobs on one fabric: placement, the combined trace, isolation and interference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xsim_adapters import api
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.jobs import combine_traces, place_jobs, run_jobs
from xsim_adapters.topology.build import build_topology
from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX
from xsim_adapters.trace.validate import validate_trace

GPUS = 8


def _plan(name, network):
    """Two DP replicas of a 4-layer Llama-2-7B, TP 8, one per server: the DP all-reduce is the
    only traffic between servers (8 rings of 2, one per GPU pair)."""
    return plan_from_dict({
        "name": name, "model": {"preset": "llama2-7b", "seq_len": 2048, "layers": 4},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": {"h": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": GPUS}},
        "network": network,
        "replicas": [
            {"stages": [{"group": "h", "devices": [0, 8], "tp": 8, "layers": [0, 4]}]},
            {"stages": [{"group": "h", "devices": [8, 16], "tp": 8, "layers": [0, 4]}]},
        ],
    })


NONBLOCKING = {"scale_out": {"topology": "leaf_spine", "nodes_per_leaf": 2}}
# Two servers per leaf and one 3.2 Tb/s uplink to one spine: 2 x 8 x 400 Gb/s down, 2:1.
OVERSUBSCRIBED = {"scale_out": {"topology": "leaf_spine", "nodes_per_leaf": 2, "spines": 1,
                                "oversubscription": 2, "link_gbps": 3200}}


def test_placement_maps_ranks_packed_and_round_robin():
    a, b = _plan("a", NONBLOCKING), _plan("b", NONBLOCKING)
    packed = place_jobs([a, b])
    assert packed.rank_map[0].tolist() == list(range(16))
    assert packed.rank_map[1].tolist() == list(range(16, 32))
    assert [g.name for g in packed.cluster.device_groups] == ["j0-h", "j1-h"]
    spread = place_jobs([a, b], "spread")  # servers: a0, b0, a1, b1
    assert spread.rank_map[0].tolist() == list(range(0, 8)) + list(range(16, 24))
    assert spread.rank_map[1].tolist() == list(range(8, 16)) + list(range(24, 32))
    assert spread.cluster.num_nodes == 4


def test_combined_trace_conserves_every_job():
    a, b = _plan("a", NONBLOCKING), _plan("b", NONBLOCKING)
    jobs = place_jobs([a, b], "spread")
    ta, tb = api.generate(a), api.generate(b)
    t = combine_traces(jobs, [ta, tb])
    validate_trace(t)
    assert len(t.ops) == len(ta.ops) + len(tb.ops)
    assert len(t.deps) == len(ta.deps) + len(tb.deps)
    assert int(t.ops["bytes"].sum()) == int(ta.ops["bytes"].sum() + tb.ops["bytes"].sum())
    # job b's flows run between job b's servers only
    fb = t.ops.iloc[len(ta.ops):]
    fb = fb[fb["kind"] == KIND_FLOW]
    assert set(fb["rank"]) | set(fb["dst"]) <= set(jobs.rank_map[1].tolist())
    alone = combine_traces(jobs, [ta, tb], only=1)
    assert len(alone.ops) == len(tb.ops) and len(alone.manifest["ranks"]) == 32


def test_two_jobs_on_disjoint_halves_of_a_nonblocking_fabric_run_as_fast_as_one():
    a, b = _plan("a", NONBLOCKING), _plan("b", NONBLOCKING)
    lone = api.run(a).makespan_ns
    res = run_jobs([a, b])  # packed: each job on its own leaf
    table = res.table()
    assert table["iteration_time_ns"].tolist() == [round(lone)] * 2
    assert table["slowdown_pct"].abs().max() < 1e-6
    # no spine link carries a byte
    assert int(res.links.loc[res.links["tier"] == "fabric", "bytes"].sum()) == 0


def _inter_server_dp_span(trace, timeline):
    o, f = trace.ops, timeline.frame
    sel = ((o["kind"] == KIND_FLOW) & (o["phase"] == PHASE_INDEX["dp"])
           & (o["rank"] // GPUS != o["dst"] // GPUS)).to_numpy()
    return float(f["end_ns"].to_numpy()[sel].max() - f["start_ns"].to_numpy()[sel].min())


def test_sharing_an_oversubscribed_uplink_halves_each_jobs_rate():
    """Spread placement: each leaf holds one server of each job. Alone, a job's 8 inter-leaf
    flows fill the 3.2 Tb/s uplink at exactly their NICs' 400 Gb/s; together, 16 flows share it
    at 200 Gb/s each, so each job's inter-server DP transfer takes twice as long."""
    a, b = _plan("a", OVERSUBSCRIBED), _plan("b", OVERSUBSCRIBED)
    jobs = place_jobs([a, b], "spread")
    traces = [api.generate(p) for p in jobs.plans]
    topo = build_topology(jobs.cluster)
    alone = combine_traces(jobs, traces, only=0)
    both = combine_traces(jobs, traces)
    span_alone = _inter_server_dp_span(alone, api.run(alone, "flow", topo))
    span_both = _inter_server_dp_span(both, api.run(both, "flow", topo))
    assert span_both / span_alone == pytest.approx(2.0, rel=0.01)
    res = run_jobs([a, b], placement="spread")
    assert (res.table()["slowdown_pct"] > 10).all()
    # every inter-server byte of both jobs crosses a leaf uplink and a spine downlink
    o = res.trace.ops
    inter = (o["kind"] == KIND_FLOW) & (o["rank"] // GPUS != o["dst"] // GPUS)
    fabric = res.links[res.links["tier"] == "fabric"]
    assert int(fabric["bytes"].sum()) == 2 * int(o.loc[inter, "bytes"].sum()) > 0


@pytest.mark.parametrize("second, msg", [
    (lambda: _plan("a", NONBLOCKING), "every job needs its own plan name"),
    (lambda: _plan("b", OVERSUBSCRIBED), "job 1 (b): the jobs share the first job's network"),
])
def test_errors(second, msg):
    with pytest.raises(PlanError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        place_jobs([_plan("a", NONBLOCKING), second()])
    with pytest.raises(PlanError, match="expected 2..64 plans"):
        place_jobs([_plan("a", NONBLOCKING)])


def test_a_job_without_network_uses_the_first_jobs():
    b = _plan("b", {})
    jobs = place_jobs([_plan("a", OVERSUBSCRIBED), b])
    assert jobs.cluster.network.scale_out.oversubscription == 2


def test_cli_run_with_jobs(tmp_path):
    from xsim_adapters.cli import main

    paths = _small_job_files(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(paths[0]), "--job", str(paths[1]), "--placement", "spread",
                 "-o", str(out), "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert [j["job"] for j in s["jobs"]] == ["a", "b"] and s["placement"] == "spread"
    for name in ("a", "b"):
        js = json.loads((out / "jobs" / name / "summary.json").read_text())
        assert js["ranks"] == 2 and js["plan"] == name
    assert (out / "links.csv").is_file() and (out / "jobs.csv").is_file()
    assert np.isfinite(s["jobs"][0]["slowdown_pct"])


def _small_job_files(tmp_path, network=None):
    """Two 2-GPU plans (one GPU per server, DP 2) as files: a, b."""
    import yaml

    paths = []
    for name in ("a", "b"):
        p = tmp_path / f"{name}.yaml"
        d = {"name": name, "model": {"preset": "llama2-7b", "seq_len": 512, "layers": 2},
             "training": {"global_batch": 2, "micro_batch": 1},
             "device_groups": {"h": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 1}},
             "replicas": [{"stages": [{"group": "h", "devices": [i, i + 1], "tp": 1,
                                       "layers": [0, 2]}]} for i in (0, 1)]}
        if network is not None:
            d["network"] = network
        p.write_text(yaml.safe_dump(d))
        paths.append(p)
    return paths


# One 400G uplink per leaf, two servers per leaf: spread placement puts one server of each
# job under each leaf, so the jobs' DP transfers share the uplink.
SHARED_UPLINK = {"scale_out": {"topology": "leaf_spine", "nodes_per_leaf": 2, "spines": 1,
                               "oversubscription": 2, "link_gbps": 400}}


def test_sweep_with_jobs_reports_each_variants_slowdown_beside_the_others(tmp_path):
    """``xsim sweep A --job B``: every variant of A runs beside B; its row holds A's metrics
    from the shared run, its slowdown against running alone, and B's. The numbers are what
    run_jobs gives for the same pair, and the shared uplink makes both jobs slower."""
    import pandas as pd

    from xsim_adapters.cli import main
    from xsim_adapters.traffic import load_job

    a, b = _small_job_files(tmp_path, SHARED_UPLINK)
    out = tmp_path / "sweep"
    assert main(["sweep", str(a), "--job", str(b), "--placement", "spread",
                 "--set", "model.seq_len=512,1024", "-o", str(out)]) == 0
    frame = pd.read_csv(out / "sweep.csv")
    assert frame["error"].isna().all() or (frame["error"].fillna("") == "").all()
    assert frame["job1"].tolist() == ["b", "b"]
    direct = run_jobs([load_job(a), load_job(b)], placement="spread").table()
    row = frame.iloc[0]  # seq_len 512: the plans as written
    assert row["iteration_time_ns"] == direct["iteration_time_ns"].iloc[0]
    assert row["slowdown_pct"] == pytest.approx(direct["slowdown_pct"].iloc[0], abs=1e-9)
    assert row["job1_iteration_time_ns"] == direct["iteration_time_ns"].iloc[1]
    assert (frame["slowdown_pct"] > 0).all() and (frame["job1_slowdown_pct"] > 0).all()
    # the longer sequence computes longer alone; together, both jobs' last DP bytes still
    # leave through the one busy uplink (work-conserving: the same end)
    assert frame["alone_iteration_ns"].iloc[1] > frame["alone_iteration_ns"].iloc[0]
    assert frame["mean_compute_ns"].iloc[1] > frame["mean_compute_ns"].iloc[0]
    import yaml

    spec = yaml.safe_load((out / "sweep.yaml").read_text())
    assert spec["jobs"] == [str(b.resolve())] and spec["placement"] == "spread"


def test_sweep_resume_keys_on_the_other_jobs(tmp_path):
    from xsim_adapters.sweep.results import variant_digest

    plain = {"plan": {"name": "a"}, "backend": "flow", "options": {}}
    with_b = {**plain, "jobs": [{"data": {"name": "b"}, "base_dir": "/x"}],
              "placement": "packed"}
    spread = {**with_b, "placement": "spread"}
    assert len({variant_digest(plain), variant_digest(with_b), variant_digest(spread)}) == 3
    assert variant_digest({**plain, "base_dir": "/y"}) == variant_digest(plain)  # as before


@pytest.mark.htsim
def test_compare_with_jobs_on_flow_and_htsim(driver, tmp_path):
    """``xsim compare A --job B --backends flow,htsim``: the same placed jobs on both; each
    job's iteration time on htsim is within 2% of flow (uncongested: non-blocking fabric),
    and the files per backend are written."""
    import pandas as pd

    from xsim_adapters.cli import main

    a, b = _small_job_files(tmp_path)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), "--job", str(b), "--backends", "flow,htsim",
                 "--option", f"htsim.driver={driver}", "-o", str(out)]) == 0
    t = pd.read_csv(out / "compare_jobs.csv")
    assert t["job"].tolist() == ["a", "b"]
    assert (t["rel_diff_htsim"].abs() < 0.02).all()
    assert (t["slowdown_pct_flow"].abs() < 1e-6).all()  # packed, non-blocking: no interference
    for be in ("flow", "htsim"):
        assert (out / be / "jobs.csv").is_file() and (out / be / "links.csv").is_file()
        assert (out / be / "jobs" / "b" / "summary.json").is_file()
    s = json.loads((out / "summary.json").read_text())
    assert s["backends"] == ["flow", "htsim"] and len(s["jobs"]) == 2


def test_combined_trace_carries_each_jobs_windows_on_its_cluster_ranks():
    """A job's interval slowdowns (manifest compute_slowdowns) name its own ranks; placed on the
    cluster they must name the GPUs it got (spread: job b's rank 1 is cluster rank 3)."""
    a, b = _plan("a", NONBLOCKING), _plan("b", NONBLOCKING)
    jobs = place_jobs([a, b], "spread")
    ta, tb = api.generate(a), api.generate(b)
    tb.manifest["compute_slowdowns"] = [{"ranks": [1, 9], "factor": 2.0, "from_ns": 0.0,
                                         "until_ns": None}]
    t = combine_traces(jobs, [ta, tb])
    validate_trace(t)
    want = [int(jobs.rank_map[1][1]), int(jobs.rank_map[1][9])]
    assert t.manifest["compute_slowdowns"] == [{"ranks": want, "factor": 2.0, "from_ns": 0.0,
                                                "until_ns": None}]
    assert want == [9, 25]  # servers a0, b0, a1, b1: b's GPU 1 is on b0, its GPU 9 on b1
    assert "compute_slowdowns" not in combine_traces(jobs, [ta, tb], only=0).manifest
