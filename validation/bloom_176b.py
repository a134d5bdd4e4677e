"""BLOOM 176B pre-training on 384 A100 (BigScience tr11, Megatron-DeepSpeed): iteration time.

The run's own log gives the iteration time at the full batch (data file header). The plan is
written from its launch script: the BLOOM shape (70 layers, hidden 14,336, 112 heads, ffn 4h,
sequence 2,048, vocabulary padded to 250,880), TP 4 x PP 12 x DP 8, micro-batch 2, global batch
2,048, bf16, full activation recompute (``--checkpoint-activations``), pipeline stages of 6
layers except the first and the last (5 each: ``--pp-partition-method
'type:transformer|embedding'`` counts each embedding as one layer), Megatron-DeepSpeed's rank
order (pipeline outermost, then data, then tensor parallelism), 8 A100-80GB per node with one
100 Gb/s Omni-Path NIC per GPU pair.

Assumptions, global to the source (docs/validation.md): HGX A100 servers (NVSwitch); a
non-blocking leaf-spine; DeepSpeed's bf16 optimizer as ZeRO-1 (fp32 gradients reduce-scattered,
bf16 parameters all-gathered) with both collectives after the pipeline schedule (no overlap);
Megatron's 2022 unfused attention core with dropout (ALiBi's bias add and the embedding
LayerNorm not modelled); no gradient accumulation fusion; plain 1F1B (DeepSpeed's pipeline
schedule).
"""

from __future__ import annotations

import functools
from typing import Any

from validation._plans import lighter_edge_stages, read_rows, simulate
from validation.framework import DATA, Case

SOURCE = "bloom-176b"
CSV_FILE = DATA / "bloom_176b_a100.csv"
DEVICE = "A100-80GB"
NIC_GBPS = 100  # one Omni-Path 100 Gb/s link per GPU pair


def rows() -> list[dict[str, Any]]:
    return [{k: float(v) if k == "iteration_s" else int(v) for k, v in r.items()}
            for r in read_rows(CSV_FILE)]


def label(row: dict[str, Any]) -> str:
    return f"176B tp{row['tp']} pp{row['pp']} dp{row['dp']} {row['gpus']}gpu"


def stage_layers(layers: int, pp: int) -> list[tuple[int, int]]:
    """Megatron-DeepSpeed's 'type:transformer|embedding' split: the two embeddings count as
    layers, so the first and the last stage hold one transformer layer fewer."""
    return lighter_edge_stages(layers, pp)


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    tp, pp, dp = row["tp"], row["pp"], row["dp"]
    layers = stage_layers(row["layers"], pp)
    replicas = []
    for d in range(dp):
        stages = []
        for s in range(pp):
            first = s * dp * tp + d * tp  # Megatron-DeepSpeed topology: pipe, data, model
            stages.append({"group": "a100", "devices": [first, first + tp], "tp": tp,
                           "layers": list(layers[s])})
        replicas.append({"stages": stages})
    h = row["hidden"]
    return {
        "name": "bloom-176b",
        "model": {"name": "bloom-176b", "layers": row["layers"], "hidden": h,
                  "ffn_hidden": 4 * h, "heads": row["heads"], "seq_len": row["seq_len"],
                  "vocab": row["vocab"], "dtype": "bf16", "gated_mlp": False},
        "training": {"global_batch": row["global_batch"], "micro_batch": row["micro_batch"],
                     "schedule": "1f1b", "zero_stage": 1, "recompute": "full",
                     "precision": "bf16", "flash_attention": False, "dropout": True,
                     "grad_accumulation_fusion": False,
                     "overlap": {"dp_grad_reduce": False, "param_gather": False}},
        "device_groups": {"a100": {"type": DEVICE, "nodes": row["gpus"] // 8,
                                   "gpus_per_node": 8, "nic_gbps": NIC_GBPS,
                                   "server": {"nics": "per_pair"}}},
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": NIC_GBPS,
                                  "latency_us": 1.0}},
        "replicas": replicas,
    }


def predict_iteration_s(row: dict[str, Any]) -> float:
    return simulate(plan_dict(row)).iteration_s


def cases() -> list[Case]:
    return [
        Case(SOURCE, label(r), "iteration_time_s", r["iteration_s"],
             functools.partial(predict_iteration_s, r),
             notes="whole plan, DP simulated; the run's logged iteration time")
        for r in rows()
    ]
