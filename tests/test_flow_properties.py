"""Invariants of the flow backend on random DAGs over a shared, oversubscribed fabric."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.topo import TraceBuilder, make_plan

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.backends.flow.native import native_status
from xsim_adapters.plan.model import ScaleOut
from xsim_adapters.topology import build_topology

TOPO = build_topology(
    make_plan([("h", "H100", 4, 4), ("a", "A100", 4, 4)],
              ScaleOut(nodes_per_leaf=2, oversubscription=4.0, spines=2))
)


def random_trace(seed: int):
    rng = np.random.default_rng(seed)
    n_ops = 300
    tb = TraceBuilder(32)
    for _ in range(n_ops):
        if rng.random() < 0.3:
            tb.compute(int(rng.integers(0, 32)), int(rng.integers(0, 50_000)))
        elif rng.random() < 0.05:
            tb.barrier()
        else:
            tb.flow(int(rng.integers(0, 32)), int(rng.integers(0, 32)),
                    int(rng.integers(0, 4_000_000)))
    for succ in range(1, n_ops):  # edges only from lower to higher ids: a DAG
        for pred in rng.choice(succ, size=min(succ, int(rng.integers(0, 3))), replace=False):
            tb.dep(int(pred), succ)
    return tb.build()


@pytest.mark.parametrize("engine", ["python", "native"])
@pytest.mark.parametrize("seed", range(6))
def test_random_dags_respect_edges_paths_and_capacities(seed, engine):
    if engine == "native" and not native_status()[0]:
        pytest.skip(native_status()[1])
    trace = random_trace(seed)
    tl = FlowBackend().run(trace, TOPO, {"engine": engine})
    start = tl.frame["start_ns"].to_numpy()
    end = tl.frame["end_ns"].to_numpy()
    ops = trace.ops
    pred = trace.deps["pred"].to_numpy()
    succ = trace.deps["succ"].to_numpy()
    # an op starts exactly when its last predecessor ends (or at 0)
    last = np.zeros(len(ops))
    np.maximum.at(last, succ, end[pred])
    np.testing.assert_allclose(start, last, rtol=0, atol=1e-6)
    flows = np.flatnonzero(ops["kind"].to_numpy() == 1)
    off, links = TOPO.paths_for(ops["rank"].to_numpy()[flows], ops["dst"].to_numpy()[flows],
                                flows)
    gbps = TOPO.links["gbps"].to_numpy()
    lat = TOPO.links["latency_ns"].to_numpy()
    nbytes = ops["bytes"].to_numpy()
    load: dict[int, list[tuple[float, float, int]]] = {}
    for i, f in enumerate(flows):
        path = links[off[i]:off[i + 1]]
        if len(path) == 0:
            assert end[f] == start[f]
            continue
        latency = lat[path].sum()
        floor = latency + nbytes[f] / (gbps[path].min() / 8)
        assert end[f] - start[f] >= floor * (1 - 1e-9)
        for lk in path:  # transmission window: [start, end - latency]
            load.setdefault(int(lk), []).append((start[f], end[f] - latency, int(nbytes[f])))
    # no link carries more than capacity x the time its flows were transmitting
    for lk, windows in load.items():
        lo = min(w[0] for w in windows)
        hi = max(w[1] for w in windows)
        total = sum(w[2] for w in windows)
        assert total <= gbps[lk] / 8 * (hi - lo) * (1 + 1e-9) + 1e-6
