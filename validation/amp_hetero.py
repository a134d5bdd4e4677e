"""AMP's real trials: GPT-2 (345M) on 16 T4, and on 12 V100 + 4 T4 with slow and mixed networks.

Source: the experiment logs of AMP (NeurIPS 2022, github.com/MccRee177/AMP): every trial's
parallel configuration (micro-batch, TP ``mp``, DP, PP, DeepSpeed's layer partition) and its
measured seconds per iteration (data file header). Each trial becomes a whole plan with explicit
replicas: DeepSpeed's rank order (pipeline outermost, then data, then model parallelism; rank r
on server r // 4), the stage layer ranges from the partition, every replica with the same
micro-batches (DeepSpeed splits the batch evenly), global batch 32.

Published and taken as is: GPT-2 shape (24 layers, hidden 1024, 16 heads, sequence 1024,
vocabulary 52256), fp16 with fp32 gradient all-reduce (``fp32_allreduce: true``), servers of 4
GPUs (g4dn.12xlarge: T4 on PCIe Gen3, one 50 Gb/s NIC; p3.8xlarge: V100-16GB on NVLink, one
10 Gb/s NIC).

Assumptions, global to the source (docs/validation.md): the software of 2020-2021 (Megatron-LM
v1.1.5 in DeepSpeed's pipeline engine): unfused attention with dropout, no gradient
accumulation fusion, no activation recompute, no ZeRO, the gradient all-reduce after the whole
pipeline schedule (no overlap); the p3.8xlarge V100s one NVLink per GPU pair; the g4dn.12xlarge
T4s under one PCIe Gen3 switch; a non-blocking leaf-spine between the servers. Rows whose
partition leaves a stage without a transformer layer cannot be written as a plan and are left
out.
"""

from __future__ import annotations

import functools
from typing import Any

from validation._plans import read_rows, simulate
from validation.framework import DATA, Case

SOURCE = "amp-hetero"
CSV_FILE = DATA / "amp_gpt2_t4_v100.csv"
GLOBAL_BATCH = 32
LAYERS = 24
GPUS_PER_NODE = 4
# DeepSpeed's 30-entry layer list: [embedding, noop, 24 transformer layers, noop, noop, head, noop]
FIRST_LAYER_ENTRY = 2
MODEL = {"name": "gpt2-345m", "layers": LAYERS, "hidden": 1024, "ffn_hidden": 4096,
         "heads": 16, "kv_heads": 16, "seq_len": 1024, "vocab": 52256, "dtype": "fp16",
         "gated_mlp": False}
T4_SERVER = {"fabric": "pcie", "pcie": {"gen": 3, "lanes": 16, "gpus_per_switch": 4},
             "nics": "per_server"}
V100_SERVER = {"fabric": "nvlink_mesh", "nics": "per_server",
               "nvlink": [[a, b, 1] for a in range(4) for b in range(a + 1, 4)]}
FAST = 6  # the first rows of each cluster in the CI subset (16 GPUs, seconds each)


def stage_layers(partition: list[int]) -> list[tuple[int, int]] | None:
    """Transformer layers [start, stop) of each stage, or None if a stage has none."""
    def layer(entry: int) -> int:
        return min(max(entry - FIRST_LAYER_ENTRY, 0), LAYERS)

    out = [(layer(a), layer(b)) for a, b in zip(partition[:-1], partition[1:], strict=True)]
    return out if all(b > a for a, b in out) else None


def rows() -> list[dict[str, Any]]:
    out = []
    for r in read_rows(CSV_FILE):
        part = [int(x) for x in r["partition"].split(";")]
        layers = stage_layers(part)
        if layers is None:
            continue
        out.append({"cluster": r["cluster"], "micro_batch": int(r["micro_batch"]),
                    "tp": int(r["tp"]), "dp": int(r["dp"]), "pp": int(r["pp"]),
                    "partition": part, "layers": layers, "measured_s": float(r["measured_s"])})
    return out


def label(row: dict[str, Any]) -> str:
    cuts = "-".join(str(b - a) for a, b in row["layers"])
    return (f"{row['cluster']} mbs{row['micro_batch']} tp{row['tp']} dp{row['dp']} "
            f"pp{row['pp']} [{cuts}]")


def _device(rank: int, cluster: str) -> tuple[str, int]:
    """(group, device index) of global rank ``rank``."""
    if cluster == "t4x16":
        return "t4", rank
    return ("v100", rank) if rank < 12 else ("t4", rank - 12)


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The trial as a plan (see the module docstring)."""
    tp, dp, pp, cluster = row["tp"], row["dp"], row["pp"], row["cluster"]
    groups: dict[str, Any] = {}
    if cluster == "t4x16":
        groups["t4"] = {"type": "T4", "nodes": 4, "gpus_per_node": 4, "nic_gbps": 50,
                        "server": T4_SERVER}
    else:
        groups["v100"] = {"type": "V100-16GB", "nodes": 3, "gpus_per_node": 4, "nic_gbps": 10,
                          "server": V100_SERVER}
        groups["t4"] = {"type": "T4", "nodes": 1, "gpus_per_node": 4, "nic_gbps": 50,
                        "server": T4_SERVER}
    micro = GLOBAL_BATCH // (row["micro_batch"] * dp)
    replicas = []
    for d in range(dp):
        stages = []
        for p, layers in enumerate(row["layers"]):
            first = p * dp * tp + d * tp  # DeepSpeed topology: pipe, data, model
            group, dev = _device(first, cluster)
            stages.append({"group": group, "devices": [dev, dev + tp], "tp": tp,
                           "layers": list(layers)})
        replicas.append({"stages": stages, "micro_batches": micro})
    return {
        "name": f"amp-{cluster.replace('+', '_')}-{row['micro_batch']}-{tp}-{dp}-{pp}",
        "model": MODEL,
        "training": {"global_batch": GLOBAL_BATCH, "micro_batch": row["micro_batch"],
                     "schedule": "1f1b", "precision": "fp16", "flash_attention": False,
                     "dropout": True, "recompute": "none", "zero_stage": 0,
                     "grad_reduce_dtype": "fp32", "grad_accumulation_fusion": False,
                     "overlap": {"dp_grad_reduce": False, "param_gather": False}},
        "device_groups": groups,
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": 50,
                                  "nodes_per_leaf": 4, "latency_us": 1.0}},
        "replicas": replicas,
    }


def predict_iteration_s(row: dict[str, Any]) -> float:
    return simulate(plan_dict(row)).iteration_s


def cases() -> list[Case]:
    out = []
    seen: dict[str, int] = {}
    for r in rows():
        seen[r["cluster"]] = seen.get(r["cluster"], 0) + 1
        out.append(Case(SOURCE, label(r), "iteration_time_s", r["measured_s"],
                        functools.partial(predict_iteration_s, r),
                        fast=seen[r["cluster"]] <= FAST,
                        notes="measured trial; explicit replicas, DeepSpeed rank order"))
    return out
