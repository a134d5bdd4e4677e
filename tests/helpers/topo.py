"""Hand-built plans and traces for the topology and flow-backend tests (no loader needed)."""

from __future__ import annotations

import numpy as np

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
from xsim_adapters.testing.handmade import TraceBuilder, ring_all_reduce

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


def ring_allreduce(tb: TraceBuilder, ranks: list[int], size_bytes: int) -> tuple[int, int]:
    """Ring all-reduce between two barriers (collective 0): returns (start, end) barrier ids."""
    start = tb.barrier()
    last = ring_all_reduce(tb, ranks, size_bytes, ready=start, collective=0)
    return start, tb.barrier(deps=last)


def uniform_links(topo, gbps: float) -> None:
    """Set every link of ``topo`` to ``gbps`` (in place)."""
    topo.links["gbps"] = np.float64(gbps)
