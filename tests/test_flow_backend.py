"""The flow backend: closed-form times for single, shared and max-min flows, rings, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers.topo import TraceBuilder, make_plan, ring_allreduce

from xsim_adapters.backends.flow import FlowBackend, maxmin_rates
from xsim_adapters.backends.flow.maxmin import _maxmin_numpy, _maxmin_python
from xsim_adapters.backends.flow.native import native_status
from xsim_adapters.errors import BackendError
from xsim_adapters.plan.model import LinkEvent, ScaleOut
from xsim_adapters.topology import Topology, build_topology

H100_NIC_BPNS = 400 / 8  # bytes/ns
H100_NVL_BPNS = 450.0  # 450 GB/s = 450 bytes/ns


ENGINE = {"engine": "python"}  # set by the autouse fixture: every test runs on both engines


@pytest.fixture(autouse=True, params=["python", "native"])
def engine(request):
    """Each closed form below is checked on the Python reference and on the compiled core."""
    ok, why = native_status()
    if request.param == "native" and not ok:
        pytest.skip(why)
    ENGINE["engine"] = request.param
    yield request.param
    ENGINE["engine"] = "python"


def run(trace, topo):
    return FlowBackend().run(trace, topo, dict(ENGINE))


def two_servers(**kw):
    return build_topology(make_plan([("h", "H100", 2, 4)], ScaleOut(nodes_per_leaf=1), **kw))


def times(tl, op):
    row = tl.frame.iloc[op]
    return float(row["start_ns"]), float(row["end_ns"])


def test_one_flow_alone_takes_latency_plus_bytes_over_bottleneck():
    topo = two_servers()
    tb = TraceBuilder(8)
    c = tb.compute(0, 1234)
    f = tb.flow(0, 4, 3_000_000)
    tb.dep(c, f)
    tl = run(tb.build(), topo)
    path = topo.path(0, 4, f)
    links = topo.links.iloc[path]
    latency = links["latency_ns"].sum()
    bottleneck = links["gbps"].min() / 8
    assert latency == 4000.0 and bottleneck == H100_NIC_BPNS  # gpu-leaf-spine-leaf-gpu
    start, end = times(tl, f)
    assert start == 1234.0
    assert end - start == pytest.approx(latency + 3_000_000 / bottleneck, rel=1e-12)
    assert end == 1234.0 + 4000.0 + 60_000.0


def test_two_flows_sharing_one_link_each_get_half():
    topo = two_servers()
    tb = TraceBuilder(8)
    a = tb.flow(0, 1, 900_000)  # both leave gpu0 over its one NVSwitch uplink
    b = tb.flow(0, 2, 900_000)
    tl = run(tb.build(), topo)
    expect = 1000.0 + 2 * 900_000 / H100_NVL_BPNS
    for op in (a, b):
        assert times(tl, op) == (0.0, pytest.approx(expect, rel=1e-12))


def _textbook_topology() -> Topology:
    """Switches s0 -link1-> s1 -link2-> s2; each flow has its own fast, zero-latency GPU links.

    link1 carries 1 byte/ns (8 Gb/s), link2 2 bytes/ns (16 Gb/s).
    """
    names = ["gA0", "gA1", "gB0", "gB1", "gC0", "gC1", "s0", "s1", "s2"]
    nodes = pd.DataFrame(
        {
            "node_id": np.arange(9, dtype=np.int32),
            "kind": ["gpu"] * 6 + ["leaf"] * 3,
            "name": names,
            "rank": np.array([0, 1, 2, 3, 4, 5, -1, -1, -1], dtype=np.int32),
            "server": np.full(9, -1, dtype=np.int32),
        }
    )
    idx = {n: i for i, n in enumerate(names)}
    wires = [("s0", "s1", 8.0), ("s1", "s2", 16.0), ("gA0", "s0", 1e6), ("s1", "gA1", 1e6),
             ("gB0", "s1", 1e6), ("s2", "gB1", 1e6), ("gC0", "s0", 1e6), ("s2", "gC1", 1e6)]
    links = pd.DataFrame(
        {
            "link_id": np.arange(len(wires), dtype=np.int32),
            "src": np.array([idx[a] for a, _, _ in wires], dtype=np.int32),
            "dst": np.array([idx[b] for _, b, _ in wires], dtype=np.int32),
            "gbps": [g for _, _, g in wires],
            "latency_ns": np.zeros(len(wires)),
            "tier": ["fabric"] * len(wires),
        }
    )
    return Topology(nodes=nodes, links=links, rank_node=np.arange(6, dtype=np.int32))


def test_textbook_maxmin_rates():
    assert maxmin_rates([[1], [2], [1, 2]], [0.0, 1.0, 2.0]) == [0.5, 1.5, 0.5]
    assert _maxmin_numpy([[1], [2], [1, 2]], [0.0, 1.0, 2.0]).tolist() == [0.5, 1.5, 0.5]


def test_textbook_maxmin_completion_times():
    topo = _textbook_topology()
    tb = TraceBuilder(6)
    a = tb.flow(0, 1, 1000)  # over link1 only
    b = tb.flow(2, 3, 1500)  # over link2 only
    c = tb.flow(4, 5, 2000)  # over link1 and link2
    tl = run(tb.build(), topo)
    assert topo.path(4, 5, c).tolist() == [6, 0, 1, 7]
    # B at 1.5 B/ns ends at 1000; A and C at 0.5 B/ns (link1 split); A ends at 2000;
    # then C alone on link1 at 1 B/ns sends its last 1000 bytes by 3000
    assert times(tl, b)[1] == pytest.approx(1000.0, rel=1e-12)
    assert times(tl, a)[1] == pytest.approx(2000.0, rel=1e-12)
    assert times(tl, c)[1] == pytest.approx(3000.0, rel=1e-12)


def test_python_and_numpy_water_filling_agree():
    rng = np.random.default_rng(7)
    for _ in range(100):
        n_links = int(rng.integers(1, 15))
        cap = rng.choice([0.0, 1.0, 2.0, 3.5], size=n_links).tolist()
        flows = [
            rng.choice(n_links, size=int(rng.integers(1, min(4, n_links) + 1)),
                       replace=False).tolist()
            for _ in range(int(rng.integers(1, 30)))
        ]
        a = _maxmin_python(flows, cap)
        b = _maxmin_numpy(flows, cap)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        load = np.zeros(n_links)
        for f, links in enumerate(flows):
            load[links] += a[f]
        assert (load <= np.asarray(cap) * (1 + 1e-9) + 1e-12).all()  # feasible
        for f, links in enumerate(flows):  # every flow has a saturated bottleneck link
            assert any(
                load[lk] >= cap[lk] * (1 - 1e-9) and a[f] >= max(
                    a[g] for g, other in enumerate(flows) if lk in other) * (1 - 1e-9)
                for lk in links
            )


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_inside_one_server_is_closed_form(n):
    topo = build_topology(make_plan([("h", "H100", 1, 8)]))
    size = 8_000_000
    tb = TraceBuilder(8)
    _, end = ring_allreduce(tb, list(range(n)), size)
    tl = run(tb.build(), topo)
    t = times(tl, end)[1]
    bw = H100_NVL_BPNS
    lower = 2 * (n - 1) / n * size / bw
    expect = 2 * (n - 1) * ((size // n) / bw + 2 * 500.0)  # two 0.5 us scale-up hops per step
    assert t >= lower
    assert t == pytest.approx(expect, rel=1e-12)  # exact up to float rounding


def test_ring_allreduce_across_servers_on_uniform_links():
    topo = two_servers()
    topo.links["gbps"] = 400.0  # every link 400 Gb/s: a uniform network
    n, size = 8, 16_000_000
    tb = TraceBuilder(8)
    _, end = ring_allreduce(tb, list(range(n)), size)
    t = times(tl := run(tb.build(), topo), end)[1]
    assert t >= 2 * (n - 1) / n * size / H100_NIC_BPNS
    # the slowest step is the one crossing the fabric: 4 hops of 1 us
    assert t == pytest.approx(2 * (n - 1) * ((size // n) / H100_NIC_BPNS + 4000.0), rel=1e-12)
    assert tl.stats["max_active_flows"] == n


def test_ring_with_one_slow_nic_follows_the_slowest_link():
    plan = make_plan([("h", "H100", 3, 1), ("a", "A100", 1, 1)], ScaleOut(nodes_per_leaf=1))
    topo = build_topology(plan)
    n, size = 4, 4_000_000
    tb = TraceBuilder(4)
    _, end = ring_allreduce(tb, list(range(n)), size)
    t = times(run(tb.build(), topo), end)[1]
    slow = 200 / 8  # A100 NIC, bytes/ns
    assert t >= 2 * (n - 1) / n * size / slow
    assert t == pytest.approx(2 * (n - 1) * (size / n / slow + 4000.0), rel=1e-12)
    fast = build_topology(make_plan([("h", "H100", 4, 1)], ScaleOut(nodes_per_leaf=1)))
    tb = TraceBuilder(4)
    _, end = ring_allreduce(tb, list(range(n)), size)
    assert times(run(tb.build(), fast), end)[1] < t / 1.8  # twice the NIC, about half the time


def test_compute_ops_of_a_rank_serialize_and_ranks_run_in_parallel():
    topo = two_servers()
    tb = TraceBuilder(8)
    chain = [tb.compute(0, d) for d in (100, 200, 300)]
    for a, b in zip(chain, chain[1:], strict=False):
        tb.dep(a, b)
    other = tb.compute(1, 50)
    bar = tb.barrier()
    tb.dep(chain[-1], bar)
    tb.dep(other, bar)
    tl = run(tb.build(), topo)
    assert [times(tl, op) for op in chain] == [(0.0, 100.0), (100.0, 300.0), (300.0, 600.0)]
    assert times(tl, other) == (0.0, 50.0)
    assert times(tl, bar) == (600.0, 600.0)  # barriers take no time


def test_dependency_cycle_raises_naming_the_stuck_ops():
    topo = two_servers()
    tb = TraceBuilder(8)
    free = tb.compute(3, 10)
    a = tb.compute(0, 10)
    b = tb.flow(0, 5, 100, phase="pp")
    tb.dep(a, b)
    tb.dep(b, a)
    with pytest.raises(BackendError) as err:
        run(tb.build(), topo)
    msg = str(err.value)
    assert free not in (a, b)
    assert "2 of 3 ops never finished" in msg
    assert "dependency cycle" in msg
    assert "op 1 (compute, rank 0, phase fwd)" in msg
    assert "op 2 (flow, rank 0, phase pp)" in msg


def test_failed_link_without_restore_raises_naming_flow_and_link():
    topo = two_servers(events=(LinkEvent(at_us=5.0, kind="fail", src="gpu0", dst="leaf0"),))
    tb = TraceBuilder(8)
    f = tb.flow(0, 4, 3_000_000)
    after = tb.compute(4, 10, phase="bwd")
    tb.dep(f, after)
    ok = tb.flow(1, 5, 1000)
    with pytest.raises(BackendError) as err:
        run(tb.build(), topo)
    msg = str(err.value)
    assert "2 of 3 ops never finished" in msg
    assert "op 0 (flow, rank 0, phase dp) over failed link" in msg
    assert "(gpu0->leaf0)" in msg
    assert "op 1 (compute, rank 4, phase bwd)" in msg
    assert f"op {ok}" not in msg


def test_fail_then_restore_delays_the_flow_by_the_outage():
    events = (
        LinkEvent(at_us=10.0, kind="fail", src="gpu0", dst="leaf0"),
        LinkEvent(at_us=50.0, kind="restore", src="gpu0", dst="leaf0"),
    )
    topo = two_servers(events=events)
    tb = TraceBuilder(8)
    f = tb.flow(0, 4, 3_000_000)
    tl = run(tb.build(), topo)
    # 10 us at 50 B/ns (500 kB), 40 us stalled, the remaining 2.5 MB at 50 B/ns, then latency
    assert times(tl, f)[1] == pytest.approx(50_000 + 2_500_000 / 50 + 4000, rel=1e-12)


def test_degrade_halves_the_rate_from_its_time():
    events = (LinkEvent(at_us=20.0, kind="degrade", src="leaf0", dst="spine0", factor=0.5),)
    plan = make_plan([("h", "H100", 2, 4)], ScaleOut(nodes_per_leaf=1, spines=1,
                                                    link_gbps=1600.0), events=events)
    topo = build_topology(plan)
    tb = TraceBuilder(8)
    f = tb.flow(0, 4, 3_000_000)
    tl = run(tb.build(), topo)
    # the NIC (50 B/ns) stays the bottleneck until the 1600 Gb/s uplink drops to 800: still
    # 100 B/ns, so nothing changes; the flow ends as if alone
    assert times(tl, f)[1] == pytest.approx(60_000 + 4000, rel=1e-12)
    topo.links.loc[topo.links["tier"] == "fabric", "gbps"] = 400.0
    tl = run(tb.build(), topo)  # now 50 B/ns -> 25 B/ns after 20 us: 1 MB sent, 2 MB at half
    assert times(tl, f)[1] == pytest.approx(20_000 + 2_000_000 / 25 + 4000, rel=1e-12)


def test_zero_byte_flow_and_same_rank_flow():
    topo = two_servers()
    tb = TraceBuilder(8)
    z = tb.flow(0, 4, 0)
    s = tb.flow(2, 2, 1_000_000)
    tl = run(tb.build(), topo)
    assert times(tl, z) == (0.0, 4000.0)  # only the latency
    assert times(tl, s) == (0.0, 0.0)  # no link crossed


def test_progress_stats_and_determinism():
    topo = two_servers()
    tb = TraceBuilder(8)
    ring_allreduce(tb, list(range(8)), 8_000_000)
    trace = tb.build()
    calls = []
    tl = FlowBackend().run(trace, topo, {"progress": lambda d, t: calls.append((d, t)),
                                         "seed": 3, **ENGINE})
    assert calls[-1] == (trace.num_ops, trace.num_ops)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    for key in ("wall_s", "events", "events_per_s", "max_active_flows", "rate_recomputations"):
        assert key in tl.stats
    assert tl.stats["max_active_flows"] == 8
    assert tl.stats["events"] >= 2 * 7 * 8  # every flow's transmission end at least
    again = FlowBackend().run(trace, topo, dict(ENGINE))
    pd.testing.assert_frame_equal(tl.frame, again.frame)
    assert FlowBackend.available() == (True, "")


def _dumbbell(n: int, bottleneck_gbps: float, access_gbps: list[float]) -> Topology:
    """n senders -> s0 -> (bottleneck) -> s1 -> n receivers; zero latency everywhere."""
    names = [f"src{i}" for i in range(n)] + [f"dst{i}" for i in range(n)] + ["s0", "s1"]
    nodes = pd.DataFrame(
        {
            "node_id": np.arange(2 * n + 2, dtype=np.int32),
            "kind": ["gpu"] * (2 * n) + ["leaf", "leaf"],
            "name": names,
            "rank": np.r_[np.arange(2 * n), -1, -1].astype(np.int32),
            "server": np.full(2 * n + 2, -1, dtype=np.int32),
        }
    )
    src = [2 * n] + list(range(n)) + [2 * n + 1] * n
    dst = [2 * n + 1] + [2 * n] * n + list(range(n, 2 * n))
    gbps = [bottleneck_gbps] + list(access_gbps) + [1e6] * n
    links = pd.DataFrame(
        {
            "link_id": np.arange(len(src), dtype=np.int32),
            "src": np.asarray(src, dtype=np.int32),
            "dst": np.asarray(dst, dtype=np.int32),
            "gbps": np.asarray(gbps, dtype=np.float64),
            "latency_ns": np.zeros(len(src)),
            "tier": ["fabric"] * len(src),
        }
    )
    return Topology(nodes=nodes, links=links, rank_node=np.arange(2 * n, dtype=np.int32))


def test_many_flows_on_one_bottleneck_use_the_vectorized_solver():
    n, cap_gbps, nbytes = 120, 960.0, 600_000  # 120 flows x 3 links: the numpy water filling
    c = cap_gbps / 8  # 120 bytes/ns
    slow = c / (4 * n)  # the even senders' own links: a quarter of a fair share
    access = [slow * 8 if i % 2 == 0 else 1e6 for i in range(n)]
    topo = _dumbbell(n, cap_gbps, access)
    tb = TraceBuilder(2 * n)
    ops = [tb.flow(i, n + i, nbytes) for i in range(n)]
    tl = run(tb.build(), topo)
    end = tl.frame["end_ns"].to_numpy()[ops]
    fast_rate = (c - (n / 2) * slow) / (n / 2)  # what the slow half leaves, split evenly
    np.testing.assert_allclose(end[1::2], nbytes / fast_rate, rtol=1e-9)
    np.testing.assert_allclose(end[0::2], nbytes / slow, rtol=1e-9)  # own link stays the limit
    equal = _dumbbell(n, cap_gbps, [1e6] * n)
    tl = run(tb.build(), equal)
    np.testing.assert_allclose(tl.frame["end_ns"].to_numpy()[ops], n * nbytes / c, rtol=1e-9)


def test_malformed_ops_are_rejected_by_name():
    topo = two_servers()
    tb = TraceBuilder(8)
    tb.compute(0, 10)
    tb.compute(1, -5)
    with pytest.raises(BackendError, match=r"^flow: op 1 has duration_ns -5; expected a duration"):
        run(tb.build(), topo)
    tb = TraceBuilder(8)
    tb.flow(0, 9, 10)
    with pytest.raises(BackendError, match=r"^flow: op 0 is a flow with dst 9, but the topology"
                                           r" has 8 ranks"):
        run(tb.build(), topo)
    tb = TraceBuilder(8)
    a = tb.compute(0, 10)
    tb.dep(a, 7)
    with pytest.raises(BackendError, match=r"^flow: deps reference op 7 but the trace has 1 ops"):
        run(tb.build(), topo)
