"""NVIDIA NeMo 24.07 pre-training performance table: GPT-3, Llama 2/3, Nemotron on DGX H100, FP8.

Each row becomes a whole plan (every data-parallel replica, the DP sync simulated) written from
the published configuration: the table's GPUs, global and micro batch, sequence, TP / PP / CP /
VP, and the model and training settings of the NeMo-Framework-Launcher config of the same model
and release (data file header): model shape, sequence parallelism, TP communication overlap
(``ub_tp_comm_overlap``), activation recompute, gradient reduce dtype (``grad_sync_dtype``),
dropout. Common to every row: FP8 GEMMs (Transformer Engine, hybrid E4M3/E5M2, ``fp8=true``),
BF16 parameters, NeMo's ``distributed_fused_adam`` (Apex DistributedFusedAdam: optimizer state
and gradients sharded over the data-parallel ranks, ZeRO-2 here) with overlapped grad reduce and
param gather (``overlap_grad_sync`` / ``overlap_param_sync``), fused attention
(``NVTE_FUSED_ATTN=1``), DGX H100 servers (8 GPUs on NVSwitch, one 400 Gb/s NIC per GPU).

Assumptions, global to the source (docs/validation.md): a non-blocking rail-optimized
leaf-spine (the DGX SuperPOD's rail-optimized fabric; ``coarsen: auto`` simulates one replica
of a leaf-spine plan with every DP ring kept); NCCL's DP
rings through every NIC of a server (:func:`validation._plans.dp_channels`); Nemotron's
squared-ReLU MLP as a non-gated MLP (its rotary embedding and LayerNorm1p as the GPT kernels);
the vocabulary padded to a multiple of 128 only (not also to a multiple of TP).

Metric: the iteration time the row implies, ``global batch x sequence / (GPUs x tokens/s/GPU)``.
"""

from __future__ import annotations

from typing import Any

from validation._plans import dp_channels, iteration_cases, read_rows, uniform_plan
from validation.framework import DATA, Case

SOURCE = "nemo-h100"
CSV_FILE = DATA / "nemo_2407_h100_fp8.csv"
DEVICE = "H100-80GB"
FAST_GPUS = 8  # rows with at most this many GPUs are in the CI subset
INT_COLS = ("gpus", "global_batch", "micro_batch", "seq_len", "tp", "pp", "cp", "vp", "layers",
            "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_par", "tp_overlap",
            "dropout")


def rows() -> list[dict[str, Any]]:
    out = []
    for r in read_rows(CSV_FILE):
        d: dict[str, Any] = dict(r)
        for k in INT_COLS:
            d[k] = int(r[k])
        d["tokens_per_s_per_gpu"] = float(r["tokens_per_s_per_gpu"])
        out.append(d)
    return out


def label(row: dict[str, Any]) -> str:
    par = f"tp{row['tp']} pp{row['pp']}" + (f" cp{row['cp']}" if row["cp"] > 1 else "")
    return f"{row['model']} {par} {row['gpus']}gpu"


def measured_iteration_s(row: dict[str, Any]) -> float:
    """Tokens of one iteration over the published aggregate tokens/s."""
    tokens = row["global_batch"] * row["seq_len"]
    return tokens / (row["gpus"] * row["tokens_per_s_per_gpu"])


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The row as a whole plan (see the module docstring for what is published and assumed)."""
    model = {"name": row["model"].lower(), "layers": row["layers"], "hidden": row["hidden"],
             "ffn_hidden": row["ffn_hidden"], "heads": row["heads"],
             "kv_heads": row["kv_heads"], "seq_len": row["seq_len"], "vocab": row["vocab"],
             "dtype": "bf16", "gated_mlp": row["mlp"] == "swiglu"}
    training: dict[str, Any] = {
        "global_batch": row["global_batch"],
        "micro_batch": row["micro_batch"],
        "zero_stage": 2,  # Apex DistributedFusedAdam: optimizer state and gradients sharded
        "sequence_parallel": bool(row["seq_par"]),
        "recompute": row["recompute"],
        "precision": "fp8",
        "dropout": bool(row["dropout"]),
        "grad_reduce_dtype": row["grad_sync"],
        "overlap": {"tp_comm": bool(row["tp_overlap"]), "dp_grad_reduce": True,
                    "param_gather": True},
    }
    if row["vp"] > 1:
        training.update(schedule="interleaved", virtual_stages=row["vp"])
    else:
        training["schedule"] = "1f1b"
    network = {"scale_out": {"topology": "leaf_spine", "rail_optimized": True, "link_gbps": 400,
                             "latency_us": 1.0}}
    name = f"nemo-h100-{row['model'].lower()}-{row['gpus']}"
    d = uniform_plan(name, model, training, DEVICE, row["gpus"], row["tp"], row["pp"],
                     network=network, cp=row["cp"])
    d["collectives"] = {"channels": dp_channels(row["tp"])}  # DP rings over every NIC
    return d


def cases() -> list[Case]:
    return iteration_cases(SOURCE, rows(), label, measured_iteration_s, plan_dict,
                           "whole plan, DP simulated; fp8; launcher config",
                           fast=lambda r: r["gpus"] <= FAST_GPUS)
