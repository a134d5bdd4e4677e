"""Rerouting around failed links and the NIC-down shorthand, on the flow backend's two engines
(closed forms); the packet backends' are in test_whatif_packet.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers.topo import make_plan
from helpers.whatif import (
    LAT_NS,
    RATE_B_PER_NS,
    fail_cable,
    spine_of,
    two_flows_on_two_spines,
    two_spines,
)

from xsim_adapters import api
from xsim_adapters.errors import BackendError, PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.model import LinkEvent
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.testing import handmade
from xsim_adapters.topology import build_topology
from xsim_adapters.topology.reroute import detours, epochs

ENGINES = ("python", "native")
B = 1_000_000  # bytes per flow: 80 us at 100 Gb/s
PATH_LAT = 4 * LAT_NS  # GPU -> leaf -> spine -> leaf -> GPU


def _ends(trace, topo, engine):
    tl = api.run(trace, "flow", topo, {"engine": engine})
    return tl.frame.set_index("op_id")["end_ns"], tl.stats


@pytest.mark.parametrize("engine", ENGINES)
def test_a_flow_whose_spine_fails_mid_transfer_moves_to_the_other_spine(engine):
    """Flows A (gpu0 -> gpu2) and B (gpu1 -> gpu3) each run alone on their own spine at the
    NIC rate R. A's leaf0-spine cable fails at t_f: A moves to B's spine, and from t_f the two
    share leaf0's one live uplink at R/2 each, so both end at 2 B / R - t_f (+ path latency);
    nothing is lost (fluid)."""
    trace, topo, a, b = two_flows_on_two_spines(B)
    tf = 20_000.0
    fail_cable(topo, "leaf0", f"spine{spine_of(topo, topo.path(0, 2, a))}", tf)
    end, stats = _ends(trace, topo, engine)
    want = 2 * B / RATE_B_PER_NS - tf + PATH_LAT
    assert end[a] == pytest.approx(want, rel=1e-12) and end[b] == pytest.approx(want, rel=1e-12)
    assert stats["reroutes"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_flow_starting_while_its_route_is_down_starts_on_the_detour(engine):
    """The spine A would hash onto is down from 10 us; A starts at 50 us (after a compute) and
    runs alone on the other spine: 50 us + B / R + latency, as if nothing had failed."""
    topo = two_spines()
    tb = handmade.TraceBuilder(4)
    c = tb.compute(0, 50_000)
    a = tb.flow(0, 2, B, deps=[c])
    trace = tb.build()
    fail_cable(topo, "leaf0", f"spine{spine_of(topo, topo.path(0, 2, a))}", 10_000.0)
    end, stats = _ends(trace, topo, engine)
    assert end[a] == pytest.approx(50_000 + B / RATE_B_PER_NS + PATH_LAT, rel=1e-12)
    assert stats["reroutes"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_restore_moves_nothing_back_and_a_dead_nic_has_no_detour(engine):
    """GPU 0 has one NIC: when its cable fails there is no other path, the flow stalls until
    the restore (closed form: B / R + outage + latency), and no reroute is counted."""
    topo = two_spines()
    tb = handmade.TraceBuilder(4)
    a = tb.flow(0, 2, B)
    trace = tb.build()
    fail_cable(topo, "gpu0", "leaf0", 20_000.0, restore_ns=70_000.0)
    end, stats = _ends(trace, topo, engine)
    assert end[a] == pytest.approx(B / RATE_B_PER_NS + 50_000 + PATH_LAT, rel=1e-12)
    assert stats["reroutes"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_no_path_ends_the_run_naming_the_flow_and_the_link(engine):
    topo = two_spines()
    tb = handmade.TraceBuilder(4)
    tb.flow(0, 2, B)
    fail_cable(topo, "gpu0", "leaf0", 20_000.0)
    with pytest.raises(BackendError) as e:
        api.run(tb.build(), "flow", topo, {"engine": engine})
    msg = str(e.value)
    assert "1 flows stalled on failed links with no restore: op 0 (flow, rank 0" in msg
    assert "(gpu0->leaf0)" in msg


def test_both_spines_down_then_one_back_moves_the_stalled_flow():
    """Every uplink of leaf0 fails at 20 us: A stalls (no detour). At 50 us one spine comes
    back: the new epoch has a detour, A takes it (or resumes, if it is A's own spine)."""
    trace, topo, a, b = two_flows_on_two_spines(B)
    names = topo.nodes["name"].astype(str).tolist()
    s, d = topo.links["src"].to_numpy(), topo.links["dst"].to_numpy()
    leaf0 = names.index("leaf0")
    up = [i for i in range(len(s)) if leaf0 in (s[i], d[i]) and names[s[i] ^ d[i] ^ leaf0]
          .startswith("spine")]
    import pandas as pd

    back = [i for i in up if names[s[i] ^ d[i] ^ leaf0] == "spine0"]
    topo.events = pd.DataFrame({"at_ns": [20_000.0] * len(up) + [50_000.0] * len(back),
                                "link_id": np.array(up + back, dtype=np.int32),
                                "factor": [0.0] * len(up) + [1.0] * len(back)})
    ep = epochs(topo)
    assert ep.at_ns.tolist() == [20_000.0, 50_000.0] and ep.down[0].sum() == 4
    out = {e: _ends(trace, topo, e) for e in ENGINES}
    (py, _), (nat, _) = out["python"], out["native"]
    assert np.array_equal(py.to_numpy(), nat.to_numpy())
    # both stalled 30 us, then share spine0's uplink: 2 B / R - 20 us of work left for two
    want = 50_000 + 2 * (B - 20_000 * RATE_B_PER_NS) / RATE_B_PER_NS + PATH_LAT
    assert py[a] == pytest.approx(want, rel=1e-12) and py[b] == pytest.approx(want, rel=1e-12)


def test_detours_are_the_router_on_the_surviving_links():
    trace, topo, a, _ = two_flows_on_two_spines(B)
    sa = spine_of(topo, topo.path(0, 2, a))
    fail_cable(topo, "leaf0", f"spine{sa}", 1.0)
    ops = trace.ops
    off = np.zeros(len(ops) + 1, dtype=np.int64)
    paths = [topo.path(int(r), int(d), i) if k == 1 else np.zeros(0, np.int32)
             for i, (k, r, d) in enumerate(zip(ops["kind"], ops["rank"], ops["dst"],
                                               strict=True))]
    np.cumsum([len(p) for p in paths], out=off[1:])
    det = detours(topo, ops["rank"].to_numpy(), ops["dst"].to_numpy(),
                  np.arange(len(ops)), off, np.concatenate(paths))
    assert det.key.tolist() == [a]  # epoch 0, op a: only A crossed the dead cable
    assert spine_of(topo, det.path(0)) == 1 - sa and len(det.path(0)) == 4


# ------------------------------------------------------------------ the NIC-down shorthand


def _nic_links(topo, node_name):
    names = topo.nodes["name"].astype(str).to_numpy()
    lk = topo.links
    mask = (lk["tier"] == "nic").to_numpy() & (
        (names[lk["src"].to_numpy()] == node_name) | (names[lk["dst"].to_numpy()] == node_name))
    return sorted(np.flatnonzero(mask).tolist())


def test_nic_down_fails_the_gpus_nic_cable_and_nic_up_restores_it():
    ev = (LinkEvent(at_us=5, kind="nic_down", src="", dst="", factor=0.0, rank=3),
          LinkEvent(at_us=9, kind="nic_up", src="", dst="", factor=1.0, rank=3))
    topo = build_topology(make_plan([("h", "H100", 2, 4)], events=ev))
    want = _nic_links(topo, "gpu3")
    assert len(want) == 2
    assert topo.events["link_id"].tolist() == want * 2
    assert topo.events["factor"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert topo.events["at_ns"].tolist() == [5000.0, 5000.0, 9000.0, 9000.0]


def test_nic_down_on_a_shared_nic_fails_that_nics_cable():
    d = copy.deepcopy(_PLAN)
    d["device_groups"]["h100"]["server"] = {"nics": "per_pair"}
    d["network"] = {"events": [{"at_us": 1, "kind": "nic_down", "rank": 3}]}
    plan = plan_from_dict(d)
    topo = build_topology(plan)
    assert topo.events["link_id"].tolist() == _nic_links(topo, "nic1")  # GPUs 2, 3 share it
    assert plan_to_dict(plan)["network"]["events"] == [
        {"at_us": 1.0, "kind": "nic_down", "rank": 3}]
    assert plan_from_dict(plan_to_dict(plan)) == plan


_PLAN = {
    "name": "nicdown",
    "model": "tiny-gpt",
    "training": {"global_batch": 4, "micro_batch": 1},
    "device_groups": {"h100": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 4}},
    "replicas": {"uniform": {"group": "h100", "tp": 4, "dp": 2}},
}


@pytest.mark.parametrize(("event", "where", "what"), [
    ({"at_us": 1, "kind": "nic_down"}, "network.events[0].rank", "required key is missing"),
    ({"at_us": 1, "kind": "nic_down", "rank": 0, "src": "gpu0"}, "network.events[0].src",
     "not with kind nic_down"),
    ({"at_us": 1, "kind": "fail", "rank": 0, "src": "a", "dst": "b"}, "network.events[0].rank",
     "only with kind nic_down or nic_up"),
    ({"at_us": 1, "kind": "fail", "src": "gpu0"}, "network.events[0].dst",
     "required key is missing"),
])
def test_bad_nic_events_name_the_field(event, where, what):
    d = copy.deepcopy(_PLAN)
    d["network"] = {"events": [event]}
    with pytest.raises(PlanError) as e:
        plan_from_dict(d)
    assert str(e.value).startswith(where) and what in str(e.value)


def test_nic_down_of_a_rank_outside_the_plan_names_the_event():
    d = copy.deepcopy(_PLAN)
    d["network"] = {"events": [{"at_us": 1, "kind": "nic_down", "rank": 8}]}
    with pytest.raises(PlanError, match=r"network\.events\[0\]\.rank: expected a global rank "
                                        r"in 0\.\.7 \(got 8\)"):
        build_topology(plan_from_dict(d))


def test_a_plan_with_a_nic_down_for_good_ends_naming_the_nic_link():
    d = copy.deepcopy(_PLAN)
    d["network"] = {"events": [{"at_us": 0, "kind": "nic_down", "rank": 4}]}
    plan = plan_from_dict(d)
    with pytest.raises(BackendError, match=r"stalled on failed links with no restore: .*"
                                           r"\(gpu4->leaf0\)"):
        api.run(plan, trace=api.generate(plan))


def test_link_telemetry_counts_a_flow_on_the_detour_it_started_on():
    topo = two_spines()
    tb = handmade.TraceBuilder(4)
    a = tb.flow(0, 2, B, deps=[tb.compute(0, 50_000)])
    trace = tb.build()
    dead = spine_of(topo, topo.path(0, 2, a))
    fail_cable(topo, "leaf0", f"spine{dead}", 10_000.0)
    tl = api.run(trace, "flow", topo)
    links = api.link_metrics(trace, tl, topo)
    by = links.set_index(["src", "dst"])["bytes"]
    assert by[("leaf0", f"spine{dead}")] == 0
    assert by[("leaf0", f"spine{1 - dead}")] == B and by[(f"spine{1 - dead}", "leaf1")] == B
    assert int(links["bytes"].sum()) == 4 * B  # four hops, each byte once per hop
