"""MegaScale (NSDI '24) Table 2, the Megatron-LM baseline: a 175B GPT on 256-12,288 A100 GPUs.

The paper measures Megatron-LM (commit 285068c8) beside its own system on the same cluster and
publishes the iteration time of each run. Each row becomes a whole plan (every data-parallel
replica, the DP sync simulated) written from the published configuration (data file header):
the 175B shape (128 heads, hidden 12,288, 96 layers, ffn 4h, sequence 2,048, vocabulary
64,000), TP 8, PP 8, the interleaved schedule with six model chunks per stage, the global batch
per row, eight 200 Gb/s NICs per 8-GPU server wired multi-rail into a non-blocking Clos.

Assumptions, global to the source (docs/validation.md): A100-80GB in HGX servers (NVSwitch);
bf16; micro-batch 1; sequence parallelism and Megatron's distributed optimizer (ZeRO-1);
**no** communication overlap of the DP, TP or PP traffic (the paper's ablation, Table 3,
credits every overlap to MegaScale, not to the baseline); Megatron's unfused attention core
(MegaScale adds FlashAttention-2 as one of its "efficient operators") with selective activation
recompute and GPT-3 dropout; a two-tier rail-optimized leaf-spine standing in for the
three-tier Clos (both non-blocking).
"""

from __future__ import annotations

import functools
from typing import Any

from validation._plans import read_rows, simulate, uniform_plan
from validation.framework import DATA, Case

SOURCE = "megascale-megatron"
CSV_FILE = DATA / "megascale_megatron_175b_a100.csv"
DEVICE = "A100-80GB"
MODEL = {"name": "gpt-175b-v64k", "layers": 96, "hidden": 12288, "ffn_hidden": 4 * 12288,
         "heads": 128, "seq_len": 2048, "vocab": 64000, "dtype": "bf16", "gated_mlp": False}
TP, PP, VIRTUAL_STAGES = 8, 8, 6  # Table 1 and section 6.1
NIC_GBPS = 200
MICRO_BATCH = 1
HEAVY_GPUS = 3072  # rows with this many GPUs or more run with --heavy


def rows() -> list[dict[str, Any]]:
    return [{"batch": int(r["batch"]), "gpus": int(r["gpus"]),
             "iteration_s": float(r["iteration_s"])} for r in read_rows(CSV_FILE)]


def label(row: dict[str, Any]) -> str:
    return f"175B batch{row['batch']} {row['gpus']}gpu"


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    training = {
        "global_batch": row["batch"], "micro_batch": MICRO_BATCH,
        "schedule": "interleaved", "virtual_stages": VIRTUAL_STAGES,
        "zero_stage": 1, "sequence_parallel": True, "recompute": "selective",
        "flash_attention": False, "dropout": True, "precision": "bf16",
        "overlap": {"tp_comm": False, "dp_grad_reduce": False, "param_gather": False},
    }
    network = {"scale_out": {"topology": "leaf_spine", "rail_optimized": True,
                             "link_gbps": NIC_GBPS, "latency_us": 1.0}}
    d = uniform_plan(f"megascale-megatron-{row['gpus']}", MODEL, training, DEVICE,
                     row["gpus"], TP, PP, network=network,
                     device_types={DEVICE: {"nic_gbps": NIC_GBPS}})
    # one pipelined piece per ring edge: step-level rings of up to 192 replicas would exceed
    # the trace limit (docs/scale.md measures the difference); the same for every row
    d["collectives"] = {"granularity": "chunked", "chunks": 1}
    return d


def predict_iteration_s(row: dict[str, Any]) -> float:
    return simulate(plan_dict(row)).iteration_s


def cases() -> list[Case]:
    return [
        Case(SOURCE, label(r), "iteration_time_s", r["iteration_s"],
             functools.partial(predict_iteration_s, r), heavy=r["gpus"] >= HEAVY_GPUS,
             notes="whole plan, DP simulated; Megatron-LM baseline, no overlap")
        for r in rows()
    ]
