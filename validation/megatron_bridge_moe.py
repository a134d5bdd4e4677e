"""Megatron-Bridge MoE pre-training on H100: GPT-OSS 120B, tokens per second per GPU.

Source: NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary.md``, the DGX-H100 rows of GPT
OSS 120B in the 26.02 and 26.04.01 NeMo containers (the same mapping measured twice: 5993 and
5824 tokens/s/GPU), with provenance in ``validation/data/megatron_bridge_moe_h100.csv``: 64 GPUs,
BF16, global batch 1280, micro-batch 1, 4096 tokens, TP 1, PP 4, no VP, EP 8 (the recipe,
``scripts/performance/configs/gpt_oss``, sets expert_tensor_parallel_size 1 and
``moe_router_force_load_balancing``; the page's footnote: "we force-balance the token
distribution among experts and all benchmarks are token-dropless").

The plan (:func:`plan_dict`): the gpt-oss-120b preset (sliding-window and full layers
alternating, attention sinks, biases; experts 128, top-4) at 4096 tokens, balanced routing
(the forced balance), the row's mapping, the distributed optimizer (ZeRO-1), 1F1B, 8-GPU
H100-80GB servers with 400 Gb/s NICs on a non-blocking leaf-spine, Megatron-Core's rank order
(pipeline outermost: each stage's EP group on one server). Not modelled that the run
has: ``recompute_modules: [layernorm, moe_act]`` (a memory saving our plan does not need: it
fits without), the router fusion, the fused permutation kernels. The whole iteration is
simulated: 1.9 M trace ops, about 15 CPU s on the flow backend.

Not run, and why (docs/validation.md): the page's 25.11 row of the same model (GBS 512, MBS 4)
does not fit our memory estimate without the module recompute; its DeepSeek-V3 H100 row (1024
GPUs, GBS 8192, TP 2 PP 8 VP 4 EP 64) would be ~0.3 G trace ops: too large for this machine, and
coarsening cannot fold expert-parallel replicas.
"""

from __future__ import annotations

import functools
from typing import Any

from validation._plans import uniform_plan
from validation.framework import DATA, Case, read_rows, row_case, simulate_summary

SOURCE = "megatron-bridge-moe"
MEASURED = DATA / "megatron_bridge_moe_h100.csv"
GPUS_PER_NODE = 8  # DGX-H100
NIC_GBPS = 400


def rows() -> list[dict[str, Any]]:
    return read_rows(MEASURED)


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The published configuration as a plan (see the module docstring)."""
    gpus, tp, pp, cp, ep, etp = (int(row[k]) for k in ("gpus", "tp", "pp", "cp", "ep", "etp"))
    training = {"global_batch": int(row["global_batch"]), "micro_batch": int(row["micro_batch"]),
                "schedule": "1f1b", "zero_stage": 1, "sequence_parallel": tp > 1,
                "precision": row["precision"]}
    # Megatron-Core's rank order (tp-cp-ep-dp-pp): a stage's EP ranks are neighbours (docs/plan.md)
    return uniform_plan(f"megatron-bridge-{row['model']}-{row['gpus']}gpu",
                        {"preset": row["model"], "seq_len": int(row["seq_len"])}, training,
                        "H100-80GB", gpus, tp, pp, gpus_per_node=GPUS_PER_NODE,
                        network={"scale_out": {"topology": "leaf_spine",
                                               "link_gbps": NIC_GBPS}},
                        cp=cp, stage={"ep": ep, **({"etp": etp} if etp != 1 else {})})


@functools.cache
def _tokens_per_s_per_gpu(key: tuple[tuple[str, Any], ...]) -> float:
    row = dict(key)
    plan, s = simulate_summary(plan_dict(row))
    it_s = s["iteration_time_ns"] * 1e-9
    return int(row["global_batch"]) * int(row["seq_len"]) / (it_s * plan.num_ranks)


def predict(row: dict[str, Any]) -> float:
    """Simulated tokens/s per GPU (rows with the same mapping share one simulation)."""
    keep = ("model", "precision", "seq_len", "gpus", "global_batch", "micro_batch", "tp", "pp",
            "cp", "vp", "ep", "etp")
    return _tokens_per_s_per_gpu(tuple((k, row[k]) for k in keep))


def cases() -> list[Case]:
    """One case per row of the CSV."""
    return [
        row_case(SOURCE, f"{r['model']} tp{r['tp']} pp{r['pp']} ep{r['ep']} {r['gpus']}gpu "
                 f"(container {r['container']})", r, predict,
                 notes="balanced routing (forced in the source); whole iteration simulated")
        for r in rows()
    ]
