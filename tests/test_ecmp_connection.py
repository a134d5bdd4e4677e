"""``network.ecmp: connection``: a flow's ECMP path follows its NCCL connection (source,
destination, phase, channel), not its op id, in every backend's routing."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from helpers import WORKLOADS

import xsim_adapters as xs
from xsim_adapters.errors import PlanError
from xsim_adapters.topology.routing import connection_keys, stable_hash
from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.coarsen import ecmp_choice

PLAN = WORKLOADS / "congested-ecmp-oversubscribed.yaml"
M64 = (1 << 64) - 1


def _plan(ecmp: str | None):
    d = yaml.safe_load(PLAN.read_text())
    if ecmp is not None:
        d["network"]["ecmp"] = ecmp
    return xs.load_plan(yaml.safe_dump(d))


@pytest.fixture(scope="module")
def runs():
    """(trace, topology) of the congested ECMP plan under each mode."""
    out = {}
    for mode in ("flow", "connection"):
        plan = _plan(mode)
        out[mode] = (xs.generate(plan), xs.build_topology(plan))
    return out


def _connection_of(ops, rows):
    return list(zip(*(ops[c].to_numpy()[rows].tolist()
                      for c in ("rank", "dst", "phase", "channel")), strict=True))


def test_connection_key_is_a_hash_of_the_four_fields():
    """Independent scalar computation: splitmix64 of src, then of (that ^ dst), then of
    (that ^ (phase << 16 | channel & 0xffff)), shifted right once to fit an int64."""
    src = np.array([0, 5, 5, 5, 5, 16383], dtype=np.int32)
    dst = np.array([1, 9, 9, 9, 10, 0], dtype=np.int32)
    phase = np.array([6, 6, 6, 3, 6, 2], dtype=np.int8)
    channel = np.array([-1, 0, 1, 0, 0, 7], dtype=np.int16)
    got = connection_keys(src, dst, phase, channel)
    want = []
    for s, d, p, c in zip(src.tolist(), dst.tolist(), phase.tolist(), channel.tolist(),
                          strict=True):
        z = stable_hash(s)
        z = stable_hash(z ^ d)
        z = stable_hash(z ^ ((p << 16) | (c & 0xFFFF)))
        want.append(z >> 1)
    assert got.dtype == np.int64 and (got >= 0).all()
    assert got.tolist() == want
    assert len(set(want)) == len(want)  # each field changes the key


def test_plan_ecmp_value_is_checked():
    assert _plan(None).network.ecmp == "flow"  # the default
    with pytest.raises(PlanError, match=r"^network\.ecmp: expected one of flow, connection"
                                        r" \(got 'per_qp'\)$"):
        _plan("per_qp")


def test_keys_follow_the_connection_not_the_row(runs):
    trace, topo = runs["connection"]
    ops = trace.ops
    fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
    keys = topo.ecmp_keys(ops, fl)
    # the same flows at other rows (the table reversed) keep their keys
    rev = ops.iloc[::-1].reset_index(drop=True)
    n = len(ops)
    assert topo.ecmp_keys(rev, (n - 1 - fl)[::-1])[::-1].tolist() == keys.tolist()
    # one key per connection, distinct across connections
    conn = _connection_of(ops, fl)
    by_conn = dict(zip(conn, keys.tolist(), strict=True))
    assert len(set(by_conn.values())) == len(by_conn)
    assert all(by_conn[c] == k for c, k in zip(conn, keys.tolist(), strict=True))
    # under ecmp: flow the key is the op id
    assert runs["flow"][1].ecmp_keys(ops, fl).tolist() == fl.tolist()


def _paths_per_connection(trace, topo):
    ops = trace.ops
    fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
    off, links = topo.paths_of_rows(ops, fl)
    seen: dict[tuple, set] = {}
    for row, c in zip(fl.tolist(), _connection_of(ops, fl), strict=True):
        seen.setdefault(c, set()).add(tuple(links[off[row]:off[row + 1]].tolist()))
    return seen


def test_every_flow_of_a_connection_takes_one_path(runs):
    flow = _paths_per_connection(*runs["flow"])
    conn = _paths_per_connection(*runs["connection"])
    assert flow.keys() == conn.keys()
    # per flow, a connection across the oversubscribed uplinks is spread over several paths
    assert max(len(p) for p in flow.values()) > 1
    assert all(len(p) == 1 for p in conn.values())
    # and each connection's path is the topology's path for its key
    trace, topo = runs["connection"]
    for (s, d, ph, ch), paths in conn.items():
        key = int(connection_keys(np.array([s]), np.array([d]), np.array([ph]),
                                  np.array([ch]))[0])
        assert paths == {tuple(topo.path(s, d, key).tolist())}


def test_htsim_input_routes_follow_the_connection(runs, tmp_path):
    from xsim_htsim import write_input
    from xsim_htsim._input import read_input

    trace, topo = runs["connection"]
    write_input(trace, topo, tmp_path / "in.bin")
    d = read_input(tmp_path / "in.bin")
    off, hops = d["routes_offsets"], d["routes_links"]
    ops = trace.ops
    fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
    p_off, p_links = topo.paths_of_rows(ops, fl)
    keys = topo.ecmp_keys(ops, fl)
    for row, key in zip(fl.tolist(), keys.tolist(), strict=True):
        s, t = int(ops["rank"].iat[row]), int(ops["dst"].iat[row])
        fwd, rev = int(d["route"][row]), int(d["reverse_route"][row])
        assert hops[off[fwd]:off[fwd + 1]].tolist() == p_links[p_off[row]:p_off[row + 1]].tolist()
        assert hops[off[rev]:off[rev + 1]].tolist() == topo.path(t, s, key).tolist()


def test_ns3_pair_routes_follow_the_connection(runs):
    """ns-3 routes a GPU pair on one path, its first flow's; on this plan every pair that
    crosses servers carries one connection, so under ``connection`` ns-3's path is every one
    of the pair's flows' path in the flow backend (under ``flow`` it is not)."""
    from xsim_ns3 import parse_options
    from xsim_ns3._prepare import prepare

    for mode, agree in (("connection", True), ("flow", False)):
        trace, topo = runs[mode]
        rin = prepare(trace, topo, parse_options({}))
        a = rin.arrays
        ops = trace.ops
        fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
        p_off, p_links = topo.paths_of_rows(ops, fl)
        conn = a["conn"]
        mismatched = compared = 0
        for row in fl.tolist():
            c = int(conn[row])
            if c < 0:
                continue  # fluid (inside a server)
            compared += 1
            # the hops under the pair's own address are its forward path's, in order
            hops = np.flatnonzero(a["route_addr"] == a["conn_daddr"][c])
            side, cab = a["route_side"][hops], a["route_cable"][hops]
            ab, ba = a["cable_link_ab"][cab], a["cable_link_ba"][cab]
            ns3_links = np.where(side == 0, ab, ba).tolist()
            mismatched += ns3_links != p_links[p_off[row]:p_off[row + 1]].tolist()
        # the packet flows are exactly the DP flows: TP 8 fills a server, so every DP ring
        # member is on another server and every TP flow stays inside one
        assert compared == int((ops["phase"].to_numpy()[fl] == PHASE_INDEX["dp"]).sum()) > 0
        assert (mismatched == 0) == agree, (mode, mismatched)
        # the run info counts exactly those flows (xsim compare prints a hint when > 0)
        assert rin.meta["off_route_flows"] == mismatched


def test_connection_keys_let_microbatches_merge():
    """Routes that follow connections repeat in every micro-batch, so the micro-batch axis of
    coarsening may merge them; under ``flow`` the plan's ECMP choice refuses it."""
    ops = xs.generate(_plan("flow")).ops
    fl = ops["kind"].to_numpy() == KIND_FLOW
    src, dst = ops["rank"].to_numpy()[fl], ops["dst"].to_numpy()[fl]
    assert "several equal-cost paths" in ecmp_choice(_plan("flow"), src, dst)
    assert ecmp_choice(_plan("connection"), src, dst) is None


