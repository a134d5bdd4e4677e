"""Megatron-LM SC21 (Narayanan et al., arXiv 2104.04473) Table 1: GPT on A100 (Selene).

Each row becomes a plan written from the published configuration alone (the assumptions are
listed in docs/validation.md and in :func:`plan_dict`), simulated on the flow backend. The
compared metric is the iteration time the paper's numbers imply: ``t = F / (GPUs x TFLOP/s per
GPU)`` with F from the paper's Eq. 3 (the ``derived_iter_time_s`` column of the data file).

The whole plan is simulated: every data-parallel replica and the DP gradient all-reduce,
which Megatron-LM's 2021 ``local`` DDP runs after the whole backward pass (no overlap), in fp16,
on NCCL rings over all eight HDR NICs of each server (8 channels). :func:`dp_allreduce_s` is the
analytic ring bound of that all-reduce for a DP group of one GPU per server (TP 8 rows), which
the tests hold the simulation to; earlier versions of this source added it to one simulated
replica instead.
"""

from __future__ import annotations

import csv
import functools
from typing import Any

from validation._plans import dp_channels, simulate
from validation.framework import DATA, Case

SOURCE = "megatron-sc21"
CSV_FILE = DATA / "megatron_sc21_table1_a100.csv"

# --- the published setup (paper §5, data README) and the assumptions, one place -------------
SEQ_LEN = 2048
VOCAB = 51200
GPUS_PER_NODE = 8  # DGX A100
NIC_GBPS = 200  # one HDR InfiniBand NIC per GPU on Selene
DEVICE = "A100-80GB"
# Not stated in Table 1: micro-batch 1 is what Megatron-LM's own GPT-3 175B example script
# (examples/pretrain_gpt3_175B.sh: --micro-batch-size 1) uses; an assumption for every row.
MICRO_BATCH = 1
# Interleaved 1F1B as the paper ran it; its depth is not stated, so the smallest interleaving,
# v = 2 model chunks per stage, for every row with PP > 1 (every such row's micro-batch count is
# a multiple of PP, as Megatron requires). 1 means plain 1F1B.
VIRTUAL_STAGES = 2
GRAD_BYTES = 2  # fp16 gradients all-reduced (Megatron 2021 default: no fp32 grad accumulation)
# NCCL ring latency per inter-node step, Simple protocol: baseLat 8.4 us once + hwLat NET 14 us
# per step (NCCL src/graph/tuning.cc, gpu-calibration.md §6).
NCCL_BASE_US = 8.4
NCCL_NET_STEP_US = 14.0
# Rows small enough for CI (one replica of at most 4 GPUs: seconds on the flow backend).
FAST_GPUS_PER_REPLICA = 4
# Rows whose one replica is more than ~15 M trace ops (PP 35 and 64: 280 and 512 micro-batches
# of 8-way TP rings) are heavy: left out of a default run, included with --heavy.
HEAVY_OPS = 15_000_000


def replica_ops_estimate(row: dict[str, Any]) -> int:
    """Trace ops of one replica: per micro-batch and layer 6 units (fwd, recompute, bwd x
    attention, MLP), each tp compute ops + a ring all-reduce of 2(tp-1) steps x tp flows."""
    tp, dp = int(row["tp"]), int(row["dp_derived"])
    mbs = int(row["global_batch"]) // dp
    ring = 2 * (tp - 1) * tp if tp > 1 else 0
    return mbs * int(row["layers"]) * 6 * (tp + ring)


@functools.cache
def rows() -> list[dict[str, Any]]:
    """The data file's rows with numeric fields."""
    with open(CSV_FILE, newline="") as fh:
        out = []
        for r in csv.DictReader(fh):
            out.append({k: float(v) for k, v in r.items()})
    return out


def label(row: dict[str, Any]) -> str:
    return f"{row['params_B']:g}B tp{int(row['tp'])} pp{int(row['pp'])} {int(row['gpus'])}gpu"


