"""Background traffic: destinations, offered load on an idle fabric, errors, interference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import WORKLOADS

from xsim_adapters import api
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.jobs import run_jobs
from xsim_adapters.trace.schema import KIND_FLOW
from xsim_adapters.traffic import (
    destinations,
    generate_traffic,
    traffic_from_dict,
    traffic_summary,
)

BASE = {"traffic": {
    "name": "bg", "device_groups": {"bg": {"type": "H100-80GB", "nodes": 4, "gpus_per_node": 4}},
    "pattern": "permutation", "load": 0.5, "message_bytes": 4 << 20, "duration_ms": 2,
}}


def _spec(**kw):
    d = copy.deepcopy(BASE)
    d["traffic"].update(kw)
    return traffic_from_dict(d)


def test_permutation_is_a_cross_server_bijection_and_seeded():
    spec = _spec()
    perm = destinations(spec, 3)[:, 0]
    assert sorted(perm.tolist()) == list(range(16))  # every GPU receives from exactly one
    assert not (perm // 4 == np.arange(16) // 4).any()  # never to its own server
    assert (destinations(spec, 3) == perm[:, None]).all()  # one partner for the whole run
    assert np.array_equal(perm, destinations(_spec(), 1)[:, 0])
    assert not np.array_equal(perm, destinations(_spec(seed=1), 1)[:, 0])


def test_all_to_all_visits_every_other_gpu_once_per_cycle():
    d = destinations(_spec(pattern="all_to_all"), 15)
    for i in range(16):
        assert sorted(d[i].tolist()) == [j for j in range(16) if j != i]


def test_incast_groups_send_to_their_first_gpu():
    d = destinations(_spec(pattern="incast", fan_in=3), 2)[:, 0]
    assert d.tolist() == [-1, 0, 0, 0, -1, 4, 4, 4, -1, 8, 8, 8, -1, 12, 12, 12]


def test_offered_load_is_achieved_on_an_idle_fabric():
    """4 MiB at 400 Gb/s is 83,886 ns; at load 0.5 a sender starts one every 167,772 ns, so
    2 ms gives floor(2e6 / 167772) = 11 messages each, and alone on the fabric each message
    runs at line rate (plus the path's few us of latency)."""
    spec = _spec()
    trace = generate_traffic(spec, 2e6)
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    assert len(flows) == 16 * 11 and (flows["bytes"] == 4 << 20).all()
    plan = plan_from_dict({
        "name": "host", "model": {"preset": "llama2-7b", "seq_len": 512, "layers": 2},
        "training": {"global_batch": 1, "micro_batch": 1},
        "device_groups": {"bg": {"type": "H100-80GB", "nodes": 4, "gpus_per_node": 4}},
        "replicas": [{"stages": [{"group": "bg", "devices": [0, 1], "tp": 1,
                                  "layers": [0, 2]}]}],
    }, feasibility=False)
    tl = api.run(trace, "flow", api.build_topology(plan))
    s = traffic_summary(spec, trace, tl.frame)
    # each sender's span: 11 messages and 10 gaps; latency makes it a little longer
    msg_ns = (4 << 20) * 8 / 400
    span = 11 * msg_ns + 10 * msg_ns
    assert s["achieved_load"] == pytest.approx(11 * msg_ns / span, rel=0.02)
    assert s["messages"] == 176 and s["bytes"] == 176 * (4 << 20)


@pytest.mark.parametrize("kw, where, what", [
    ({"pattern": "ring"}, "traffic.pattern", "expected one of permutation, all_to_all, incast"),
    ({"load": 0}, "traffic.load", "expected a number in (0, 1]"),
    ({"load": 1.5}, "traffic.load", "expected a number in (0, 1]"),
    ({"message_bytes": -1}, "traffic.message_bytes", "expected a positive integer"),
    ({"fan_in": 16, "pattern": "incast"}, "traffic.fan_in", "fewer senders than the 16"),
    ({"colour": "red"}, "traffic.colour", "unknown key"),
])
def test_errors_name_the_place(kw, where, what):
    with pytest.raises(PlanError) as e:
        _spec(**kw)
    assert where in str(e.value) and what in str(e.value)


def test_permutation_needs_no_server_over_half():
    d = copy.deepcopy(BASE)
    d["traffic"]["device_groups"] = {"a": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8},
                                     "b": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 4}}
    with pytest.raises(PlanError, match="no server may hold more than half of the 12 GPUs"):
        destinations(traffic_from_dict(d), 1)


def test_traffic_slows_a_job_only_where_they_share_links():
    job = plan_from_dict({
        "name": "a", "model": {"preset": "llama2-7b", "seq_len": 2048, "layers": 4},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": {"h": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 8}},
        "network": {"scale_out": {"topology": "leaf_spine", "nodes_per_leaf": 2, "spines": 1,
                                  "oversubscription": 2, "link_gbps": 3200}},
        "replicas": [{"stages": [{"group": "h", "devices": [i, i + 8], "tp": 8,
                                  "layers": [0, 4]}]} for i in (0, 8)],
    })
    bg = traffic_from_dict({"traffic": {
        "name": "bg", "device_groups": {"bg": {"type": "H100-80GB", "nodes": 2,
                                               "gpus_per_node": 8}},
        "pattern": "permutation", "load": 0.8, "message_bytes": 16 << 20}})
    packed = run_jobs([job, bg]).table()  # the traffic on its own leaf
    assert packed.loc[0, "slowdown_pct"] == pytest.approx(0, abs=1e-6)
    assert packed.loc[1, "achieved_load"] == pytest.approx(0.8, rel=0.02)
    spread = run_jobs([job, bg], placement="spread").table()  # both on both leaves
    assert spread.loc[0, "slowdown_pct"] > 5
    assert spread.loc[1, "achieved_load"] < 0.8


def test_shipped_traffic_file_loads():

    from xsim_adapters.plan.model import Plan
    from xsim_adapters.traffic import TrafficSpec, load_job, load_traffic

    path = WORKLOADS / "traffic" / "tenants-permutation.yaml"
    assert isinstance(load_job(path), TrafficSpec)
    spec = load_traffic(path)
    assert spec.num_ranks == 32 and spec.pattern == "permutation" and spec.duration_ms is None
    assert isinstance(load_job(path.parents[1] / "uneven-layers.yaml"), Plan)