@pytest.mark.htsim
@pytest.mark.slow
def test_flow_and_htsim_agree_under_connection_routing(driver, runs):
    """Same paths, so the same collisions: on the congested plan the flow backend and htsim
    (RoCE) agree within 2% under ``connection`` (measured +0.9%), and the persistent
    collisions make the iteration longer than under ``flow`` (156 against 114 ms)."""
    from xsim_htsim import HtsimBackend

    it = {}
    for mode in ("flow", "connection"):
        trace, topo = runs[mode]
        it[mode] = xs.metrics(trace, xs.run(trace, "flow", topo)).summary["iteration_time_ns"]
    trace, topo = runs["connection"]
    tl = HtsimBackend().run(trace, topo, {"driver": driver, "scale_up": "fluid"})
    packet = xs.metrics(trace, tl).summary["iteration_time_ns"]
    assert packet == pytest.approx(it["connection"], rel=0.02)
    assert it["connection"] > 1.2 * it["flow"]


def test_link_metrics_count_bytes_on_the_connection_paths(runs):
    """``metrics --links`` routes flows as the backends do: each link's bytes are the bytes of
    the flows whose connection path (``Topology.path`` with the connection's key) crosses it."""
    from xsim_adapters.metrics.links import link_metrics

    trace, topo = runs["connection"]
    lm = link_metrics(trace, xs.run(trace, "flow", topo), topo)
    ops = trace.ops
    fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
    want = np.zeros(len(topo.links), dtype=np.int64)
    by_conn: dict[tuple, int] = {}
    for row, c in zip(fl.tolist(), _connection_of(ops, fl), strict=True):
        by_conn[c] = by_conn.get(c, 0) + int(ops["bytes"].iat[row])
    for (s, d, ph, ch), nbytes in by_conn.items():
        key = int(connection_keys(np.array([s]), np.array([d]), np.array([ph]),
                                  np.array([ch]))[0])
        want[topo.path(s, d, key)] += nbytes
    assert lm["bytes"].to_numpy(dtype=np.int64).tolist() == want.tolist()


