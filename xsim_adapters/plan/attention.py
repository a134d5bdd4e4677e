"""Attention shapes: explicit head width, biases, multi-head latent attention, sliding windows.

``model.attention`` (all optional; absent means standard multi-head / grouped-query attention
with ``head_dim = hidden / heads``, exactly as before it existed):

- ``head_dim``: per-head width when ``heads x head_dim != hidden`` (GPT-OSS: 64 heads of 64 on a
  2880-wide residual stream);
- ``bias``: biases on the Q, K, V and output projections (GPT-OSS);
- ``mla``: multi-head latent attention (DeepSeek-V2/V3). Per layer, with H heads:
  ``q_a`` h x q_lora_rank, a norm of q_lora_rank, ``q_b`` q_lora_rank x H (nope + rope);
  ``kv_a`` h x (kv_lora_rank + rope), a norm of kv_lora_rank, ``kv_b`` kv_lora_rank x
  H (nope + v); ``o`` H v x h. Queries and keys have ``qk_nope + qk_rope`` dims per head,
  values ``v_head_dim``; after the up-projections every head has its own K and V (as MHA);
- ``sliding_window`` W with ``full_every`` k: layer l attends to the W most recent tokens
  (itself included) unless ``(l + 1) % k == 0`` (k = 0: every layer windowed);
- ``sinks``: one learned logit per head added to each softmax's denominator (GPT-OSS).

Parameter counts are exact functions of the shape (checked against DeepSeek-V3's and GPT-OSS's
published totals in tests/test_attention_shapes.py).
"""

from __future__ import annotations

from typing import Any

from ..errors import PlanError
from . import _fields as f
from .model import AttentionSpec, MLASpec, ModelSpec

ATTENTION_KEYS = ("head_dim", "bias", "mla", "sliding_window", "full_every", "sinks")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def parse_attention(value: Any, path: str, base: AttentionSpec | None,
                    seq_len: int) -> AttentionSpec | None:
    """``model.attention`` -> AttentionSpec (``null``: standard attention). ``base``: a preset's."""
    if value is None:
        return None
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, ATTENTION_KEYS)
    d = base or AttentionSpec()
    mla = d.mla
    if "mla" in m:
        mla = _parse_mla(m["mla"], f.join(path, "mla"), d.mla)
    spec = AttentionSpec(
        head_dim=f.get_int(m, "head_dim", path, d.head_dim, minimum=0),
        bias=f.get_bool(m, "bias", path, d.bias),
        mla=mla,
        sliding_window=f.get_int(m, "sliding_window", path, d.sliding_window, minimum=0),
        full_every=f.get_int(m, "full_every", path, d.full_every, minimum=0),
        sinks=f.get_bool(m, "sinks", path, d.sinks),
    )
    if spec.mla is not None and spec.head_dim:
        raise PlanError(f.join(path, "head_dim"),
                        f"must be 0 with mla (its head widths are mla.qk_nope_head_dim, "
                        f"qk_rope_head_dim and v_head_dim) (got {spec.head_dim})")
    if spec.sliding_window > seq_len:
        raise PlanError(f.join(path, "sliding_window"),
                        f"must be at most model.seq_len {seq_len} (got {spec.sliding_window})")
    if spec.full_every and not spec.sliding_window:
        raise PlanError(f.join(path, "full_every"),
                        f"needs a sliding_window (got {spec.full_every})")
    return spec


def _parse_mla(value: Any, path: str, base: MLASpec | None) -> MLASpec | None:
    if value is None:
        return None
    m = f.expect_mapping(value, path)
    required = () if base is not None else tuple(k for k in MLA_KEYS if k != "q_lora_rank")
    f.check_keys(m, path, MLA_KEYS, required)
    d = base or MLASpec(0, 1, 1, 0, 1)
    return MLASpec(
        q_lora_rank=f.get_int(m, "q_lora_rank", path, d.q_lora_rank, minimum=0),
        kv_lora_rank=f.get_int(m, "kv_lora_rank", path, d.kv_lora_rank),
        qk_nope_head_dim=f.get_int(m, "qk_nope_head_dim", path, d.qk_nope_head_dim),
        qk_rope_head_dim=f.get_int(m, "qk_rope_head_dim", path, d.qk_rope_head_dim, minimum=0),
        v_head_dim=f.get_int(m, "v_head_dim", path, d.v_head_dim),
    )


