"""Chakra ET both ways on the shipped plans (issue 31): the export read with Chakra's own reader
(mlc-chakra's protolib.decodeMessage), the import (``xsim import``) and the round trip
export -> import -> flow backend, and ETs written by Chakra's own generator and text converter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import WORKLOADS, plan_params

from xsim_adapters import api, cli
from xsim_adapters.errors import TraceError, XsimError
from xsim_adapters.feasibility import load_plan
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="needs mlc-chakra (extra [chakra])")
from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402
from helpers.chakra import node_attrs as _attrs  # noqa: E402
from helpers.chakra import read_et as _read  # noqa: E402

from xsim_adapters.interop.chakra_import import import_chakra_et  # noqa: E402
from xsim_adapters.trace.export_chakra import COLL_TYPES, export_chakra  # noqa: E402


def _gpus(path: Path) -> int:
    groups = yaml.safe_load(path.read_text())["device_groups"]
    groups = groups.values() if isinstance(groups, dict) else groups
    return sum(g.get("nodes", 1) * g.get("gpus_per_node", 1) for g in groups)


SMALL = [p for p in sorted(WORKLOADS.glob("*.yaml")) if _gpus(p) <= 16]
# more than 100k ops: tens of seconds per export, import or replay on 2 cores
HEAVY = frozenset({"hetero-dp-h100-a100", "moe-hetero-h100-a100-by-speed",
                   "hetero-pipeline-reshard"})


def test_the_small_plans_are_the_ten_shipped_ones_of_at_most_16_gpus():
    assert [p.stem for p in SMALL] == [
        "congested-incast-slow-nic", "dgx1-v100-cube-mesh", "hetero-dp-h100-a100",
        "hetero-pipeline-reshard", "homogeneous-h100", "moe-hetero-h100-a100-by-speed",
        "pcie-rtx4090", "two-site-measured", "uneven-layers", "whatif-slow-gpu"]


def _expected_bytes(trace, mode: str) -> tuple[Counter, Counter, Counter]:
    """Per rank: bytes sent and received as messages, and collective payload bytes."""
    o = trace.ops
    flows = o[o["kind"] == KIND_FLOW]
    kinds = trace.collectives.set_index("collective")["kind"]
    coll: Counter = Counter()
    if mode == "coll":
        ring = flows["collective"].isin([c for c, k in kinds.items() if k in COLL_TYPES])
        nbytes = trace.collectives.set_index("collective")["bytes"]
        for c, f in flows[ring].groupby("collective"):
            for r in set(f["rank"]) | set(f["dst"]):
                coll[int(r)] += int(nbytes[c])
        flows = flows[~ring]
    sent = Counter({int(r): int(b) for r, b in flows.groupby("rank")["bytes"].sum().items()})
    recv = Counter({int(r): int(b) for r, b in flows.groupby("dst")["bytes"].sum().items()})
    return sent, recv, coll


@pytest.mark.parametrize("mode", ["coll", "p2p"])
@pytest.mark.parametrize("path", plan_params(SMALL, HEAVY), ids=[p.stem for p in SMALL])
def test_shipped_plan_exports_as_astra_sim_reads_it(path, mode, tmp_path):
    """One non-empty file per rank, ids in a topological order (acyclic), no 0-byte
    communication node, and every byte of the trace on the rank that moves it."""
    plan = load_plan(path)
    trace = api.generate(plan)
    paths = export_chakra(trace, tmp_path, collectives=mode)
    assert [p.name for p in paths] == [f"et.{r}.et" for r in range(plan.num_ranks)]
    groups = json.loads((tmp_path / "comm_groups.json").read_text())
    sent: Counter = Counter()
    recv: Counter = Counter()
    coll: Counter = Counter()
    notes = Counter()
    for r, p in enumerate(paths):
        _, nodes = _read(p)
        assert nodes, f"rank {r}: no node"
        for i, n in enumerate(nodes):
            assert n.id == i and all(d < i for d in n.data_deps)
            if n.type == pb.COMP_NODE:
                continue
            a = _attrs(n)
            assert a["comm_size"] >= 1, f"rank {r} node {i}: {a['comm_size']} bytes"
            if a.get("notification"):
                assert a["comm_size"] == 1
                notes[n.type] += 1
            elif n.type == pb.COMM_SEND_NODE:
                sent[r] += a["comm_size"]
            elif n.type == pb.COMM_RECV_NODE:
                recv[r] += a["comm_size"]
            else:
                assert mode == "coll" and r in groups[a["pg_name"]]
                coll[r] += a["comm_size"]
    want = _expected_bytes(trace, mode)
    assert (sent, recv, coll) == want
    assert sum(sent.values()) == sum(recv.values()) == sum(want[0].values())
    assert notes[pb.COMM_SEND_NODE] == notes[pb.COMM_RECV_NODE]


def _iteration_ns(trace, plan) -> int:
    timeline = api.run(trace, topology=api.build_topology(plan))
    return int(api.metrics(trace, timeline).summary["iteration_time_ns"])


# export -> import -> flow backend against the plan's own trace, measured 2026-12-04: coll
# gives the same iteration time on every plan but dgx1-v100-cube-mesh (1.5 us of 449 ms).
@pytest.mark.parametrize("mode", ["coll", "p2p"])
@pytest.mark.parametrize("path", plan_params(SMALL, HEAVY), ids=[p.stem for p in SMALL])
def test_round_trip_keeps_the_iteration_time(path, mode, tmp_path):
    plan = load_plan(path)
    trace = api.generate(plan)
    export_chakra(trace, tmp_path, collectives=mode)
    back = import_chakra_et(tmp_path, plan)
    o, b = trace.ops, back.ops
    # every compute op and every byte comes back (p2p: flows as they were; coll: the ring
    # collectives lowered again by the generator's own lowering)
    assert (b["kind"] == KIND_COMPUTE).sum() == (o["kind"] == KIND_COMPUTE).sum()
    assert b.loc[b["kind"] == KIND_COMPUTE, "duration_ns"].sum() == \
        o.loc[o["kind"] == KIND_COMPUTE, "duration_ns"].sum()
    assert b.loc[b["kind"] == KIND_FLOW, "bytes"].sum() == o.loc[o["kind"] == KIND_FLOW,
                                                                 "bytes"].sum()
    want, got = _iteration_ns(trace, plan), _iteration_ns(back, plan)
    assert abs(got - want) <= 0.01 * want, (want, got)


def test_import_cli_writes_a_runnable_trace(tmp_path, capsys):
    plan = WORKLOADS / "whatif-slow-gpu.yaml"
    et = tmp_path / "et"
    assert cli.main(["export", str(plan), "--format", "chakra", "--npus", "10",
                     "-o", str(et)]) == 0
    assert len(list(et.glob("et.*.et"))) == 10  # 8 GPUs padded to 10 NPUs
    _, nodes = _read(et / "et.9.et")
    assert [(n.type, _attrs(n)["op_kind"]) for n in nodes] == [(pb.COMP_NODE, "idle")]
    out = tmp_path / "trace"
    assert cli.main(["import", str(et), "--plan", str(plan), "-o", str(out)]) == 0
    assert "imported from Chakra ET" in capsys.readouterr().out
    trace, p = api.load_trace_and_plan(out)
    assert trace.manifest["generator"]["source"] == {"format": "chakra", "prefix": "et",
                                                     "files": 10}
    assert _iteration_ns(trace, p) == _iteration_ns(api.generate(p), p)


def test_npus_below_the_plan_is_refused(tmp_path, capsys):
    plan = WORKLOADS / "whatif-slow-gpu.yaml"
    assert cli.main(["export", str(plan), "--format", "chakra", "--npus", "4",
                     "-o", str(tmp_path / "et")]) != 0
    err = capsys.readouterr().err.strip()
    assert err == "xsim: error: npus: must be at least the trace's 8 ranks (got 4)"


# ---- ETs from Chakra's own tools ---------------------------------------------------------

def _chakra_tool(args: list[str], cwd: Path) -> None:
    code = ("import sys; from chakra.src.{} import main; sys.argv = sys.argv[:1] + sys.argv[2:];"
            " main()")
    subprocess.run([sys.executable, "-c", code.format(args[0]), *args], cwd=cwd, check=True,
                   capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """Chakra's ``chakra_generator`` for 8 NPUs, each micro-benchmark in its own directory."""
    root = tmp_path_factory.mktemp("chakra-gen")
    _chakra_tool(["generator.generator", "--num_npus", "8", "--default_runtime", "5",
                  "--default_comm_size", "65536", "--default_tensor_size", "1048576"], root)
    for f in root.glob("*.et"):
        name = f.name.rsplit(".", 2)[0]
        (root / name).mkdir(exist_ok=True)
        f.rename(root / name / f.name)
    return root


