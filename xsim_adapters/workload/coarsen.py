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

A second axis, **steady-state micro-batches**: in a 1F1B pipeline every micro-batch after the
pipeline has filled repeats the one before it, one period later. A replica of ``m``
micro-batches over ``p`` stages is simulated with ``p + STEADY_EXTRA`` of them; the metrics
measure the period from that run, check that it repeats on every rank, and add the
``m - p - STEADY_EXTRA`` left-out periods to every time metric
(:mod:`xsim_adapters.metrics.steady`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import XsimError
from ..plan.model import Plan
from ..plan.parallel import group_replicas, uses_ep

MODES = ("auto", "on", "off")

# ``auto`` coarsens only a plan whose full trace would have more ops than this: below it the
# full run takes seconds and is exact by construction, so nothing is gained by coarsening.
AUTO_MIN_OPS = 5_000_000
# Micro-batches simulated beyond the pipeline depth p when steady-state micro-batches are
# merged: stage 0 runs p - 1 warm-up forwards, its spacing settles from micro-batch p on
# (measured on the 3,072-GPU plan), and the metrics compare two windows of one period each
# (micro-batches p + 4 and p + 5, ending before the last one's cool-down).
STEADY_EXTRA = 8
# The measured bounds the two axes are used within automatically (docs/scale.md, "Measured
# error"; summary.json's coarsening.approximations quotes them).
REPLICA_BOUND = ("iteration time within 1% of the full run on a symmetric fabric (measured "
                 "0 to +0.011%, docs/scale.md)")
MICROBATCH_BOUND = ("exact to the ns rounding of the measured period (<= 2 ns per period added;"
                    " refused after the run if the period does not repeat on every rank)")
# Rank pairs of the EP all-to-alls and CP rings :func:`cross_replica_multipath` checks; beyond
# it ``auto`` does not coarsen such a plan (it could not show the result exact).
MAX_CHECKED_PAIRS = 200_000


@dataclass(frozen=True)
class Coarsening:
    """What the generator simulates: ``representative[r]`` is the replica whose ops stand for
    replica ``r`` (``r`` itself when ``r`` is simulated in full)."""

    mode: str
    used: bool
    reason: str
    representative: tuple[int, ...]
    # micro-batches simulated per replica when steady-state micro-batches are merged (None:
    # every micro-batch is simulated), and why (or why not)
    microbatches: int | None = None
    microbatch_reason: str = ""
    # ``on`` where the replica axis is neither exact nor within its measured bound: why
    # (summary.json and the CLI say it; ``auto`` refuses these plans instead)
    warning: str | None = None

    @property
    def any_used(self) -> bool:
        """Whether anything is left out: replicas or micro-batches."""
        return self.used or self.microbatches is not None

    def simulated_plan(self, plan: Plan) -> Plan:
        """``plan`` as it is simulated: every replica with :attr:`microbatches` micro-batches
        when micro-batches are merged (the global batch to match), else ``plan`` itself."""
        if self.microbatches is None:
            return plan
        m = self.microbatches
        reps = tuple(dataclasses.replace(r, micro_batches=m) for r in plan.replicas)
        t = dataclasses.replace(plan.training,
                                global_batch=m * plan.dp * plan.training.micro_batch)
        return dataclasses.replace(plan, replicas=reps, training=t)

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
        methods = ([] if not self.used else ["dp_replica_classes"]) + (
            [] if self.microbatches is None else ["steady_state_microbatches"])
        m = [r.micro_batches for r in plan.replicas]
        return {
            "mode": self.mode,
            "used": self.any_used,
            "reason": self.reason,
            "method": "+".join(methods) or "none",
            "approximations": self.approximations(plan),
            "refused": [] if self.mode == "off" else (
                ([] if self.used else [{"method": "dp_replica_classes", "why": self.reason}])
                + ([] if self.microbatches is not None else [
                    {"method": "steady_state_microbatches", "why": self.microbatch_reason}])),
            "warning": self.warning,
            "simulated_replicas": sorted(classes),
            "classes": [{"representative": q, "replicas": len(v)}
                        for q, v in sorted(classes.items())],
            "representative": list(self.representative) if self.used else [],
            "rank_runs": self.rank_runs(plan),
            "microbatches": {
                "used": self.microbatches is not None,
                "reason": self.microbatch_reason,
                "micro_batches": m[0] if len(set(m)) == 1 else m,
                "simulated": self.microbatches,
                # the two steady micro-batches whose windows the metrics compare
                "steady": steady_microbatches(plan.replicas[0].pp)
                if self.microbatches is not None else None,
            },
        }


    def approximations(self, plan: Plan) -> list[dict[str, Any]]:
        """What was left out of the simulation and the bound it is used within (docs/scale.md):
        one record per axis used, ``exact`` when it is exact by construction."""
        out: list[dict[str, Any]] = []
        if self.used:
            cross = uses_ep(plan) or plan.replicas[0].stages[0].cp > 1
            if self.warning is not None:
                bound = f"none measured: {self.warning}"
            elif cross:
                bound = ("exact: whole expert blocks / CP groups mirrored, every pair they "
                         "exchange over has one path")
            else:
                bound = REPLICA_BOUND
            out.append({"method": "dp_replica_classes", "exact": cross and self.warning is None,
                        "bound": bound})
        if self.microbatches is not None:
            out.append({"method": "steady_state_microbatches", "exact": False,
                        "bound": MICROBATCH_BOUND})
        return out


def full(plan: Plan, mode: str = "off", reason: str = "coarsening off") -> Coarsening:
    """Every replica simulated."""
    return Coarsening(mode, False, reason, tuple(range(plan.dp)), None, reason)


def steady_microbatches(pp: int) -> list[int]:
    """The two micro-batches whose one-period windows (from the start of their forward on each
    rank to the next micro-batch's) the metrics compare and extrapolate with."""
    return [pp + STEADY_EXTRA - 4, pp + STEADY_EXTRA - 3]


def microbatch_plan_reason(plan: Plan, mode: str) -> tuple[int | None, str]:
    """(micro-batches to simulate, why) for merging steady-state micro-batches of ``plan``,
    or (None, why not): the schedule must be 1F1B, every replica must have the same pipeline
    depth p and micro-batch count m > p + STEADY_EXTRA, and nothing may change over time (no
    ``perturb:``, no ``network.events``); ``auto`` also needs the replicas to be one class
    (:func:`replica_classes`: the same pipeline everywhere, so one period is every rank's).
    The generator then also checks that no route depends on op ids (:func:`ecmp_choice`) and
    otherwise simulates every micro-batch."""
    t = plan.training
    if t.schedule != "1f1b":
        return None, f"training.schedule: {t.schedule} (steady-state micro-batches: 1f1b only)"
    if plan.perturb.active:
        return None, "perturb: per-rank slowdowns or jitter make micro-batches differ"
    if plan.network.events:
        return None, "network.events: timed link events make micro-batches differ"
    pps = {r.pp for r in plan.replicas}
    ms = {r.micro_batches for r in plan.replicas}
    if len(pps) > 1 or len(ms) > 1:
        return None, "replicas differ in pipeline depth or micro-batches"
    p, m = pps.pop(), ms.pop()
    sim = p + STEADY_EXTRA
    if m <= sim:
        return None, (f"{m} micro-batches per replica <= pipeline depth {p} + {STEADY_EXTRA}:"
                      " nothing to merge")
    if mode == "auto" and len(replica_classes(plan)) > 1:
        return None, "replicas are not all identical (auto merges micro-batches of one class)"
    if mode == "auto" and t.zero_stage >= 3 and plan.dp > 1:
        return None, ("training.zero_stage 3: the merge's error bound was measured without "
                      "FSDP's per-micro-batch gathers (coarsen on merges them)")
    return sim, (f"{sim} of {m} micro-batches simulated per replica (pipeline depth {p} +"
                 f" {STEADY_EXTRA}); the {m - sim} steady-state ones left out are added as"
                 " periods measured from the run")


def replica_signature(plan: Plan, r: int) -> tuple:
    """What makes replica ``r`` behave as another: micro-batches and, per stage, device type,
    NIC, TP degree, layers and place (local GPU indices; without rails, each stage's server and
    leaf relative to the replica's first). Two replicas with equal signatures run identically
    on a symmetric fabric."""
    so = plan.network.scale_out
    rep = plan.replicas[r]
    domain_of = plan.domain_of_node()
    first_node = first_domain = None
    stages = []
    for st in rep.stages:
        g = plan.group(st.group)
        dev = plan.device_types[g.type]
        gpn = g.gpus_per_node
        _, _, node = plan.rank_info(plan.stage_ranks(st)[0])
        first_node = node if first_node is None else first_node
        first_domain = domain_of[node] if first_domain is None else first_domain
        # the stage's place in its NVLink domain (a rack of trays: which PP hops stay on NVLink)
        place: tuple = (st.devices[0] % g.domain_gpus, st.devices[1] - st.devices[0])
        if g.domain_nodes > 1:
            place += (domain_of[node] - first_domain,)
        if not so.rail_optimized:  # which stages share a leaf matters for PP routes
            npl = max(1, so.nodes_per_leaf)
            place += (node - first_node, node // npl - first_node // npl)
        nic = g.nic_gbps if g.nic_gbps is not None else dev.nic_gbps
        stages.append((dev, gpn, nic, st.tp, st.layers) + place)
    return (rep.micro_batches, tuple(stages))


def replica_classes(plan: Plan) -> list[list[int]]:
    """Replicas grouped by :func:`replica_signature`, in order of their first member.

    Under expert parallelism the replicas of one expert block are not alike: each holds other
    experts and computes its own share of the routed tokens. What repeats is the whole block
    (every block routes the same counts: :func:`.moe.routing_counts` depends on the layer and
    the seed only). So a replica's signature there is also its position in its block of each
    stage and the signatures of every replica of those blocks: replica ``h + k`` of a block
    stands for replica ``h' + k`` of an identical block, the representative's block is simulated
    whole, and every block's all-to-all flows are kept (like the DP rings), which is exact on
    a symmetric fabric (docs/scale.md)."""
    sigs = [replica_signature(plan, r) for r in range(plan.dp)]
    if uses_ep(plan):
        sigs = [sigs[r] + _ep_blocks(plan, r, sigs) for r in range(plan.dp)]
    by_sig: dict[tuple, list[int]] = {}
    for r, sig in enumerate(sigs):
        by_sig.setdefault(sig, []).append(r)
    return sorted(by_sig.values(), key=lambda v: v[0])


def _ep_blocks(plan: Plan, r: int, sigs: list[tuple]) -> tuple:
    """Per stage, replica ``r``'s position in its expert block and the block's signatures."""
    out = []
    for i in range(plan.replicas[r].pp):
        block = group_replicas(plan, r, i, "ep")
        out.append((block.index(r), tuple(sigs[x] for x in block)))
    return tuple(out)


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


def ecmp_choice(plan: Plan, src: Any, dst: Any) -> str | None:
    """Why a trace's micro-batches would not repeat on this fabric, or None: its flows go from
    ranks ``src[i]`` to ``dst[i]``; under ``network.ecmp: flow`` a pair with several equal-cost
    paths gets a path per flow from the hash of the flow's op id, so each micro-batch (and the
    sync after them, whose op ids depend on how many came before) meets its own collisions.
    With one shortest path for every pair, or under ``ecmp: connection`` (a flow's path
    follows its connection, the same in every micro-batch), no route depends on op ids."""


    if plan.network.ecmp == "connection":
        return None
    pair = _multipath_pair(plan, src, dst)
    if pair is None:
        return None
    return (f"ranks {pair[0]} -> {pair[1]} exchange traffic over several equal-cost paths (ECMP"
            " hashes each flow's op id): merged micro-batches would meet other collisions than"
            " the full run")


def _multipath_pair(plan: Plan, src: Any, dst: Any) -> tuple[int, int] | None:
    """The first pair ``src[i] -> dst[i]`` with several shortest paths, or None."""
    import numpy as np

    from ..topology import build_topology

    n = plan.num_ranks
    # by destination: the router computes one destination's distances once for all sources
    key = np.unique(np.asarray(dst, dtype=np.int64) * n + np.asarray(src, dtype=np.int64))
    topo = build_topology(plan)
    for k in key.tolist():
        b, a = divmod(k, n)
        if a != b and not topo.single_path(a, b):
            return a, b
    return None


def cross_replica_multipath(plan: Plan) -> str | None:
    """Why mirroring whole expert blocks or CP groups would not be exact (None: it is).

    Their all-to-all and K/V ring flows, and the DP and expert-DP rings, cross replicas and are
    all kept; a mirrored replica's flows then run when its representative's do. Where such a
    pair has several equal-cost paths, ECMP gives each pair (and each flow's op id) its own
    path, so in the full run the replicas meet different collisions and do not run alike:
    measured +0.48% on moe-mixtral-8x7b-64xh100-ep8 (its DP rings cross two leaves; up to 150
    ms on single ranks), +0.65% on long-context-128k-cp4 with a leaf per server
    (docs/scale.md). With one path per pair every replica of a class runs alike and the
    coarsened run is the full run's (0 ns difference on every rank and metric). Conservative:
    checks every all-to-all pair, every CP ring edge and each rank against the same rank of
    replica 0."""
    import numpy as np

    from ..plan.parallel import ep_ranks

    src: list[Any] = []
    dst: list[Any] = []
    count = 0
    cp = plan.replicas[0].stages[0].cp
    rep0_pp = plan.replicas[0].pp
    for r, rep in enumerate(plan.replicas):
        for i in range(rep.pp):
            if uses_ep(plan) and r == group_replicas(plan, r, i, "ep")[0]:
                m = np.asarray(ep_ranks(plan, r, i), dtype=np.int64)
                src.append(np.repeat(m, len(m)))
                dst.append(np.tile(m, len(m)))
                count += len(m) ** 2
            if cp > 1 and r % cp == 0:
                ring = np.array([plan.stage_ranks(plan.replicas[x].stages[i])
                                 for x in range(r, r + cp)], dtype=np.int64)
                src.append(ring.reshape(-1))
                dst.append(np.roll(ring, -1, axis=0).reshape(-1))
                count += ring.size
            if r > 0:  # the DP (and expert-DP) rings pair the same rank of every replica
                a = np.asarray(plan.stage_ranks(plan.replicas[0].stages[min(i, rep0_pp - 1)]))
                b = np.asarray(plan.stage_ranks(rep.stages[i]))
                k = min(len(a), len(b))
                src.append(a[:k])
                dst.append(b[:k])
                count += k
            if count > MAX_CHECKED_PAIRS:
                return (f"over {MAX_CHECKED_PAIRS:,} rank pairs exchange all-to-all or CP ring"
                        " traffic: too many to check that each has one path")
    if not src:
        return None
    pair = _multipath_pair(plan, np.concatenate(src), np.concatenate(dst))
    if pair is None:
        return None
    return (f"ranks {pair[0]} -> {pair[1]} have several equal-cost paths: under "
            f"{'expert' if uses_ep(plan) else 'context'} parallelism mirrored replicas would "
            "meet other ECMP collisions than in the full run (measured +0.48% to +0.65%, up "
            "to 150 ms on single ranks, docs/scale.md)")


def decide(plan: Plan, mode: str = "auto", full_ops: int | None = None) -> Coarsening:
    """The coarsening of ``plan`` for ``mode``:

    - ``off``: none;
    - ``on``: one representative per class of identical replicas (:func:`replica_classes`),
      whatever the fabric (the user accepts the error; docs/scale.md); never with an active
      ``perturb:`` section (its per-rank slowdowns and noise break the symmetry);
    - ``auto``: as ``on``, but only if some class has two or more replicas, the fabric is
      symmetric (:func:`fabric_asymmetry`) and the full trace would have more than
      :data:`AUTO_MIN_OPS` ops (``full_ops``, estimated when None).

    And on the micro-batch axis (:func:`microbatch_plan_reason`): ``on`` merges steady-state
    micro-batches of any 1F1B plan whose replicas share depth and micro-batch count, ``auto``
    only of one class of replicas and only while the trace left after the replica axis would
    still exceed :data:`AUTO_MIN_OPS` ops.
    """
    if mode not in MODES:
        raise XsimError(f"coarsen: expected one of {', '.join(MODES)} (got {mode!r})")
    if mode == "off":
        return full(plan, mode)
    reps = _replica_axis(plan, mode, full_ops)
    mb, mb_why = microbatch_plan_reason(plan, mode)
    if mb is not None and mode == "auto":
        from .estimate import estimate_ops

        left = estimate_ops(plan, set(reps.representative))
        if left <= AUTO_MIN_OPS:
            mb, mb_why = None, (f"the trace is small ({left:,} <= {AUTO_MIN_OPS:,} ops"
                                " estimated)")
    return dataclasses.replace(reps, microbatches=mb, microbatch_reason=mb_why)


def _replica_axis(plan: Plan, mode: str, full_ops: int | None) -> Coarsening:
    """The replica axis of :func:`decide`."""
    if plan.perturb.active:  # per-rank slowdowns and noise: replicas are not identical
        return full(plan, mode, "perturb: per-rank slowdowns or jitter make replicas differ")
    classes = replica_classes(plan)
    if all(len(c) == 1 for c in classes):
        return full(plan, mode, "no two replicas are identical")
    # not exact, and no bound measured: ``auto`` refuses, ``on`` warns (the cheap checks
    # first: the path check builds the topology)
    cross = uses_ep(plan) or plan.replicas[0].stages[0].cp > 1
    why = fabric_asymmetry(plan)
    if mode == "auto":
        if why is not None:
            return full(plan, mode, why)
        if full_ops is None:
            from .estimate import estimate_ops

            full_ops = estimate_ops(plan)
        if full_ops <= AUTO_MIN_OPS:
            return full(plan, mode, f"the full trace is small ({full_ops:,} <= "
                                    f"{AUTO_MIN_OPS:,} ops estimated)")
    if why is None and cross:
        why = cross_replica_multipath(plan)
        if why is not None and mode == "auto":
            return full(plan, mode, why)
    rep = [0] * plan.dp
    for c in classes:
        for r in c:
            rep[r] = c[0]
    sizes = ", ".join(f"{len(c)} x replica {c[0]}" for c in classes)
    return Coarsening(mode, True, f"{len(classes)} classes of identical replicas: {sizes}",
                      tuple(rep), warning=None if why is None else (
                          f"coarsen: on is not exact here and has no measured bound: {why}"))