def is_standard(model: ModelSpec) -> bool:
    """True for plain MHA/GQA with ``head_dim = hidden / heads``, no bias, window or sinks (the
    shape every formula before ``model.attention`` assumed; they are kept bit for bit)."""
    a = model.attention
    return a is None or a == AttentionSpec()


def is_window_layer(model: ModelSpec, layer: int) -> bool:
    """True if transformer layer ``layer`` (0-based) uses the sliding window."""
    a = model.attention
    if a is None or not a.sliding_window:
        return False
    return not (a.full_every and (layer + 1) % a.full_every == 0)


def window_layers_in(model: ModelSpec, layers: tuple[int, int]) -> int:
    """How many of the layers ``[a, b)`` are windowed."""
    return sum(is_window_layer(model, x) for x in range(*layers))


def attention_dims(model: ModelSpec) -> tuple[int, int, int, int]:
    """(query heads, key/value heads, q/k width per head, v width per head) at the core."""
    a = model.attention
    if a is not None and a.mla is not None:
        return model.heads, model.heads, a.mla.qk_head_dim, a.mla.v_head_dim
    hd = model.head_dim
    return model.heads, model.kv_heads, hd, hd


def keys_per_query(model: ModelSpec, window: bool) -> int:
    """Keys each query attends to: the whole sequence, or the window (clipped to it)."""
    a = model.attention
    if window and a is not None and a.sliding_window:
        return min(a.sliding_window, model.seq_len)
    return model.seq_len


def attention_params(model: ModelSpec) -> int:
    """Parameters of one layer's attention (projections, MLA latents and norms, biases, sinks);
    without the layer's input norm."""
    h = model.hidden
    a = model.attention
    if a is not None and a.mla is not None:
        x = a.mla
        heads = model.heads
        if x.q_lora_rank:
            q = h * x.q_lora_rank + x.q_lora_rank + x.q_lora_rank * heads * x.qk_head_dim
        else:
            q = h * heads * x.qk_head_dim
        kv = (h * (x.kv_lora_rank + x.qk_rope_head_dim) + x.kv_lora_rank
              + x.kv_lora_rank * heads * (x.qk_nope_head_dim + x.v_head_dim))
        o = heads * x.v_head_dim * h
        bias = (heads * x.qk_head_dim + heads * (x.qk_nope_head_dim + x.v_head_dim) + h
                if a.bias else 0)
        return q + kv + o + bias + (heads if a.sinks else 0)
    qd = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    weights = h * qd + 2 * h * kv + qd * h
    bias = qd + 2 * kv + h if a is not None and a.bias else 0
    return weights + bias + (model.heads if a is not None and a.sinks else 0)


def tp_gather_width(model: ModelSpec) -> int:
    """Width per token of the sequence-parallel all-gather in front of the attention block:
    ``hidden``, or with MLA the latents the up-projections read (Megatron-Core runs the down
    projections duplicated on each rank's own tokens and gathers ``q_lora_rank +
    kv_lora_rank + qk_rope_head_dim`` values per token; without a query latent the query
    projection reads the hidden state itself)."""
    a = model.attention
    if a is None or a.mla is None:
        return model.hidden
    x = a.mla
    return (x.q_lora_rank or model.hidden) + x.kv_lora_rank + x.qk_rope_head_dim


__all__ = ["attention_dims", "attention_params", "is_standard", "is_window_layer",
           "keys_per_query", "parse_attention", "tp_gather_width", "window_layers_in"]