@pytest.fixture(scope="module")
def plan8():
    return load_plan(WORKLOADS / "whatif-slow-gpu.yaml")  # 8 GPUs: 2 servers of 4 (L40S...)


def test_generator_compute_nodes(generated, plan8):
    for name, ns in (("one_comp_node", 5000), ("two_comp_nodes_independent", 5000),
                     ("two_comp_nodes_dependent", 10000)):
        trace = import_chakra_et(generated / name, plan8)
        assert (trace.ops["kind"] == KIND_COMPUTE).all()
        assert _iteration_ns(trace, plan8) == ns, name


@pytest.mark.parametrize("name,kind", [("ALL_REDUCE", "all_reduce"),
                                       ("ALL_GATHER", "all_gather"),
                                       ("REDUCE_SCATTER", "reduce_scatter")])
def test_generator_collectives_are_lowered_by_our_lowering(generated, plan8, name, kind):
    """No pg_name: the world group; the collective is lowered as the generator lowers one of
    65,536 bytes over the 8 ranks (its bytes: a ring moves (n-1)/n S per member per pass)."""
    trace = import_chakra_et(generated / name, plan8)
    (row,) = trace.collectives.itertuples(index=False)
    assert (row.kind, row.bytes) == (kind, 65536)
    assert sorted(map(int, row.ranks.split(","))) == list(range(8))
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    passes = 2 if kind == "all_reduce" else 1
    if row.algorithm.startswith("ring"):
        assert flows["bytes"].sum() == passes * 7 * 65536
    assert _iteration_ns(trace, plan8) > 0


