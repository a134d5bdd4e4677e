"""Per-device memory of every stage, and the feasibility check built on it.

Model (bytes per device of a stage's TP group, P = the stage's parameters / tp):
- weights ``P * dtype_bytes``; gradients ``P * g`` with g the gradient format's bytes
  (``training.grad_reduce_bytes``: 4 for bf16 parameters, Megatron's fp32 ``main_grad``
  buffer; 2 for fp16); Adam optimizer state ``12 P``
  (fp32 master copy, m and v). ZeRO-1 divides the optimizer state by the number of replicas
  owning the layers (every replica owns every layer once, so by ``dp``), ZeRO-2 also the
  gradients, ZeRO-3 also the weights.
- activations, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models"), per layer per micro-batch, s = seq_len, b = micro_batch, h = hidden, a = heads,
  t = tp, 16-bit activations:
    tensor parallel only:   s*b*h*(10 + 24/t) + 5*a*s^2*b/t
    with sequence parallel: s*b*h*34/t        + 5*a*s^2*b/t
  ``training.flash_attention`` (the default) drops the ``5*a*s^2*b/t`` score/softmax term: fused
  attention kernels keep only O(s) statistics for backward. ``recompute: selective`` drops the
  same term (Korthikanti et al. Sec. 5: the attention core is recomputed, so its s^2 tensors are
  not kept; with flash attention on it saves nothing more). With ``recompute: full`` a layer
  keeps only its 2*s*b*h input, plus one layer's full activations while it is recomputed.
  The last stage adds the output layer, 4*s*b*(h + v)/t (norm, logits and cross entropy).
- micro-batches in flight on stage i of a pp-stage pipeline running m micro-batches
  (:func:`in_flight_micro_batches`): 1F1B ``min(pp - i, m)``, GPipe ``m``, ZB-H1 ``min(pp, m)``
  (deferred W passes keep their inputs), interleaved the peak count of chunk forwards not yet
  backwarded in the stage's order divided by v (a chunk holds 1/v of the stage's layers).
- MoE (:func:`moe_activation_delta`, :func:`expert_params_per_device`): with ``ep`` > 1 the
  routed experts are not TP-split: a device holds its own experts (the most any device of the
  stage holds, under ``placement: by_speed``), and ZeRO shards their state over the
  expert-data-parallel group (``dp / (ep / tp)`` replicas) instead of ``dp``. Each MoE layer's
  activations replace the dense MLP's share by dispatch/combine buffers and the experts'
  activations for the ``top_k`` copies of every token.
- other attention shapes (``model.attention``): the TP-split attention terms (8 sbh for MHA)
  become :func:`attention_split_activations` (Q, K, V and projection input at their widths,
  MLA's latents); standard attention keeps the formula above (GQA not resolved in it).
- CP: a device of a CP group keeps the activations of ``s / cp`` tokens (the formulas above at
  ``seq_len / cp``); weights are not split by CP.
Capacity is the device type's ``hbm_GB`` (1 GB = 1e9 bytes; the presets give the capacity the
driver reports where it is measured, e.g. 85.52 GB for an "80 GB" H100: presets/devices.yaml);
no allowance for the CUDA context or fragmentation is made, so treat a headroom of a few GB as
tight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..errors import InfeasiblePlanError
from ..plan.attention import attention_dims, is_standard
from ..plan.model import ModelSpec, Plan
from ..plan.moe import expert_params, moe_layers_in, routed_expert_params
from ..plan.params import embedding_params, head_params, span_params
from ..workload.compute.routing import expert_counts
from ..workload.schedule import FWD, stage_order

OPTIMIZER_BYTES_PER_PARAM = 12  # Adam: fp32 master weights + m + v
GB = 1e9

def activation_bytes_per_layer(plan: Plan, tp: int) -> float:
    """Activation bytes one layer keeps per micro-batch per device, before recompute."""
    m, t = plan.model, plan.training
    s, b, h, a = m.seq_len, t.micro_batch, m.hidden, m.heads
    sbh = s * b * h
    if is_standard(m):  # Korthikanti et al.'s MHA terms, as they were
        linear = sbh * 34 / tp if t.sequence_parallel else sbh * (10 + 24 / tp)
    else:  # their TP-split attention terms (Q, K, V, projection input: 8 sbh) at this shape
        split = 24 - 8 + attention_split_activations(m) / h
        linear = sbh * (10 + split) / tp if t.sequence_parallel else sbh * (10 + split / tp)
    kept_scores = not t.flash_attention and t.recompute != "selective"
    scores = 5 * a * s * s * b / tp if kept_scores else 0.0
    return linear + scores


def attention_split_activations(model: ModelSpec) -> float:
    """Bytes per token (16-bit values, whole TP group) the attention block keeps for backward
    in its TP-split part: Q and K (``hq + hkv`` heads of the q/k width), V (``hkv`` heads), the
    output projection's input (``hq`` heads of the v width), and with MLA the two latents and
    the shared rope key the up projections read. For standard MHA this is Korthikanti et al.'s
    8 h."""
    hq, hkv, dqk, dv = attention_dims(model)
    per = 2 * (hq + hkv) * dqk + 2 * hkv * dv + 2 * hq * dv
    a = model.attention
    if a is not None and a.mla is not None:
        per += 2 * (a.mla.q_lora_rank + a.mla.kv_lora_rank + a.mla.qk_rope_head_dim)
    return float(per)


def moe_activation_delta(plan: Plan, tp: int, ep: int, etp: int = 1) -> float:
    """Activation bytes an MoE layer keeps per micro-batch beyond the dense layer's estimate.

    The dense MLP's share of Korthikanti et al.'s formula (19 sbh, / t with sequence parallel)
    is replaced by: the dispatch and combine buffers (``2 T k h``), and per routed token copy
    the expert's input and its gated activations (``T k (h + 3 f_e / t_e)``), T the rank's
    tokens (b s / t with sequence parallel, all b s with expert TP = TP), t_e the expert TP (t
    when ep = 1, else ``etp``). With ep > 1 and etp > 1 the ETP all-gather gives each rank the
    token copies of its whole ETP group (``etp T k``) at ``f_e / etp`` width: inputs
    ``etp T k h``, activations ``3 T k f_e``. Plus the shared experts like a dense MLP of
    their width. 16-bit values.
    """
    moe = plan.model.moe
    if moe is None:
        return 0.0
    m, t = plan.model, plan.training
    s, b, h = m.seq_len, t.micro_batch, m.hidden
    sp = t.sequence_parallel
    dense_mlp = 19 * s * b * h / (tp if sp else 1)
    tokens = s * b / tp if (ep > 1 and sp) else s * b
    e = 2  # bytes per activation value
    if ep == 1:  # experts split over the TP group like the dense MLP
        routed = tokens * moe.top_k * (2 * h + h + 3 * moe.expert_ffn_hidden / tp) * e
    else:
        routed = tokens * moe.top_k * (2 * h + etp * h + 3 * moe.expert_ffn_hidden) * e
    shared = moe.shared_experts * 19 * s * b * h * moe.shared_ffn / m.ffn_hidden / (
        tp if sp else 1) if moe.shared_experts else 0.0
    return routed + shared - dense_mlp


def expert_params_per_device(plan: Plan, replica: int, stage: int) -> tuple[float, int]:
    """(routed-expert parameters on the stage's busiest device, EDP group size) under EP;
    (0, 1) without EP (then the experts are TP-split with the dense weights)."""
    st = plan.replicas[replica].stages[stage]
    moe = plan.model.moe
    if moe is None or st.ep <= 1:
        return 0.0, 1

    g = st.ep * st.etp // st.tp
    r0 = replica - replica % g
    speeds = []
    for r in range(r0, r0 + g):
        dt = plan.device_types[plan.group(plan.replicas[r].stages[stage].group).type]
        speeds += [dt.sustained_tflops] * st.tp
    held = max(expert_counts(moe, speeds[::st.etp]))  # one speed per EP position
    per_expert = expert_params(plan.model, st.etp)  # an ETP rank's share of one expert
    return float(held * per_expert * moe_layers_in(plan.model, st.layers)), plan.dp // g


def gathered_unit_params(plan: Plan, layers: tuple[int, int], first: bool, last: bool
                         ) -> float:
    """ZeRO-3 / FSDP: parameters (whole, not TP-split) of the units a rank holds gathered at
    its peak: the one computing and ``training.fsdp.prefetch`` more, the largest of the stage's
    units (``collectives.dp_bucket_layers`` layers; the embedding in the first, the head in the
    last). Zhao et al. 2023 (PyTorch FSDP, VLDB), sec. 3.2: peak parameter memory is the
    sharded model plus the fully materialized units in flight; the sharded part is
    Rajbhandari et al. 2020 (ZeRO) Fig. 1, P_os+g+p: (2 + 2 + K) Psi / N_d."""
    model = plan.model
    per = max(1, plan.collectives.dp_bucket_layers)
    units = []
    for lo in range(layers[0], layers[1], per):
        hi = min(lo + per, layers[1])
        u = span_params(model, (lo, hi))
        u += embedding_params(model) if first and lo == layers[0] else 0
        u += head_params(model) if last and hi == layers[1] else 0
        units.append(u)
    units.sort(reverse=True)
    return float(sum(units[: plan.training.fsdp.prefetch + 1]))


def in_flight_micro_batches(schedule: str, stage: int, pp: int, m: int, v: int = 1) -> float:
    """Peak activations held on ``stage``, in micro-batches of the whole stage's activations.

    ``gpipe`` m; ``1f1b`` min(pp - stage, m); ``zb_h1`` min(pp, m): stage s holds pp - s
    micro-batches through B plus up to s whose W is deferred (W keeps the GEMM inputs, the
    larger part; Qi et al. 2023 give ZB-H1 the memory of 1F1B's first stage). ``interleaved``:
    the peak number of chunk forwards done and not yet backwarded in the stage's order, over v
    (for stage 0 with m > pp that is pp*(1 + (pp - 1)/(pp*v)) as in Narayanan et al. SC21).
    """
    if schedule == "gpipe":
        return m
    if schedule == "1f1b" or (schedule == "interleaved" and pp == 1):
        return min(pp - stage, m)
    if schedule == "zb_h1":
        return min(pp, m)

    order = stage_order(schedule, stage, pp, m, v)
    live = np.cumsum(np.where(order[:, 0] == FWD, 1, -1))
    return float(live.max()) / v


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one stage; ``path`` names it as in error messages."""

    replica: int
    stage: int
    path: str
    group: str
    device_type: str
    tp: int
    layers: tuple[int, int]
    in_flight: float  # micro-batches whose activations are held at the peak (whole stage)
    params_per_device: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def stage_memory(plan: Plan, replica: int, stage: int) -> StageMemory:
    """Peak memory per device of ``plan.replicas[replica].stages[stage]`` (bytes)."""
    rep = plan.replicas[replica]
    st = rep.stages[stage]
    model, tr = plan.model, plan.training
    dtype = plan.device_types[plan.group(st.group).type]
    first, last = stage == 0, stage == rep.pp - 1
    params = span_params(model, st.layers)
    params += embedding_params(model) if first else 0
    params += head_params(model) if last else 0
    z = tr.zero_stage
    # the ranks a ZeRO shard spans: every replica, or with HSDP one shard group
    dp = (tr.fsdp.hsdp_shard or plan.dp) if z >= 3 else plan.dp
    experts, edp = expert_params_per_device(plan, replica, stage)
    if experts:  # EP: the routed experts are not TP-split; their state shards over the EDP group
        params -= routed_expert_params(model, st.layers)
    p = params / st.tp
    gb = tr.grad_reduce_bytes(model.dtype_bytes)
    weights = p * model.dtype_bytes / (dp if z >= 3 else 1)
    if z >= 3 and plan.dp > 1:  # FSDP: the units gathered at once (computing + prefetched)
        weights += gathered_unit_params(plan, st.layers, first, last) / st.tp * model.dtype_bytes
    grads = p * gb / (dp if z >= 2 else 1)
    optim = p * OPTIMIZER_BYTES_PER_PARAM / (dp if z >= 1 else 1)
    weights += experts * model.dtype_bytes / (edp if z >= 3 else 1)
    grads += experts * gb / (edp if z >= 2 else 1)
    optim += experts * OPTIMIZER_BYTES_PER_PARAM / (edp if z >= 1 else 1)
    p += experts

    m = rep.micro_batches
    in_flight = in_flight_micro_batches(tr.schedule, stage, rep.pp, m, tr.virtual_stages)
    if st.cp > 1:  # a CP rank holds the activations of s / cp tokens
        plan = replace(plan, model=replace(model, seq_len=model.seq_len // st.cp))
        model = plan.model
    full_layer = activation_bytes_per_layer(plan, st.tp)
    s, b, h = model.seq_len, tr.micro_batch, model.hidden
    moe_extra = moe_activation_delta(plan, st.tp, st.ep, st.etp) * moe_layers_in(model,
                                                                               st.layers)
    if tr.recompute == "full":
        one_moe = moe_activation_delta(plan, st.tp, st.ep, st.etp) if moe_extra else 0.0
        acts = in_flight * st.num_layers * 2 * s * b * h + full_layer + max(0.0, one_moe)
    else:
        acts = in_flight * (st.num_layers * full_layer + moe_extra)
    if last:
        acts += in_flight * 4 * s * b * (h + model.vocab) / st.tp
    return StageMemory(
        replica=replica,
        stage=stage,
        path=f"replicas[{replica}].stages[{stage}]",
        group=st.group,
        device_type=dtype.name,
        tp=st.tp,
        layers=st.layers,
        in_flight=in_flight,
        params_per_device=p,
        weights=weights,
        gradients=grads,
        optimizer=optim,
        activations=acts,
        capacity=dtype.hbm_GB * GB,
    )


def all_stage_memory(plan: Plan) -> list[StageMemory]:
    """:func:`stage_memory` of every stage, replica by replica."""
    return [stage_memory(plan, r, s) for r, rep in enumerate(plan.replicas) for s in range(rep.pp)]


def memory_report(plan: Plan) -> pd.DataFrame:
    """One row per stage: memory per device in GB (1e9 bytes) by kind, capacity and headroom."""
    rows = []
    for sm in all_stage_memory(plan):
        rows.append(
            {
                "replica": sm.replica,
                "stage": sm.stage,
                "group": sm.group,
                "device_type": sm.device_type,
                "tp": sm.tp,
                "layer_start": sm.layers[0],
                "layer_stop": sm.layers[1],
                "in_flight": sm.in_flight,
                "params_per_device": sm.params_per_device,
                "weights_GB": sm.weights / GB,
                "gradients_GB": sm.gradients / GB,
                "optimizer_GB": sm.optimizer / GB,
                "activations_GB": sm.activations / GB,
                "total_GB": sm.total / GB,
                "capacity_GB": sm.capacity / GB,
                "headroom_GB": (sm.capacity - sm.total) / GB,
                "fits": sm.fits,
            }
        )
    return pd.DataFrame(rows)


def describe_overflow(sm: StageMemory) -> str:
    """``replicas[1].stages[0]: needs 52.3 GB per device (...) but A100-40GB has 40.0 GB``."""
    return (
        f"{sm.path}: needs {sm.total / GB:.1f} GB per device (weights {sm.weights / GB:.1f}, "
        f"gradients {sm.gradients / GB:.1f}, optimizer {sm.optimizer / GB:.1f}, "
        f"activations {sm.activations / GB:.1f}) but {sm.device_type} has "
        f"{sm.capacity / GB:.1f} GB"
    )


def check_feasible(plan: Plan) -> None:
    """Raise :class:`InfeasiblePlanError` listing every stage that does not fit in memory."""
    over = [sm for sm in all_stage_memory(plan) if not sm.fits]
    if over:
        raise InfeasiblePlanError("; ".join(describe_overflow(sm) for sm in over))
