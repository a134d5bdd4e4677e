"""The trace's manifest and the plan digest it carries (docs/trace.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

import numpy as np

from ..plan.model import FSDPSpec, Plan
from ..plan.sizes import tokens_per_microbatch
from ..trace.schema import KINDS, OPTIONAL_PHASES, PHASES, SCHEMA_VERSION
from .coarsen import Coarsening
from .compute.costs import ADAM_BYTES_PER_PARAM

GENERATOR_VERSION = "1"


def plan_digest(plan: Plan) -> str:
    """sha256 (hex) of the canonical JSON form of the validated plan.

    Fields added later are left out at their defaults (no ``perturb`` section, no ``moe``,
    ``ep`` = ``cp`` = 1, ``grad_reduce_dtype: auto``, ``grad_accumulation_fusion: true``,
    ``network.ecmp: flow``, no ``nvlink_domain_gpus``, ``fp4_tflops``, ``pcie_p2p``,
    ``nccl_net`` and socket keys, ``training.fsdp`` at its defaults), so plans without them
    keep the digest they had before.
    """
    data = _digest_form(asdict(plan))
    if not plan.perturb.active:  # plans without a perturb section keep their earlier digests
        del data["perturb"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _digest_form(d: dict[str, Any]) -> dict[str, Any]:
    if d["model"].get("moe") is None:
        d["model"].pop("moe", None)
    for key, default in (("grad_reduce_dtype", "auto"), ("grad_accumulation_fusion", True)):
        if d["training"].get(key) == default:
            d["training"].pop(key)
    # network keys added later, at their defaults: ECMP per flow, NCCL over IB/RoCE verbs (not
    # sockets) with NCCL's 1 x 1 socket defaults, no per-flow cap
    later: tuple[tuple[str, Any], ...] = (
        ("ecmp", "flow"), ("nccl_net", "ib"), ("socket_nthreads", 1), ("nsocks_per_thread", 1),
        ("per_flow_gbps", None))
    for key, value in later:
        if key in d["network"] and d["network"][key] == value:
            d["network"].pop(key)
    if d["network"].get("transport", 0) is None:  # no network.transport section
        d["network"].pop("transport")
    for g in d["device_groups"]:  # 0: the group's scale-up domain is its server (no NVL rack)
        if g.get("nvlink_domain_gpus") == 0:
            g.pop("nvlink_domain_gpus")
    for dt in d["device_types"].values():  # no FP4 peak given; GPU peer-to-peer available
        if dt.get("fp4_tflops") == 0.0:
            dt.pop("fp4_tflops")
        if dt.get("pcie_p2p") is True:
            dt.pop("pcie_p2p")
    _drop_none(d, ("p2p", "host_memory_GBps"))  # server.pcie keys added later, unset
    if d["training"].get("fsdp") == asdict(FSDPSpec()):
        d["training"].pop("fsdp")
    for rep in d["replicas"]:
        for st in rep["stages"]:
            for key in ("ep", "cp"):
                if st.get(key) == 1:
                    st.pop(key)
    return d


def _drop_none(d: Any, keys: tuple[str, ...]) -> None:
    """Remove ``keys`` whose value is None from every mapping nested in ``d`` (in place)."""
    if isinstance(d, dict):
        for k in keys:
            if k in d and d[k] is None:
                d.pop(k)
        for v in d.values():
            _drop_none(v, keys)
    elif isinstance(d, (list, tuple)):
        for v in d:
            _drop_none(v, keys)


def manifest(plan: Plan, coarsening: Coarsening, chunks: list[list[list[tuple[int, int]]]],
             ops_kind: np.ndarray, ops_phase: np.ndarray, num_deps: int) -> dict[str, Any]:
    """The trace's manifest (docs/trace.md) for ``plan``, the plan asked for (a coarsened
    trace stands for all of it); ``chunks``: [replica][stage] -> layer ranges."""
    ranks = []
    for rank in range(plan.num_ranks):
        g, d, node = plan.rank_info(rank)
        ranks.append(
            {
                "rank": rank,
                "group": g.name,
                "node": node,
                "device_type": g.type,
                "local": d % g.gpus_per_node,
            }
        )
    kinds = np.bincount(ops_kind, minlength=len(KINDS))
    phases = np.bincount(ops_phase, minlength=len(PHASES))
    c, t, m = plan.collectives, plan.training, plan.model
    mbs = sum(rep.micro_batches for rep in plan.replicas)
    return {
        "schema_version": SCHEMA_VERSION,
        "plan_name": plan.name,
        "plan_digest": plan_digest(plan),
        "generator": {
            "version": GENERATOR_VERSION,
            "schedule": t.schedule,
            "resharding": c.resharding,
            "channels": c.channels or "auto",
            "granularity": c.granularity,
            "chunks": c.chunks,
            "ring_order": c.ring_order,
            "dp_bucket_layers": c.dp_bucket_layers,
            "sequence_parallel": t.sequence_parallel,
            "recompute": t.recompute,
            "virtual_stages": t.virtual_stages,
            "overlap": asdict(t.overlap),
            "adam_bytes_per_param": ADAM_BYTES_PER_PARAM,
            "zero_stage": t.zero_stage,
        },
        "ranks": ranks,
        "coarsening": coarsening.to_manifest(plan),
        "op_counts": {
            "by_kind": {k: int(kinds[i]) for i, k in enumerate(KINDS)},
            "by_phase": {p: int(phases[i]) for i, p in enumerate(PHASES)
                         if p not in OPTIONAL_PHASES or phases[i]},
        },
        "num_ops": int(len(ops_kind)),
        "num_deps": int(num_deps),
        "groups": [g.name for g in plan.device_groups],
        "device_types": {
            name: {
                "peak_tflops": dt.peak_tflops,
                "hbm_GBps": dt.hbm_GBps,
                "scaleup_GBps": dt.scaleup_GBps,
                "nic_gbps": dt.nic_gbps,
                "efficiency": dt.efficiency,
            }
            for name, dt in sorted(plan.device_types.items())
        },
        "workload": {
            "global_batch": t.global_batch,
            "micro_batch": t.micro_batch,
            "seq_len": m.seq_len,
            # a CP group's cp replicas share each sequence (cp is one per plan)
            "tokens_per_iteration": mbs * tokens_per_microbatch(
                m, t.micro_batch, plan.replicas[0].stages[0].cp),
            "schedule": t.schedule,
            "dp": plan.dp,
            "replicas": [
                {
                    "replica": r,
                    "pp": rep.pp,
                    "tp": [st.tp for st in rep.stages],
                    "micro_batches": rep.micro_batches,
                    "layers": [list(st.layers) for st in rep.stages],
                    "chunks": [[list(c) for c in sc] for sc in chunks[r]],
                }
                for r, rep in enumerate(plan.replicas)
            ],
        },
    }


__all__ = ["GENERATOR_VERSION", "manifest", "plan_digest"]
