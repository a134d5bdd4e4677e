"""The rank placement order as a search axis: ``tp-dp-pp`` candidates are the plan shorthand's
Megatron order device for device, twins of ``tp-pp-dp`` where the orders place alike, bounded
below their simulated time, and pruned by memory as ``tp-pp-dp`` is."""

from __future__ import annotations

import pytest
import yaml

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.search import spec_from_dict
from xsim_adapters.search.bnb import STATUS_DOMINATED, enumerate_space, twin
from xsim_adapters.search.bound import Analyzer
from xsim_adapters.search.evaluate import run_candidate
from xsim_adapters.search.space import plan_dict

# Two servers of 4 GPUs, TP 2 x PP 2: a server holds one replica (tp-pp-dp: DP crosses the
# servers) or one stage of both replicas (tp-dp-pp: DP on NVLink, PP across).
SPEC = """
name: order
model: {layers: 8, hidden: 256, ffn_hidden: 704, heads: 4, kv_heads: 4, seq_len: 128,
        vocab: 512}
training: {global_batch: 8}
device_groups:
  h: {type: H100-80GB, nodes: 2, gpus_per_node: 4}
network:
  scale_out: {topology: leaf_spine, link_gbps: 100, latency_us: 1.0}
collectives: {granularity: chunked, chunks: 1}
space: {tp: [2], pp_min: 1, pp_max: 2, order: [tp-pp-dp, tp-dp-pp], idle_groups: false}
"""


def _entries():
    spec = spec_from_dict(yaml.safe_load(SPEC))
    an = Analyzer(spec)
    return spec, an, enumerate_space(spec, an)


def _devices(plan):
    return [[(s["group"], s["devices"]) for s in r["stages"]] for r in plan["replicas"]]


def test_tp_dp_pp_candidates_are_the_uniform_shorthands_megatron_order():
    spec, _, entries = _entries()
    by = {(e.cand.choice.order, e.cand.parts[0].pp, e.cand.parts[0].count): e for e in entries}
    e = by[("tp-dp-pp", (2,), 2)]
    assert e.status == ""
    got = plan_dict(spec, e.cand)
    assert _devices(got) == [[("h", [0, 2]), ("h", [4, 6])], [("h", [2, 4]), ("h", [6, 8])]]
    short = dict(got, replicas={"uniform": {"group": "h", "tp": 2, "pp": 2, "dp": 2,
                                            "order": "tp-dp-pp"}})
    expanded = plan_from_dict(short)
    assert [[(s.group, list(s.devices)) for s in r.stages] for r in expanded.replicas] \
        == _devices(got)
    # tp-pp-dp: each replica on one server
    assert _devices(plan_dict(spec, by[("tp-pp-dp", (2,), 2)].cand)) == [
        [("h", [0, 2]), ("h", [2, 4])], [("h", [4, 6]), ("h", [6, 8])]]
    assert e.cand.key.split(" | ")[0].endswith("tp-dp-pp balanced lcm")


def test_order_twins_are_dominated_and_memory_is_order_blind():
    spec, _, entries = _entries()
    by = {(e.cand.choice.order, e.cand.parts, e.cand.choice.micro_batch): e for e in entries}
    same = 0
    for (order, parts, mb), e in by.items():
        if order != "tp-dp-pp":
            continue
        if all(p.count == 1 or max(p.pp) == 1 for p in parts):
            assert e.status == STATUS_DOMINATED and twin(spec, e.cand) is not None
            same += 1
        else:
            other = by[("tp-pp-dp", parts, mb)]
            assert e.status == other.status and e.headroom_GB == other.headroom_GB
    assert same > 0


def test_order_moves_the_dp_sync_and_the_bound_stays_below_the_simulated_time():
    """tp-dp-pp keeps the DP all-reduce on NVLink and sends the pipeline across the 100 Gb/s
    NICs: the bound and the simulation both see the difference; bound <= simulated."""
    spec, an, entries = _entries()
    got = {}
    for e in entries:
        c = e.cand
        if e.status == "" and c.parts[0].pp == (2,) and c.parts[0].count == 2:
            lb = an.lower_bound_ns(c)
            row = run_candidate({"plan": plan_dict(spec, c)})
            assert row["error"] == ""
            assert lb <= row["iteration_time_ns"]
            got[c.choice.order] = (lb, row["iteration_time_ns"])
    assert set(got) == {"tp-pp-dp", "tp-dp-pp"}
    # measured: bound 3,541,564 / 3,527,539 ns, simulated 3,702,777 / 3,647,613 ns
    assert got["tp-dp-pp"][1] < got["tp-pp-dp"][1]
    assert got["tp-dp-pp"][0] < got["tp-pp-dp"][0]


def test_order_errors_name_the_yaml_path():
    raw = yaml.safe_load(SPEC)
    raw["space"]["order"] = ["tp-pp-dp", "dp-tp-pp"]
    with pytest.raises(PlanError) as err:
        spec_from_dict(raw)
    assert "space.order[1]: expected one of tp-pp-dp, tp-dp-pp (got 'dp-tp-pp')" in str(err.value)