def plan_dict(row: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    """The row as a whole plan (YAML-ready dict); ``replicas``: simulate only that many
    data-parallel replicas with their share of the batch (1: one replica, no DP sync)."""
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp_derived"])
    h = int(row["hidden"])
    n = dp if replicas is None else replicas
    gpus = tp * pp * n
    gpn = min(GPUS_PER_NODE, gpus)
    return {
        "name": f"sc21-{row['params_B']:g}b",
        "model": {
            "name": f"gpt-{row['params_B']:g}b",
            "layers": int(row["layers"]),
            "hidden": h,
            "ffn_hidden": 4 * h,
            "heads": int(row["heads"]),
            "seq_len": SEQ_LEN,
            "vocab": VOCAB,
            "dtype": "fp16",
            "gated_mlp": False,  # GPT: GELU, LayerNorm, learned positions
        },
        "training": {
            "global_batch": int(row["global_batch"]) // dp * n,  # the simulated replicas' share
            "micro_batch": MICRO_BATCH,
            **(
                {"schedule": "interleaved", "virtual_stages": VIRTUAL_STAGES}
                if pp > 1 and VIRTUAL_STAGES > 1
                else {"schedule": "1f1b"}
            ),
            "recompute": "full",  # full activation recomputation (paper §5)
            "precision": "fp16",
            "flash_attention": False,  # 2021: fused scale-mask-softmax, scores materialized
            "dropout": True,  # GPT-3 style attention and hidden dropout
            # Megatron-LM gained gradient accumulation fusion in 2022-02 (commit 83b1e42f30),
            # after the paper: its 2021 runs add each weight gradient in a separate kernel
            "grad_accumulation_fusion": False,
            "zero_stage": 0,  # 2021: no distributed optimizer
            "overlap": {"dp_grad_reduce": False},  # local DDP: after the whole backward
        },
        "device_groups": {
            "a100": {"type": DEVICE, "nodes": gpus // gpn, "gpus_per_node": gpn}
        },
        "network": {"scale_out": {"topology": "leaf_spine", "rail_optimized": True,
                                  "link_gbps": NIC_GBPS, "latency_us": 1.0}},
        "device_types": {DEVICE: {"nic_gbps": NIC_GBPS}},
        "replicas": {"uniform": {"group": "a100", "tp": tp, "pp": pp, "dp": n}},
        # NCCL spreads each DP ring over all of a server's NICs (docs/collectives.md)
        "collectives": {"channels": dp_channels(tp, GPUS_PER_NODE)},
    }


def stage_grad_bytes(row: dict[str, Any]) -> float:
    """Gradient bytes one GPU all-reduces: the largest stage's parameters / tp (fp16)."""
    from xsim_adapters.plan.model import ModelSpec
    from xsim_adapters.plan.params import embedding_params, head_params, layer_params

    h = int(row["hidden"])
    m = ModelSpec("gpt", int(row["layers"]), h, 4 * h, int(row["heads"]), int(row["heads"]),
                  SEQ_LEN, VOCAB, "fp16", False)
    pp, tp = int(row["pp"]), int(row["tp"])
    per_stage = m.layers / pp * layer_params(m)
    extra = embedding_params(m) + (head_params(m) if pp == 1 else 0)
    return (per_stage + extra) / tp * GRAD_BYTES


def dp_allreduce_s(row: dict[str, Any]) -> float:
    """Ring all-reduce over the DP group at the NIC rate: 2(n-1)/n S/B + NCCL step latencies."""
    n = int(row["dp_derived"])
    if n <= 1:
        return 0.0
    nbytes = stage_grad_bytes(row)
    bw = NIC_GBPS / 8 * 1e9
    steps = 2 * (n - 1)
    return 2 * (n - 1) / n * nbytes / bw + (NCCL_BASE_US + steps * NCCL_NET_STEP_US) * 1e-6


def predict_iteration_s(row: dict[str, Any]) -> float:
    """The simulated iteration of the whole plan (flow backend, DP sync simulated), seconds."""
    return simulate(plan_dict(row)).iteration_s


def cases() -> list[Case]:
    """One case per Table 1 row; rows with <= FAST_GPUS_PER_REPLICA GPUs per replica are fast."""
    out = []
    for row in rows():
        per_replica = int(row["tp"]) * int(row["pp"])
        out.append(
            Case(
                source=SOURCE,
                label=label(row),
                metric="iteration_time_s",
                measured=row["derived_iter_time_s"],
                predict=functools.partial(predict_iteration_s, row),
                fast=per_replica <= FAST_GPUS_PER_REPLICA,
                heavy=replica_ops_estimate(row) > HEAVY_OPS,
                notes=(f"interleaved v={VIRTUAL_STAGES}" if int(row["pp"]) > 1 else "1f1b")
                + "; whole plan, DP all-reduce simulated",
            )
        )
    return out
