"""Megatron-LM README weak-scaling table: GPT 1.7B-462B on 48-6,144 H100 (Megatron-Core r0.8.0).

Each row becomes a whole plan (every data-parallel replica, the DP sync simulated) written from
the published configuration: GPT shape (heads, hidden, layers; ffn = 4h, vocabulary 131,072,
sequence 4,096), TP / PP / DP and global batch per row, bf16 mixed precision, Megatron's
distributed optimizer (ZeRO-1) with ``--overlap-grad-reduce --overlap-param-gather``, TP
communication overlap (``--tp-comm-overlap``, which needs sequence parallelism), H100-80GB in
DGX H100 servers (8 GPUs, NVSwitch, one 400 Gb/s NIC per GPU). Assumptions, global to the
source (docs/validation.md): micro-batch 1, the interleaved schedule with the smallest depth
Megatron allows (:func:`schedule`), no activation recompute, FlashAttention
(Transformer Engine's fused attention), a non-blocking rail-optimized leaf-spine (the DGX
SuperPOD's rail-optimized fabric; ``coarsen: auto`` simulates one replica of a leaf-spine plan
with every DP ring kept), NCCL's DP rings through every NIC of a server.

Metric: the iteration time the row implies, ``F / (GPUs x TFLOP/s per GPU)`` with F Megatron's
own FLOP count (:func:`validation._plans.megatron_flops`).
"""

from __future__ import annotations

from typing import Any

from validation._plans import (
    dp_channels,
    iteration_cases,
    megatron_flops,
    read_rows,
    uniform_plan,
)
from validation.framework import DATA, Case

SOURCE = "megatron-core-h100"
CSV_FILE = DATA / "megatron_core_h100_weak_scaling.csv"

SEQ_LEN = 4096
VOCAB = 131072
DEVICE = "H100-80GB"
MICRO_BATCH = 1  # not stated; Megatron-LM's GPT example scripts use 1
FAST_GPUS = 96  # rows with at most this many GPUs are in the CI subset (seconds each)
HEAVY_GPUS = 3072  # rows with this many GPUs or more run with --heavy


def rows() -> list[dict[str, Any]]:
    return [{k: (v if k == "params" else float(v)) for k, v in r.items()}
            for r in read_rows(CSV_FILE)]


def label(row: dict[str, Any]) -> str:
    return f"{row['params']} tp{int(row['tp'])} pp{int(row['pp'])} {int(row['gpus'])}gpu"


def measured_iteration_s(row: dict[str, Any]) -> float:
    """Megatron's FLOPs of one iteration over the published aggregate rate."""
    h, layers, heads = int(row["hidden"]), int(row["layers"]), int(row["heads"])
    f = megatron_flops(int(row["global_batch"]), SEQ_LEN, layers, h, 4 * h, heads, heads, VOCAB,
                       swiglu=False)
    return f / (row["gpus"] * row["tflops_per_gpu"] * 1e12)


def schedule(layers: int, pp: int) -> dict[str, Any]:
    """The pipeline schedule: interleaved with the smallest v >= 2 Megatron allows (it must
    divide the layers per stage), 1F1B without a pipeline. The README's "pipeline-parallel
    communication (enabled by default)" overlap exists only for Megatron-Core's interleaved
    schedule; its depth is not stated, so the smallest."""
    if pp == 1:
        return {"schedule": "1f1b"}
    per = layers // pp
    v = next(k for k in range(2, per + 1) if per % k == 0)
    return {"schedule": "interleaved", "virtual_stages": v}


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The row as a whole plan (see the module docstring for what is published and assumed)."""
    tp, pp, gpus, h = int(row["tp"]), int(row["pp"]), int(row["gpus"]), int(row["hidden"])
    model = {"name": f"gpt-{row['params']}", "layers": int(row["layers"]), "hidden": h,
             "ffn_hidden": 4 * h, "heads": int(row["heads"]), "seq_len": SEQ_LEN,
             "vocab": VOCAB, "dtype": "bf16", "gated_mlp": False}
    training = {
        "global_batch": int(row["global_batch"]),
        "micro_batch": MICRO_BATCH,
        **schedule(int(row["layers"]), pp),
        "zero_stage": 1,
        "sequence_parallel": tp > 1,
        "recompute": "none",
        "precision": "bf16",
        "overlap": {"tp_comm": tp > 1, "dp_grad_reduce": True, "param_gather": True},
    }
    network = {"scale_out": {"topology": "leaf_spine", "rail_optimized": True, "link_gbps": 400,
                             "latency_us": 1.0}}
    d = uniform_plan(f"megatron-h100-{row['params']}", model, training, DEVICE, gpus, tp, pp,
                     network=network)
    d["collectives"] = {"channels": dp_channels(tp)}  # DP rings over every NIC of a server
    return d


def cases() -> list[Case]:
    return iteration_cases(SOURCE, rows(), label, measured_iteration_s, plan_dict,
                           "whole plan, DP simulated; mbs 1",
                           fast=lambda r: r["gpus"] <= FAST_GPUS,
                           heavy=lambda r: r["gpus"] >= HEAVY_GPUS)
