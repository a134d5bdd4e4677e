"""Small plans built straight from the plan dataclasses, and DAG checks, for the generator tests."""

from __future__ import annotations

import numpy as np

from xsim_adapters.plan.model import (
    CollectivesSpec,
    DeviceGroup,
    DeviceType,
    ModelSpec,
    NetworkSpec,
    Plan,
    Replica,
    Stage,
    TrainingSpec,
)
from xsim_adapters.trace.schema import Trace

H100 = DeviceType("H100", 989.0, 80.0, 3350.0, 450.0, 400.0, efficiency=0.5)
A100 = DeviceType("A100", 312.0, 80.0, 2039.0, 300.0, 200.0, efficiency=0.6)
TINY = ModelSpec(
    "tiny", layers=4, hidden=256, ffn_hidden=688, heads=8, kv_heads=4, seq_len=128, vocab=1024
)


def make_plan(
    replicas: list[list[tuple[str, int, int, int, int]]],
    groups: list[tuple[str, DeviceType, int, int]] | None = None,
    model: ModelSpec = TINY,
    micro_batches: list[int] | None = None,
    training: dict | None = None,
    collectives: dict | None = None,
) -> Plan:
    """``replicas``: per replica a list of stages (group, dev_start, dev_stop, layer_a, layer_b).

    ``groups``: (name, device type, nodes, gpus_per_node); default one H100 group of 2x8.
    """
    groups = groups or [("h100", H100, 2, 8)]
    mbs = micro_batches or [4] * len(replicas)
    reps = tuple(
        Replica(
            stages=tuple(Stage(g, (d0, d1), d1 - d0, (a, b)) for g, d0, d1, a, b in rep),
            micro_batches=m,
        )
        for rep, m in zip(replicas, mbs, strict=True)
    )
    tr = dict(global_batch=sum(mbs), micro_batch=1)
    tr.update(training or {})
    return Plan(
        name="test",
        model=model,
        training=TrainingSpec(**tr),
        device_types={dt.name: dt for _, dt, _, _ in groups},
        device_groups=tuple(DeviceGroup(n, dt.name, nodes, g) for n, dt, nodes, g in groups),
        network=NetworkSpec(),
        replicas=reps,
        collectives=CollectivesSpec(**(collectives or {})),
    )


def topo_order(trace: Trace) -> tuple[np.ndarray, int]:
    """(ops in a topological order, number of roots); the order is shorter than num_ops iff the
    dependency graph has a cycle (Kahn's algorithm, level by level)."""
    n = trace.num_ops
    p = trace.deps["pred"].to_numpy()
    s = trace.deps["succ"].to_numpy()
    indeg = np.bincount(s, minlength=n)
    order = np.argsort(p, kind="stable")
    ss = s[order]
    starts = np.searchsorted(p[order], np.arange(n + 1))
    front = np.flatnonzero(indeg == 0)
    roots = len(front)
    out = [front]
    while len(front):
        lens = starts[front + 1] - starts[front]
        idx = np.repeat(starts[front] - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
        nxt = ss[idx]
        np.subtract.at(indeg, nxt, 1)
        front = np.unique(nxt[indeg[nxt] == 0])
        out.append(front)
    return np.concatenate(out), roots