def test_generator_memory_nodes_take_their_bytes_at_hbm_speed(generated, plan8):
    hbm = plan8.device_types[plan8.device_groups[0].type].hbm_GBps
    for name in ("one_remote_mem_load_node", "one_remote_mem_store_node"):
        trace = import_chakra_et(generated / name, plan8)
        assert trace.ops["duration_ns"].tolist() == [round(1048576 / hbm)] * 8


@pytest.mark.parametrize("name,message", [
    ("ALL_TO_ALL", "('ALL_TO_ALL'): collective ALL_TO_ALL is not supported"),
    ("BROADCAST", "collective BROADCAST is not supported"),
    ("one_metadata_node_all_types", "node type METADATA_NODE is not supported"),
    ("one_comm_send_node", "COMM_SEND_NODE without comm_dst"),
    ("one_comm_recv_node", "COMM_RECV_NODE without comm_src"),
])
def test_unsupported_generator_ets_are_refused_naming_the_node(generated, plan8, name, message):
    with pytest.raises(TraceError) as e:
        import_chakra_et(generated / name, plan8)
    text = str(e.value)
    assert "\n" not in text and message in text and f"{name}.0.et" in text


def test_text_converter_data_parallel_et(tmp_path, plan8):
    """Chakra's text converter (ASTRA-sim's text workload format), DATA parallel, 2 layers:
    per layer forward, input- and weight-gradient compute (us) and a weight-gradient
    all-reduce; the imported trace holds exactly those."""
    text = tmp_path / "dp.txt"
    text.write_text("DATA\n2\n"
                    "l0 -1 100 NONE 0 200 NONE 0 300 ALLREDUCE 4194304 10\n"
                    "l1 -1 150 NONE 0 250 NONE 0 350 ALLREDUCE 8388608 10\n")
    et = tmp_path / "et"
    et.mkdir()
    _chakra_tool(["converter.converter", "Text", "--input", str(text), "--output",
                  str(et / "dp"), "--num-npus", "8", "--num-passes", "1"], tmp_path)
    trace = import_chakra_et(et, plan8)
    comp = trace.ops[trace.ops["kind"] == KIND_COMPUTE]
    # per rank: fwd 100 + 150, bwd_wg 350 + 300, bwd_ig of l1 only (the converter skips l0's)
    assert sorted(comp.loc[comp["rank"] == 0, "duration_ns"].tolist()) == [
        100_000, 150_000, 250_000, 300_000, 350_000]
    assert sorted(trace.collectives["bytes"].tolist()) == [4194304, 8388608]
    assert _iteration_ns(trace, plan8) >= 1_150_000  # the compute chain alone


