"""``collectives.channels: auto`` (the default): one forward ring per NIC a server's members use."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import REPO
from helpers.gen import H100, make_plan

from xsim_adapters import api
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.model import CollectiveAlgorithms
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.trace.schema import PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.comm.rings import RankInfo, auto_orders, channel_orders, channels_for


def _nic_use(info: RankInfo, orders: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rings sent out of / received into each NIC across servers."""
    out = np.zeros(int(info.nic.max()) + 1, dtype=int)
    into = np.zeros_like(out)
    for o in orders:
        for a, b in zip(o, o[1:] + o[:1], strict=True):
            if info.server[a] != info.server[b]:
                out[info.nic[a]] += 1
                into[info.nic[b]] += 1
    return out, into


@pytest.mark.parametrize("servers", [2, 3, 4])
def test_auto_opens_one_forward_ring_per_nic_and_loads_every_nic_once_each_way(servers: int):
    plan = make_plan([[("h100", 0, 8, 0, 4)]], groups=[("h100", H100, servers, 8)])
    info = RankInfo(plan)
    n = 8 * servers
    orders = auto_orders(info, list(range(n)))
    assert len(orders) == 8 == channels_for(info, range(n), 0)
    for o in orders:
        assert sorted(o) == list(range(n))
    out, into = _nic_use(info, orders)
    assert out.tolist() == [1] * n and into.tolist() == [1] * n
    # half the rings of the explicit 16 (pairs of a ring and its reverse), same NIC coverage
    out16, into16 = _nic_use(info, channel_orders(info, list(range(n)), 16))
    assert out16.tolist() == [2] * n and into16.tolist() == [2] * n


def test_auto_dp_ring_with_two_members_per_server_uses_both_nics():
    """The held-out TP-4 case: a DP ring with 2 members on each of 2 servers used one NIC per
    server with ``channels: 1``; ``auto`` opens 2 rings that leave through both."""
    plan = make_plan([[("h100", 0, 8, 0, 4)]])
    info = RankInfo(plan)
    ranks = [0, 4, 8, 12]
    one = channel_orders(info, ranks, 1)
    auto = channel_orders(info, ranks, 0)
    assert len(auto) == 2
    used_one = np.flatnonzero(_nic_use(info, one)[0]).tolist()
    out, into = _nic_use(info, auto)
    assert len(used_one) == 2  # one NIC per server
    assert np.flatnonzero(out).tolist() == [0, 4, 8, 12] == np.flatnonzero(into).tolist()


def test_auto_inside_one_server_is_one_ring():
    info = RankInfo(make_plan([[("h100", 0, 8, 0, 4)]]))
    assert auto_orders(info, list(range(8))) == [list(range(8))]
    assert channels_for(info, range(8), 0) == 1


def test_auto_counts_nics_not_gpus_when_a_server_shares_one_nic():
    plan = api.load_plan(REPO / "workloads" / "pcie-rtx4090.yaml")  # nics: per_server
    info = RankInfo(plan)
    assert channels_for(info, range(16), 0) == 1


def test_generated_dp_sync_uses_every_nic_of_both_servers():
    """Four TP-4 replicas on 2 x 8 GPUs: 4 DP rings of 2 members per server. ``auto`` sends DP
    traffic out of all 16 NICs (``channels: 1``: 8 of them) with the same bytes in total."""
    reps = [[("h100", d, d + 4, 0, 4)] for d in (0, 4, 8, 12)]
    base = make_plan(reps)
    used = {}
    total = {}
    for ch in (1, 0):
        plan = replace(base, collectives=replace(
            base.collectives, channels=ch, algorithm=CollectiveAlgorithms("ring", "ring", "ring")))
        trace = generate(plan)
        f = trace.flows()
        dp = f[(f["phase"] == PHASE_INDEX["dp"])]
        info = RankInfo(plan)
        cross = dp[info.server[dp["rank"].to_numpy()] != info.server[dp["dst"].to_numpy()]]
        used[ch] = sorted({int(info.nic[r]) for r in cross["rank"]})
        total[ch] = int(dp["bytes"].sum())
        coll = trace.collectives
        assert set(coll["channels"][coll["phase"] == PHASE_INDEX["dp"]]) == {{1: 1, 0: 2}[ch]}
    assert len(used[1]) == 8 and used[0] == list(range(16))
    assert total[0] == total[1]


def test_channels_field_parses_auto_and_integers_and_round_trips():
    d = {
        "name": "p", "model": {"preset": "llama2-7b"},
        "training": {"global_batch": 1, "micro_batch": 1},
        "device_groups": {"g": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}},
        "replicas": [{"stages": [{"group": "g", "devices": [0, 8], "layers": [0, 32]}]}],
    }
    assert plan_from_dict(d, feasibility=False).collectives.channels == 0
    for value, want in (("auto", 0), (3, 3)):
        p = plan_from_dict({**d, "collectives": {"channels": value}}, feasibility=False)
        assert p.collectives.channels == want
        assert plan_to_dict(p)["collectives"]["channels"] == value
    for bad, msg in ((0, "expected 'auto' or a positive integer (got 0)"),
                     ("many", "expected 'auto' or a positive integer (got 'many')"),
                     (2000, "expected at most 1024")):
        with pytest.raises(PlanError, match="collectives.channels") as e:
            plan_from_dict({**d, "collectives": {"channels": bad}}, feasibility=False)
        assert msg in str(e.value)
