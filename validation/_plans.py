"""Shared helpers of the training-throughput sources: plan dicts, one simulation, FLOP formulas.

Every source module writes its plans with :func:`uniform_plan` (one device group, Megatron's
rank order: TP innermost, then the pipeline, then data parallelism) or its own explicit
replicas, and predicts with :func:`simulate`: the whole plan (every data-parallel replica, the
DP sync simulated, ``coarsen: auto``), generated and replayed on the flow backend with the
shipped defaults. Nothing here is fitted.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Simulated:
    """What one simulated iteration gives a case."""

    iteration_s: float
    flop_count: float  # the trace's model FLOPs (GEMMs + attention scores, backward 2x)
    ranks: int
    ops: int


def simulate(plan: dict[str, Any]) -> Simulated:
    """Generate and replay ``plan`` (a plan dict) on the flow backend; the iteration time
    (:func:`validation.framework.simulate_summary`, without the memory check)."""
    from validation.framework import simulate_summary

    p, s = simulate_summary(plan)
    return Simulated(s["iteration_time_ns"] * 1e-9, float(s["flop_count"]), p.num_ranks,
                     int(s["num_ops"]))


def dp_channels(tp: int, nics_per_server: int = 8) -> int:
    """NCCL channels for a plan whose DP rings run through every NIC of a server: a server's
    ``nics_per_server / tp`` DP ranks of one ring each leave through their own NIC (NCCL builds
    one ring per NIC; docs/collectives.md). TP rings stay inside the server, so the channels do
    not change them. (Branch nccl makes this the default as ``channels: auto``.)"""
    return max(1, nics_per_server // tp)


def lighter_edge_stages(layers: int, pp: int) -> list[tuple[int, int]]:
    """Layer ranges of ``pp`` stages whose first and last stage hold one layer fewer than the
    others (the embedding and the output layer weigh as one layer each: BLOOM's
    'type:transformer|embedding' split, Llama 3's balanced stages)."""
    per = (layers + 2) // pp
    sizes = [per - 1] + [per] * (pp - 2) + [per - 1]
    if sum(sizes) != layers:
        raise ValueError(f"{layers} layers do not split as {per - 1}, {per} x {pp - 2}, {per - 1}")
    out, a = [], 0
    for n in sizes:
        out.append((a, a + n))
        a += n
    return out


def predict_iteration_s(plan_dict: Callable[[Any], dict[str, Any]], row: Any) -> float:
    """The simulated iteration (s) of the whole plan ``plan_dict(row)``."""
    return simulate(plan_dict(row)).iteration_s


def iteration_cases(source: str, rows: Sequence[Any], label: Callable[[Any], str],
                    measured: Callable[[Any], float], plan_dict: Callable[[Any], dict[str, Any]],
                    notes: str, fast: Callable[[Any], bool] = lambda r: False,
                    heavy: Callable[[Any], bool] = lambda r: False) -> list[Any]:
    """One ``iteration_time_s`` case per row: measured from ``measured``, predicted by simulating
    ``plan_dict(row)``."""
    from validation.framework import Case

    return [Case(source, label(r), "iteration_time_s", measured(r),
                 functools.partial(predict_iteration_s, plan_dict, r), fast=fast(r),
                 heavy=heavy(r), notes=notes) for r in rows]


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a data CSV (comment lines starting with ``#`` are provenance, skipped)."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def megatron_flops(batch: int, seq: int, layers: int, hidden: int, ffn: int, heads: int,
                   kv_heads: int, vocab: int, swiglu: bool) -> float:
    """Model FLOPs of one iteration as Megatron-LM counts them (``num_floating_point_operations``
    in megatron/training/training.py, core_r0.8.0): forward + backward (3x forward) of the QKV,
    attention scores and context (no causal halving), projection, MLP and logits GEMMs."""
    gated = 1.5 if swiglu else 1.0
    attn = (1 + kv_heads / heads + seq / hidden)  # query size = hidden (kv_channels x heads)
    mlp = ffn / hidden * gated
    logit = vocab / (2 * layers * hidden)
    return 12.0 * batch * seq * layers * hidden * hidden * (attn + mlp + logit)


# Megatron-LM, Megatron-Core and NeMo place ranks TP innermost and the pipeline outermost
# (Megatron-Core parallel_state.RankGenerator, default order "tp-cp-ep-dp-pp"; Megatron-LM 2021's
# initialize_model_parallel: pipeline groups are ranks i, i + N/pp, ...): a stage's DP, CP and EP
# peers are neighbours and the pipeline crosses servers. Only plans whose TP x PP does not fill
# whole servers see a difference.
MEGATRON_ORDER = "tp-dp-pp"


def uniform_plan(
    name: str,
    model: dict[str, Any],
    training: dict[str, Any],
    device: str,
    gpus: int,
    tp: int,
    pp: int,
    gpus_per_node: int = 8,
    network: dict[str, Any] | None = None,
    device_types: dict[str, Any] | None = None,
    group: dict[str, Any] | None = None,
    cp: int = 1,
    order: str = MEGATRON_ORDER,
    stage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plan dict: ``gpus`` devices of type ``device`` in servers of ``gpus_per_node``, one
    ``uniform`` replica block of TP ``tp`` x PP ``pp`` x ``gpus / (tp pp)`` replicas, of which
    ``cp`` consecutive ones form a CP group (docs/moe.md): DP ``gpus / (tp pp cp)``. ``order``:
    the block's device order (docs/plan.md), Megatron-Core's by default; ``stage``: more keys
    of the block (``ep``, ``etp``)."""
    dp = gpus // (tp * pp)  # replicas; CP groups are cp consecutive replicas
    if dp * tp * pp != gpus or dp % cp:
        raise ValueError(f"{name}: {gpus} GPUs are not a multiple of tp x pp x cp")
    gpn = min(gpus_per_node, gpus)
    uniform: dict[str, Any] = {"group": "g", "tp": tp, "pp": pp, "dp": dp, "order": order,
                               **(stage or {})}
    if cp > 1:
        uniform["cp"] = cp
    d: dict[str, Any] = {
        "name": name,
        "model": model,
        "training": training,
        "device_groups": {"g": {"type": device, "nodes": gpus // gpn, "gpus_per_node": gpn,
                                **(group or {})}},
        "network": network or {"scale_out": {"topology": "leaf_spine", "link_gbps": 400,
                                             "latency_us": 1.0}},
        "replicas": {"uniform": uniform},
    }
    if device_types:
        d["device_types"] = device_types
    return d


__all__ = ["MEGATRON_ORDER", "Simulated", "dp_channels", "iteration_cases", "lighter_edge_stages",
           "megatron_flops", "predict_iteration_s", "read_rows", "simulate", "uniform_plan"]
