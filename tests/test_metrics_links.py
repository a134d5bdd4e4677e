"""Per-link telemetry (bytes, busy time, peak concurrent flows, utilisation) from a timeline."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import WORKLOADS
from helpers.topo import TraceBuilder, make_plan

import xsim_adapters as xs
from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.metrics.links import _peak_concurrency, link_metrics
from xsim_adapters.plan.model import ScaleOut
from xsim_adapters.topology import build_topology
from xsim_adapters.trace.schema import KIND_FLOW

H100_NVL_BPNS = 450.0  # bytes/ns


def _topo():
    return build_topology(make_plan([("h", "H100", 2, 4)], ScaleOut(nodes_per_leaf=1)))


def test_one_flow_fills_its_path_and_nothing_else():
    topo = _topo()
    tb = TraceBuilder(8)
    c = tb.compute(0, 1000)
    f = tb.flow(0, 4, 3_000_000, deps=[c])
    trace = tb.build()
    tl = FlowBackend().run(trace, topo, {})
    lm = link_metrics(trace, tl, topo)
    path = topo.path(0, 4, f)
    on = lm.loc[path]
    assert (on["bytes"] == 3_000_000).all() and (on["flows"] == 1).all()
    assert (on["peak_flows"] == 1).all()
    start, end = tl.frame.loc[f, ["start_ns", "end_ns"]]
    assert (on["busy_ns"] == round(end - start)).all()
    # the NIC link is the bottleneck: 3 MB at 400 Gb/s is 60 us of the 65 us flow
    it = float(tl.frame["end_ns"].max())
    nic = on[on["tier"] == "nic"]
    assert nic["mean_util"].to_numpy() == pytest.approx(3_000_000 * 8 / 400 / it)
    off = lm.drop(index=path)
    assert (off[["bytes", "flows", "busy_ns", "peak_flows"]].to_numpy() == 0).all()


def test_two_concurrent_flows_on_one_link_peak_at_two_and_saturate_it():
    topo = _topo()
    tb = TraceBuilder(8)
    a = tb.flow(0, 1, 900_000)  # both leave gpu0 over its one NVSwitch uplink
    tb.flow(0, 2, 900_000)
    trace = tb.build()
    tl = FlowBackend().run(trace, topo, {})
    lm = link_metrics(trace, tl, topo)
    up = int(topo.path(0, 1, a)[0])
    assert lm.loc[up, "peak_flows"] == 2 and lm.loc[up, "bytes"] == 1_800_000
    # both flows transmit at half rate for 2 x 900 kB / 450 B/ns, plus 1 us of latency
    assert lm.loc[up, "busy_ns"] == round(1000 + 1_800_000 / H100_NVL_BPNS)
    assert lm.loc[up, "busy_util"] == pytest.approx(4000 / 5000)


def test_peak_concurrency_counts_touching_intervals_once():
    key = np.array([0, 0, 0, 1, 1])
    start = np.array([0.0, 10.0, 5.0, 0.0, 0.0])
    end = np.array([10.0, 20.0, 12.0, 1.0, 1.0])
    assert _peak_concurrency(key, start, end, 3).tolist() == [2, 2, 0]


def test_bytes_conserve_over_paths_on_a_shipped_plan():
    plan = xs.load_plan(WORKLOADS / "congested-ecmp-oversubscribed.yaml")
    trace = xs.generate(plan)
    topo = xs.build_topology(plan)
    tl = xs.run(trace, "flow", topology=topo)
    lm = link_metrics(trace, tl, topo)
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    off, _ = topo.paths_for(flows["rank"], flows["dst"], flows["op_id"])
    hops = np.diff(off)
    assert int(lm["bytes"].sum()) == int((flows["bytes"].to_numpy() * hops).sum())
    assert int(lm["flows"].sum()) == int(hops.sum())
    it = float(tl.frame["end_ns"].max())
    assert (lm["busy_ns"] <= it + 1).all()
    # no link carries more than its capacity over the time it is busy (fluid model)
    assert (lm["busy_util"] <= 1 + 1e-9).all()
    # the oversubscribed spine links are the hottest
    hot = lm.sort_values("mean_util", ascending=False).head(4)
    assert (hot["tier"] == "fabric").all()


def test_cli_run_writes_links_and_baseline(tmp_path):
    from xsim_adapters.cli import main

    plan = tmp_path / "p.yaml"
    plan.write_text(
        "name: two\nmodel: {preset: llama2-7b, seq_len: 512, layers: 2}\n"
        "training: {global_batch: 2, micro_batch: 1}\n"
        "device_groups: {h: {type: H100-80GB, nodes: 2, gpus_per_node: 1}}\n"
        "replicas:\n"
        "  - stages: [{group: h, devices: [0, 1], tp: 1, layers: [0, 2]}]\n"
        "  - stages: [{group: h, devices: [1, 2], tp: 1, layers: [0, 2]}]\n"
        "perturb: {slow: [{rank: 1, factor: 2}]}\n"
    )
    out = tmp_path / "out"
    assert main(["run", str(plan), "-o", str(out), "--links", "--baseline", "--no-plots"]) == 0
    import json

    import pandas as pd

    links = pd.read_csv(out / "links.csv")
    assert set(links.columns) >= {"src", "dst", "bytes", "busy_ns", "peak_flows", "mean_util"}
    assert not (out / "links.png").exists()
    s = json.loads((out / "summary.json").read_text())
    p = s["perturbation"]
    assert p["cost_ns"] == s["iteration_time_ns"] - p["baseline_iteration_ns"] > 0
    # rank 1 twice as slow: the DP sync waits for it, and it holds the critical path
    assert s["critical_path"]["top_ranks"][0]["rank"] == 1