# ---- refusals ------------------------------------------------------------------------------

def _write_et(directory: Path, nodes_per_rank: list[list]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r, nodes in enumerate(nodes_per_rank):
        with open(directory / f"et.{r}.et", "wb") as fh:
            encodeMessage(fh, pb.GlobalMetadata(version="0.0.4"))
            for n in nodes:
                encodeMessage(fh, n)


def _comm(i, typ, **attrs):
    n = pb.Node(id=i, name=f"n{i}", type=typ)
    for k, v in attrs.items():
        n.attr.append(pb.AttributeProto(name=k, **({"int32_val": v} if k != "comm_size"
                                                   else {"int64_val": v})))
    return n


def test_unmatched_and_dangling_nodes_are_refused(tmp_path, plan8):
    comp = pb.Node(id=0, name="c", type=pb.COMP_NODE, duration_micros=3)
    idle = [[comp]] * 6
    send = _comm(1, pb.COMM_SEND_NODE, comm_dst=1, comm_size=64, comm_tag=7)
    recv = _comm(1, pb.COMM_RECV_NODE, comm_src=0, comm_size=32, comm_tag=7)
    _write_et(tmp_path / "a", [[comp, send], [comp, recv], *idle])
    with pytest.raises(TraceError, match=r"et\.1\.et: node 1 \('n1'\): receives 32 bytes, its "
                                         r"send .*et\.0\.et: node 1 \('n1'\) sends 64"):
        import_chakra_et(tmp_path / "a", plan8)
    _write_et(tmp_path / "b", [[comp, send], [comp], *idle])
    with pytest.raises(TraceError, match=r"et\.0\.et: node 1 \('n1'\): 1 send\(s\) but 0 "
                                         r"receive\(s\) of tag 7 from rank 0 to rank 1"):
        import_chakra_et(tmp_path / "b", plan8)
    dangling = pb.Node(id=5, name="d", type=pb.COMP_NODE, data_deps=[9])
    _write_et(tmp_path / "c", [[comp, dangling], [comp], *idle])
    with pytest.raises(TraceError, match=r"node 5 \('d'\): depends on node 9, which is not"):
        import_chakra_et(tmp_path / "c", plan8)
    _write_et(tmp_path / "d", [[comp]] * 9)
    with pytest.raises(TraceError, match=r"et\.8\.et: node 0 \('c'\): rank 8 is beyond the "
                                         r"plan's 8 GPUs"):
        import_chakra_et(tmp_path / "d", plan8)


def test_import_of_what_is_not_an_et_directory(tmp_path, plan8):
    with pytest.raises(TraceError, match="not a directory of Chakra ET files"):
        import_chakra_et(tmp_path / "nope", plan8)
    (tmp_path / "x.0.et").write_bytes(b"")
    (tmp_path / "x.2.et").write_bytes(b"")
    with pytest.raises(TraceError, match=r"x\.1\.et is missing"):
        import_chakra_et(tmp_path, plan8)


def test_collective_of_a_group_missing_from_comm_groups(tmp_path, plan8):
    coll = pb.Node(id=0, name="ar", type=pb.COMM_COLL_NODE)
    coll.attr.extend([pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
                      pb.AttributeProto(name="comm_size", int64_val=1024),
                      pb.AttributeProto(name="pg_name", string_val="7")])
    _write_et(tmp_path, [[coll]] * 8)
    (tmp_path / "comm_groups.json").write_text('{"1": [0, 1]}')
    with pytest.raises(XsimError, match=r"node 0 \('ar'\): process group '7' is not in "
                                        r"comm_groups.json"):
        import_chakra_et(tmp_path, plan8)


def test_barrier_nodes_of_our_export_come_back_as_barriers(tmp_path, plan8):
    trace = api.generate(plan8)
    export_chakra(trace, tmp_path, collectives="p2p")
    back = import_chakra_et(tmp_path, plan8)
    # joins and start latencies (one per collective and member) are barriers, not compute
    assert (back.ops["kind"] == KIND_BARRIER).sum() >= (trace.ops["kind"] == KIND_BARRIER).sum()
    assert np.array_equal(np.sort(back.ops.loc[back.ops["kind"] == KIND_COMPUTE, "flops"]),
                          np.sort(trace.ops.loc[trace.ops["kind"] == KIND_COMPUTE, "flops"]))


def test_a_group_of_one_is_a_join_between_its_neighbours(tmp_path, plan8):
    """A collective over one rank moves nothing; what follows it still waits for what
    precedes it (3 us, then 4 us: 7 us)."""
    first = pb.Node(id=0, name="a", type=pb.COMP_NODE, duration_micros=3)
    coll = pb.Node(id=1, name="ar", type=pb.COMM_COLL_NODE, data_deps=[0])
    coll.attr.extend([pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
                      pb.AttributeProto(name="comm_size", int64_val=1024),
                      pb.AttributeProto(name="pg_name", string_val="solo")])
    last = pb.Node(id=2, name="b", type=pb.COMP_NODE, duration_micros=4, data_deps=[1])
    idle = pb.Node(id=0, name="i", type=pb.COMP_NODE)
    _write_et(tmp_path, [[first, coll, last]] + [[idle]] * 7)
    (tmp_path / "comm_groups.json").write_text('{"solo": [0]}')
    trace = import_chakra_et(tmp_path, plan8)
    assert _iteration_ns(trace, plan8) == 7000


def test_astra_configs_of_a_homogeneous_and_a_mixed_plan():
    from xsim_adapters.interop.astra_configs import astra_configs

    files, warnings = astra_configs(load_plan(WORKLOADS / "homogeneous-h100.yaml"))
    # 2 servers of 8 H100: NVLink 450 GB/s, a 400 Gb/s NIC per GPU (50 GB/s); 0.5 us scale-up,
    # two 1 us links GPU -> leaf -> GPU
    assert files["network.yml"] == ("topology: [ Switch, Switch ]\nnpus_count: [ 8, 2 ]\n"
                                    "bandwidth: [ 450, 50 ]  # GB/s\n"
                                    "latency: [ 500, 2000 ]  # ns\n")
    assert warnings == []
    system = json.loads(files["system.json"])
    assert system["all-reduce-implementation"] == ["ring", "ring"]
    assert system["local-mem-bw"] == load_plan(WORKLOADS / "homogeneous-h100.yaml") \
        .device_types["H100-80GB"].hbm_GBps
    _, warnings = astra_configs(load_plan(WORKLOADS / "hetero-dp-h100-a100.yaml"))
    assert warnings == [
        "device_types: scale-up 300-450 GB/s per GPU; written at the slowest, 300 GB/s",
        "device_groups: NIC share 25-50 GB/s per GPU (heterogeneous NICs); written at the "
        "slowest, 25 GB/s"]
