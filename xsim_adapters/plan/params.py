"""Parameter counts of a model: per layer, embedding, head, a span of layers, the whole model and
the active parameters of an MoE model (input knowledge only: no generator, no memory model).

The per-device memory built on them is :mod:`xsim_adapters.feasibility.memory`.
"""

from __future__ import annotations

from .attention import attention_params
from .model import ModelSpec
from .moe import active_ffn_params, dense_mlp_params, moe_ffn_delta, moe_layers_in


def layer_params(model: ModelSpec) -> int:
    """Parameters of one transformer layer (attention, MLP, norms; biases for GPT style).

    ``gated_mlp`` models follow Llama (SwiGLU: three FFN matrices, RMSNorm with a gain only,
    no biases); the others GPT (GELU: two FFN matrices, LayerNorm gain and bias, biases on
    every linear layer). Grouped-query attention shrinks K and V to ``kv_heads`` heads;
    ``model.attention`` (explicit head width, biases, MLA, sinks) and ``model.mlp_bias`` add
    their parameters (:mod:`.attention`).
    """
    h, ffn = model.hidden, model.ffn_hidden
    kv = model.kv_heads * model.head_dim
    attention = attention_params(model)  # Q, K, V, O (MLA: its latents), model.attention's extras
    if model.gated_mlp:
        return attention + dense_mlp_params(model) + 2 * h
    biases = (h + 2 * kv) + h + ffn + h  # QKV, O, FFN up, FFN down
    return attention + 2 * h * ffn + biases + 4 * h


def embedding_params(model: ModelSpec) -> int:
    """Parameters of the input embedding (on the first stage); GPT style adds learned positions."""
    tokens = model.vocab * model.hidden
    return tokens if model.gated_mlp else tokens + model.seq_len * model.hidden


def head_params(model: ModelSpec) -> int:
    """Parameters of the final norm and output projection (on the last stage).

    The projection is counted even for models that tie it to the embedding: with pipeline
    parallelism the last stage holds its own copy (as Megatron-LM does).
    """
    norm = model.hidden if model.gated_mlp else 2 * model.hidden
    return model.vocab * model.hidden + norm


def span_params(model: ModelSpec, layers: tuple[int, int]) -> int:
    """Parameters of the transformer layers ``[a, b)``: dense layers, MoE layers with all their
    experts (:mod:`.moe`)."""
    n = layers[1] - layers[0]
    p = n * layer_params(model)
    if model.moe is not None:
        p += moe_layers_in(model, layers) * moe_ffn_delta(model)
    return p


def model_params(model: ModelSpec) -> int:
    """All parameters: layers, embedding and head."""
    return span_params(model, (0, model.layers)) + embedding_params(model) + head_params(model)


def active_params(model: ModelSpec, embedding: bool = True) -> int:
    """Parameters one token uses: ``model_params`` with only the top-k routed experts of each
    MoE layer counted (the "active parameters" of MoE model cards). ``embedding=False`` leaves
    out the input embedding table (a lookup, not a product), as DeepSeek-V3's and GPT-OSS's
    model cards count; Mixtral's and Qwen's cards include it."""
    dense = dense_mlp_params(model)
    per_layer = sum(active_ffn_params(model, x) - dense for x in range(model.layers))
    return (model.layers * layer_params(model) + per_layer
            + (embedding_params(model) if embedding else 0) + head_params(model))
