"""Hand-built plans and traces for the topology and flow-backend tests (no loader needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from xsim_adapters.plan.model import (
    CollectivesSpec,
    DeviceGroup,
    DeviceType,
    ExplicitLink,
    LinkEvent,
    ModelSpec,
    NetworkSpec,
    Plan,
    Replica,
    ScaleOut,
    ScaleUp,
    Stage,
    TrainingSpec,
)
from xsim_adapters.trace.schema import (
    COLLECTIVE_COLUMNS,
    DEP_COLUMNS,
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    OP_COLUMNS,
    PHASE_INDEX,
    Trace,
)

H100 = DeviceType("H100", 989.0, 80.0, 3350.0, scaleup_GBps=450.0, nic_gbps=400.0)
A100 = DeviceType("A100", 312.0, 80.0, 2039.0, scaleup_GBps=300.0, nic_gbps=200.0)


def make_plan(
    groups: list[tuple[str, str, int, int]],
    scale_out: ScaleOut | None = None,
    links: tuple[ExplicitLink, ...] = (),
    events: tuple[LinkEvent, ...] = (),
    scale_up_latency_us: float = 0.5,
) -> Plan:
    """A valid-looking plan over ``groups`` = [(name, type, nodes, gpus_per_node)].

    The replicas are a placeholder (one stage per group); the topology ignores them.
    """
    types = {"H100": H100, "A100": A100}
    device_groups = tuple(DeviceGroup(n, t, nodes, gpn) for n, t, nodes, gpn in groups)
    replicas = tuple(
        Replica(stages=(Stage(g.name, (0, g.gpus_per_node), g.gpus_per_node, (0, 2)),),
                micro_batches=1)
        for g in device_groups
    )
    return Plan(
        name="test",
        model=ModelSpec("tiny", 2, 64, 256, 4, 4, 128, 1000),
        training=TrainingSpec(global_batch=len(replicas), micro_batch=1),
        device_types={t: types[t] for _, t, _, _ in groups},
        device_groups=device_groups,
        network=NetworkSpec(
            scale_out=scale_out or ScaleOut(),
            scale_up=ScaleUp(latency_us=scale_up_latency_us),
            links=links,
            events=events,
        ),
        replicas=replicas,
        collectives=CollectivesSpec(),
    )


class TraceBuilder:
    """Builds a Trace op by op; op ids are dense in creation order."""

    def __init__(self, num_ranks: int) -> None:
        self.rows: list[dict] = []
        self.edges: list[tuple[int, int]] = []
        self.num_ranks = num_ranks

    def _add(self, kind: int, rank: int, phase: str, **kw: int) -> int:
        op = len(self.rows)
        row = {c: -1 for c in OP_COLUMNS}
        row.update(op_id=op, kind=kind, rank=rank, bytes=0, duration_ns=0, flops=0.0,
                   phase=PHASE_INDEX[phase])
        row.update(kw)
        self.rows.append(row)
        return op

    def compute(self, rank: int, duration_ns: int, phase: str = "fwd") -> int:
        return self._add(KIND_COMPUTE, rank, phase, duration_ns=duration_ns)

    def flow(self, src: int, dst: int, nbytes: int, phase: str = "dp", **kw: int) -> int:
        return self._add(KIND_FLOW, src, phase, dst=dst, bytes=nbytes, **kw)

    def barrier(self, rank: int = -1, phase: str = "dp") -> int:
        return self._add(KIND_BARRIER, rank, phase)

    def dep(self, pred: int, succ: int) -> None:
        self.edges.append((pred, succ))

    def build(self) -> Trace:
        ops = pd.DataFrame(self.rows, columns=list(OP_COLUMNS))
        ops = ops.astype(OP_COLUMNS)
        ops.loc[ops["kind"] != KIND_FLOW, "dst"] = -1
        deps = pd.DataFrame(self.edges, columns=["pred", "succ"]).astype(DEP_COLUMNS)
        coll = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLLECTIVE_COLUMNS.items()})
        manifest = {
            "schema_version": 1,
            "ranks": [{"rank": r} for r in range(self.num_ranks)],
            "num_ops": len(ops),
        }
        return Trace(ops=ops, deps=deps, collectives=coll, manifest=manifest)


def ring_allreduce(tb: TraceBuilder, ranks: list[int], size_bytes: int) -> tuple[int, int]:
    """Hand-lowered ring all-reduce: 2(n-1) steps of S/n bytes, rank i -> rank i+1.

    Step k's flow out of rank i waits for step k-1's flow into rank i (the chunk it forwards)
    and for rank i's own step k-1 send (one send at a time). Returns (start, end) barriers.
    """
    n = len(ranks)
    chunk = size_bytes // n
    start = tb.barrier()
    end = tb.barrier()
    recv = [start] * n  # recv[i]: the last flow into rank i
    sent = [start] * n  # sent[i]: rank i's last send
    for step in range(2 * (n - 1)):
        cur = []
        for i in range(n):
            f = tb.flow(ranks[i], ranks[(i + 1) % n], chunk, step=step, collective=0)
            tb.dep(recv[i], f)
            if sent[i] != recv[i]:
                tb.dep(sent[i], f)
            cur.append(f)
        sent = cur
        recv = [cur[(i - 1) % n] for i in range(n)]
    for f in recv:
        tb.dep(f, end)
    return start, end


def uniform_links(topo, gbps: float) -> None:
    """Set every link of ``topo`` to ``gbps`` (in place)."""
    topo.links["gbps"] = np.float64(gbps)