def test_ns3_gives_each_connection_of_a_pair_its_own_path(runs):
    """Eight channels from rank 0 to rank 16 (another leaf: four uplinks to choose from) are
    eight connections under ``connection``, each with its own address and the path of its own
    key, as in the flow backend; under ``flow`` ns-3 carries the pair on one connection."""
    from xsim_ns3 import parse_options
    from xsim_ns3._prepare import prepare

    from xsim_adapters.testing.handmade import TraceBuilder

    tb = TraceBuilder(32)
    rows = [tb.flow(0, 16, 1 << 20, channel=c) for c in range(8)]
    trace = tb.build()
    for mode, conns in (("flow", 1), ("connection", 8)):
        topo = runs[mode][1]
        a = prepare(trace, topo, parse_options({})).arrays
        assert len(a["conn_daddr"]) == conns
        if mode == "flow":
            continue
        keys = topo.ecmp_keys(trace.ops, np.array(rows))
        paths = set()
        for row, key in zip(rows, keys.tolist(), strict=True):
            hops = np.flatnonzero(a["route_addr"] == a["conn_daddr"][int(a["conn"][row])])
            side, cab = a["route_side"][hops], a["route_cable"][hops]
            links = np.where(side == 0, a["cable_link_ab"][cab], a["cable_link_ba"][cab])
            assert links.tolist() == topo.path(0, 16, key).tolist()
            paths.add(tuple(links.tolist()))
        assert len(paths) > 1  # the connections do not all share one path


def test_compare_prints_a_hint_for_flows_on_other_links(capsys):
    """``xsim compare`` says when a backend carried flows on other links than the others (the
    run info's ``off_route_flows``) and how to make them route alike."""
    import pandas as pd

    from xsim_adapters.cli.run import print_run_info
    from xsim_adapters.metrics.compare import RUN_INFO_COLUMNS

    row = dict(packet_flows=1536, fluid_flows=100, packet_bytes=10, fluid_bytes=10,
               fluid_bytes_pct=50.0, startup_s=1.0, replay_s=2.0, wall_s=3.5)
    info = pd.DataFrame([{"backend": "flow", **row, "off_route_flows": 0},
                         {"backend": "ns3", **row, "off_route_flows": 1008}],
                        columns=list(RUN_INFO_COLUMNS))
    print_run_info(info)
    lines = [x for x in capsys.readouterr().out.splitlines() if "other links" in x]
    assert lines == ["  ns3: 1,008 packet flows ran on other links than the other backends"
                     " route them (one path per GPU pair); add `ecmp: connection` under"
                     " `network:` for identical routing (docs/ns3.md)"]


def test_digest_is_kept_at_the_default_and_moves_with_connection():
    """A plan without ``ecmp`` keeps the digest it had before the key existed (sha256 computed
    by the code of 70de368, before ``network.ecmp``); ``connection`` is another plan."""
    from xsim_adapters.workload.generate import plan_digest

    plan = xs.load_plan(WORKLOADS / "homogeneous-h100.yaml")
    assert plan_digest(plan) == (
        "5d6bf42f278cf3489138f65d5c6d3ec55289e2e2229c52c092018ad1e86a2b66")
    d = yaml.safe_load((PLAN.parent / "homogeneous-h100.yaml").read_text())
    d.setdefault("network", {})["ecmp"] = "connection"
    assert plan_digest(xs.load_plan(yaml.safe_dump(d))) != plan_digest(plan)
