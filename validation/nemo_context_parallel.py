"""NeMo context-parallel (long-sequence) training on H100: Llama 2 7B up to 1M tokens, Llama 3.

Sources (rows and provenance in ``validation/data/nemo_context_parallel_h100.csv``):

- NVIDIA/NeMo ``docs/source/performance/performance_long_sequence.md``, table "LLAMA2-7B (FP8)
  - H100" (container NeMo 24.03.01, DGX-H100): with context parallelism, sequence lengths 32K
  to 1024K on as many GPUs as thousands of tokens, the TP / PP / DP / CP mapping and global
  batch of each row, and the achieved model TFLOP/s per GPU;
- NVIDIA/NeMo ``docs/source/performance/performance_summary.md`` (container NeMo 24.07,
  DGX-H100, FP8): the two pre-training rows that run CP 2 (Llama 3 8B and 70B at 8192 tokens),
  in tokens per second per GPU.

Each row is a plan from the published configuration alone (:func:`plan_dict`): the model preset
at the row's sequence length, FP8 GEMMs, micro-batch 1, the row's TP (with sequence parallelism
when TP > 1, NeMo's default), PP (interleaved with the row's VP), CP and DP (the plan's
replicas are DP x CP: a CP group is ``cp`` consecutive replicas), the distributed optimizer
(ZeRO-1), H100-80GB servers of 8 GPUs with 400 Gb/s NICs on a non-blocking leaf-spine fabric.
No recompute is set (the sources do not say): every plan passes the memory check without it
(the tightest, Llama 3 8B with fp32 gradient buffers, needs 80.6 GB of the 85.52 GB an H100
reports).

Metrics: ``tflops_per_gpu`` is the trace's model FLOPs / (GPUs x simulated iteration time). The
trace counts the terms of Megatron-LM's ``num_floating_point_operations`` as of 2024 (and of
NeMo 2.0's first ``flops_formulas.llama2``): every GEMM and the full ``4 b s^2 h`` attention
core, no causal halving. That NeMo 24.03's table used this convention is an assumption (the
page does not give its formula); with causal halving the measured values would correspond to
about 1.5-1.9x more work at these lengths. ``tokens_per_s_per_gpu`` is global batch x sequence
/ (iteration time x GPUs), convention-free.

Trace sizes (flow backend, one core): 0.5 M ops (32K) to 2.3 M (256K); the 512K and 1024K rows
(512 and 1024 GPUs, ~5 M and ~10 M ops) are heavy.
"""

from __future__ import annotations

from typing import Any

from validation._plans import uniform_plan
from validation.framework import DATA, Case, read_rows, row_case, simulate_summary

SOURCE = "nemo-cp"
MEASURED = DATA / "nemo_context_parallel_h100.csv"
GPUS_PER_NODE = 8  # DGX-H100
NIC_GBPS = 400  # 8 x 400 Gb/s ConnectX-7 per DGX-H100
HEAVY_GPUS = 512  # the 512K and 1024K rows: millions of ops each


def rows() -> list[dict[str, Any]]:
    return read_rows(MEASURED)


def plan_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The published configuration as a plan (see the module docstring)."""
    gpus, tp, pp, cp, dp, vp = (int(row[k]) for k in ("gpus", "tp", "pp", "cp", "dp", "vp"))
    assert tp * pp * cp * dp == gpus, row  # the table's mapping covers its GPUs
    training: dict[str, Any] = {
        "global_batch": int(row["global_batch"]), "micro_batch": int(row["micro_batch"]),
        "zero_stage": 1, "sequence_parallel": tp > 1, "precision": row["precision"],
    }
    if vp > 1:
        training.update(schedule="interleaved", virtual_stages=vp)
    # Megatron-Core's rank order (tp-cp-ep-dp-pp; docs/plan.md)
    return uniform_plan(f"nemo-cp-{row['model']}-{int(row['seq_len']) // 1024}k",
                        {"preset": row["model"], "seq_len": int(row["seq_len"])}, training,
                        "H100-80GB", gpus, tp, pp, gpus_per_node=GPUS_PER_NODE,
                        network={"scale_out": {"topology": "leaf_spine",
                                               "link_gbps": NIC_GBPS}},
                        cp=cp)


def predict(row: dict[str, Any]) -> float:
    """The row's metric, simulated on the flow backend."""
    plan, s = simulate_summary(plan_dict(row))
    it_s = s["iteration_time_ns"] * 1e-9
    if row["metric"] == "tflops_per_gpu":
        return float(s["flop_count"]) / (plan.num_ranks * it_s) / 1e12
    return int(row["global_batch"]) * int(row["seq_len"]) / (it_s * plan.num_ranks)


def cases() -> list[Case]:
    """One case per row of the CSV."""
    return [
        row_case(SOURCE, f"{r['model']} {int(r['seq_len']) // 1024}k tp{r['tp']} pp{r['pp']} "
                 f"cp{r['cp']} dp{r['dp']} {r['gpus']}gpu", r, predict,
                 heavy=int(r["gpus"]) >= HEAVY_GPUS,
                 notes=f"NeMo {r['table']}; FP8; no recompute set; whole iteration simulated")
        for r in rows()
    ]
