"""device_groups.<g>.nic_gbps: a per-group scale-out NIC speed (same GPU type, other wiring)."""

from __future__ import annotations

import pytest

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.topology import build_topology
from xsim_adapters.workload.comm.rings import RankInfo


def _plan(fast: dict) -> dict:
    return {
        "name": "groups-nic",
        "model": {"preset": "llama2-7b", "layers": 4},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": {"fast": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 2, **fast},
                          "slow": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 2,
                                   "nic_gbps": 100}},
        "replicas": [{"stages": [{"group": "fast", "devices": [0, 2], "layers": [0, 4]}]},
                     {"stages": [{"group": "slow", "devices": [0, 2], "layers": [0, 4]}]}],
    }


def test_group_nic_speed_sets_the_nic_links_and_the_ring_bandwidth() -> None:
    plan = plan_from_dict(_plan({}))
    topo = build_topology(plan)
    links = topo.links[topo.links["tier"] == "nic"]
    by_gpu = {int(r.src): r.gbps for r in links.itertuples() if r.src < 4}
    assert by_gpu == {0: 400.0, 1: 400.0, 2: 100.0, 3: 100.0}  # type default, then override
    info = RankInfo(plan)
    assert info.link_GBps(0, 2) == 100.0 / 8
    assert plan_from_dict(plan_to_dict(plan)) == plan  # round trip keeps it


def test_group_nic_speed_must_be_positive() -> None:
    with pytest.raises(PlanError, match=r"device_groups\.fast\.nic_gbps"):
        plan_from_dict(_plan({"nic_gbps": 0}))
