"""Coarsening: simulate one representative of each class of identical data-parallel replicas.

Replicas that run the same pipeline (device type, NIC, TP, layer split, micro-batches) from the
same place in the network do the same thing at the same time: by symmetry their compute, TP and
PP ops have the same times. A coarsened trace keeps every op of one *representative* replica per
class and, of every other (*mirrored*) replica, only its part of the data-parallel sync: every
flow of every DP ring is kept (so the DP collectives, their bytes and their contention on the
fabric are exact), a mirrored member starts its ring when its representative's matching rank is
ready, and the representative's optimizer waits for the mirrored rings too. What is left out is
the mirrored replicas' compute, TP and pipeline traffic; on a fabric where that traffic cannot
meet (a rail-optimized or non-blocking leaf-spine, no link events, no extra links) it cannot
change the answer, which is what :func:`decide` checks before coarsening on its own (``auto``).

Metrics of a coarsened run give every mirrored rank its representative's rank metrics
(:func:`xsim_adapters.metrics.bundle.compute_metrics`), so per-type means, MFU and tokens/s
are over the whole fleet. docs/scale.md has the rule and the measured error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import XsimError
from ..plan.model import Plan

MODES = ("auto", "on", "off")

# ``auto`` coarsens only a plan whose full trace would have more ops than this: below it the
# full run takes seconds and is exact by construction, so nothing is gained by coarsening.
AUTO_MIN_OPS = 5_000_000


@dataclass(frozen=True)
class Coarsening:
    """What the generator simulates: ``representative[r]`` is the replica whose ops stand for
    replica ``r`` (``r`` itself when ``r`` is simulated in full)."""

    mode: str
    used: bool
    reason: str
    representative: tuple[int, ...]

    @property
    def mirrored(self) -> tuple[int, ...]:
        """Replicas not simulated (their DP ring flows are kept)."""
        return tuple(r for r, q in enumerate(self.representative) if q != r)

    def rank_runs(self, plan: Plan) -> list[list[int]]:
        """``[mirrored first rank, representative first rank, count, mirrored replica]`` per
        mirrored stage: in the metrics each mirrored rank takes the numbers of the matching rank
        of its representative."""
        runs = []
        for r in self.mirrored:
            q = self.representative[r]
            for st, sq in zip(plan.replicas[r].stages, plan.replicas[q].stages, strict=True):
                runs.append([plan.stage_ranks(st)[0], plan.stage_ranks(sq)[0], st.tp, r])
        return runs

    def to_manifest(self, plan: Plan) -> dict[str, Any]:
        """JSON-ready record for the trace manifest and ``summary.json``."""
        classes: dict[int, list[int]] = {}
        for r, q in enumerate(self.representative):
            classes.setdefault(q, []).append(r)
        return {
            "mode": self.mode,
            "used": self.used,
            "reason": self.reason,
            "method": "dp_replica_classes" if self.used else "none",
            "simulated_replicas": sorted(classes),
            "classes": [{"representative": q, "replicas": len(v)}
                        for q, v in sorted(classes.items())],
            "representative": list(self.representative) if self.used else [],
            "rank_runs": self.rank_runs(plan),
        }


def full(plan: Plan, mode: str = "off", reason: str = "coarsening off") -> Coarsening:
    """Every replica simulated."""
    return Coarsening(mode, False, reason, tuple(range(plan.dp)))


def replica_signature(plan: Plan, r: int) -> tuple:
    """What makes replica ``r`` behave as another: micro-batches and, per stage, device type,
    NIC, TP degree, layers and place (local GPU indices; without rails, each stage's server and
    leaf relative to the replica's first). Two replicas with equal signatures run identically
    on a symmetric fabric."""
    so = plan.network.scale_out
    rep = plan.replicas[r]
    first_node = None
    stages = []
    for st in rep.stages:
        g = plan.group(st.group)
        dev = plan.device_types[g.type]
        gpn = g.gpus_per_node
        _, _, node = plan.rank_info(plan.stage_ranks(st)[0])
        first_node = node if first_node is None else first_node
        place: tuple = (st.devices[0] % gpn, st.devices[1] - st.devices[0])
        if not so.rail_optimized:  # which stages share a leaf matters for PP routes
            npl = max(1, so.nodes_per_leaf)
            place += (node - first_node, node // npl - first_node // npl)
        nic = g.nic_gbps if g.nic_gbps is not None else dev.nic_gbps
        stages.append((dev, gpn, nic, st.tp, st.layers) + place)
    return (rep.micro_batches, tuple(stages))


def replica_classes(plan: Plan) -> list[list[int]]:
    """Replicas grouped by :func:`replica_signature`, in order of their first member."""
    by_sig: dict[tuple, list[int]] = {}
    for r in range(plan.dp):
        by_sig.setdefault(replica_signature(plan, r), []).append(r)
    return sorted(by_sig.values(), key=lambda v: v[0])


def fabric_asymmetry(plan: Plan) -> str | None:
    """Why mirrored replicas' traffic could change the representative's times (None: it
    cannot): link events, explicit links, an oversubscribed or fat-tree fabric."""
    net = plan.network
    so = net.scale_out
    if net.events:
        return "network.events: timed link events break the symmetry between replicas"
    if net.links:
        return "network.links: explicit links break the symmetry between replicas"
    if so.topology != "leaf_spine":
        return f"network.scale_out.topology: {so.topology} (auto coarsens leaf_spine only)"
    if so.oversubscription > 1.0:
        return (f"network.scale_out.oversubscription: {so.oversubscription} > 1, replicas "
                "would contend on leaf uplinks")
    return None


def decide(plan: Plan, mode: str = "auto", full_ops: int | None = None) -> Coarsening:
    """The coarsening of ``plan`` for ``mode``:

    - ``off``: none;
    - ``on``: one representative per class of identical replicas (:func:`replica_classes`),
      whatever the fabric (the user accepts the error; docs/scale.md); never with an active
      ``perturb:`` section (its per-rank slowdowns and noise break the symmetry);
    - ``auto``: as ``on``, but only if some class has two or more replicas, the fabric is
      symmetric (:func:`fabric_asymmetry`) and the full trace would have more than
      :data:`AUTO_MIN_OPS` ops (``full_ops``, estimated when None).
    """
    if mode not in MODES:
        raise XsimError(f"coarsen: expected one of {', '.join(MODES)} (got {mode!r})")
    if mode == "off":
        return full(plan, mode)
    if plan.perturb.active:  # per-rank slowdowns and noise: replicas are not identical
        return full(plan, mode, "perturb: per-rank slowdowns or jitter make replicas differ")
    classes = replica_classes(plan)
    if all(len(c) == 1 for c in classes):
        return full(plan, mode, "no two replicas are identical")
    if mode == "auto":
        why = fabric_asymmetry(plan)
        if why is not None:
            return full(plan, mode, why)
        if full_ops is None:
            from ..plan.limits import estimate_ops

            full_ops = estimate_ops(plan)
        if full_ops <= AUTO_MIN_OPS:
            return full(plan, mode, f"the full trace is small ({full_ops:,} <= "
                                    f"{AUTO_MIN_OPS:,} ops estimated)")
    rep = [0] * plan.dp
    for c in classes:
        for r in c:
            rep[r] = c[0]
    sizes = ", ".join(f"{len(c)} x replica {c[0]}" for c in classes)
    return Coarsening(mode, True, f"{len(classes)} classes of identical replicas: {sizes}",
                      tuple(rep))
