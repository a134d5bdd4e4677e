"""Shared fixtures of the plan tests: the example plan and Hypothesis strategies of valid plans."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

EXAMPLE: dict[str, Any] = {
    "name": "llama2-7b-h100-a100",
    "model": "llama2-7b",
    "training": {"global_batch": 64, "micro_batch": 1, "schedule": "1f1b"},
    "device_groups": {
        "h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8},
        "a100": {"type": "A100-40GB", "nodes": 1, "gpus_per_node": 8},
    },
    "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": 400, "latency_us": 1.0}},
    "replicas": [
        {"stages": [{"group": "h100", "devices": [0, 8], "tp": 8, "layers": [0, 32]}]},
        {
            "stages": [
                {"group": "a100", "devices": [0, 4], "tp": 4, "layers": [0, 18]},
                {"group": "a100", "devices": [4, 8], "tp": 4, "layers": [18, 32]},
            ]
        },
    ],
}


def example() -> dict[str, Any]:
    """A fresh deep copy of the brief's example plan (as a dict), safe to mutate."""
    return copy.deepcopy(EXAMPLE)


DEVICE_TYPES = ["A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "L40S", "MI300X"]


@st.composite
def plan_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Valid, feasible plan dicts over a small custom model, using every optional feature.

    The model is small (so every placement fits in memory) and its head count and FFN width are
    multiples of 8, so any TP degree in 1, 2, 4, 8 divides them.
    """
    layers = draw(st.integers(2, 12))
    heads = draw(st.sampled_from([8, 16]))
    hidden = heads * draw(st.sampled_from([16, 32, 64]))
    model: Any
    if draw(st.booleans()):
        model = {
            "layers": layers,
            "hidden": hidden,
            "ffn_hidden": 8 * draw(st.integers(1, 64)),
            "heads": heads,
            "kv_heads": draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0])),
            "seq_len": draw(st.sampled_from([128, 256, 512])),
            "vocab": draw(st.integers(100, 5000)),
            "dtype": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
            "gated_mlp": draw(st.booleans()),
        }
    else:
        model = {"preset": "tiny-gpt", "layers": layers, "seq_len": 256}
    n_groups = draw(st.integers(1, 3))
    groups = {}
    for g in range(n_groups):
        groups[f"g{g}"] = {
            "type": draw(st.sampled_from(DEVICE_TYPES)),
            "nodes": draw(st.integers(1, 3)),
            "gpus_per_node": draw(st.sampled_from([1, 2, 4, 8])),
        }
    # Carve replicas out of the groups: contiguous TP slices of 1, 2, 4 or 8 devices.
    free = {name: 0 for name in groups}
    replicas = []
    n_replicas = draw(st.integers(1, 4))
    for _ in range(n_replicas):
        pp = draw(st.integers(1, min(3, layers)))
        stages = []
        for _s in range(pp):
            options = [
                (name, tp)
                for name, g in groups.items()
                for tp in (1, 2, 4, 8)
                if free[name] + tp <= g["nodes"] * g["gpus_per_node"]
            ]
            if not options:
                break
            name, tp = draw(st.sampled_from(options))
            stages.append({"group": name, "devices": [free[name], free[name] + tp], "tp": tp})
            free[name] += tp
        if not stages:
            break
        cuts = (
            sorted(
                draw(
                    st.sets(
                        st.integers(1, layers - 1),
                        min_size=len(stages) - 1,
                        max_size=len(stages) - 1,
                    )
                )
            )
            if len(stages) > 1
            else []
        )
        bounds = [0, *cuts, layers]
        auto = draw(st.booleans())
        for s, stage in enumerate(stages):
            if not auto:
                stage["layers"] = [bounds[s], bounds[s + 1]]
        rep: dict[str, Any] = {"stages": stages}
        if auto:
            rep["auto_layers"] = "by_compute"
        replicas.append(rep)
    if not replicas:  # every group was full before the first stage: impossible, n >= 1 device
        raise AssertionError("no replica could be placed")
    dp = len(replicas)
    micro_batch = draw(st.integers(1, 4))
    total = draw(st.integers(dp, 4 * dp + 4))
    mode = draw(st.sampled_from(["speed", "share", "count"]))
    if mode == "share":
        weights = [draw(st.integers(1, 9)) for _ in replicas]
        for rep, w in zip(replicas, weights, strict=True):
            rep["batch_share"] = w / sum(weights)
        # float shares may miss 1 by an ulp or two; the plan allows 1e-6
    elif mode == "count":
        counts = [1] * dp
        for _ in range(total - dp):
            counts[draw(st.integers(0, dp - 1))] += 1
        for rep, c in zip(replicas, counts, strict=True):
            rep["micro_batches"] = c
    training = {
        "global_batch": total * micro_batch,
        "micro_batch": micro_batch,
        "schedule": draw(st.sampled_from(["gpipe", "1f1b", "zb_h1"])),
        # ZeRO-3 (FSDP) needs every replica to split the layers alike (tests/test_fsdp.py covers
        # it); these plans differ per replica on purpose
        "zero_stage": draw(st.integers(0, 2)),
        "recompute": draw(st.sampled_from([True, False, "none", "selective", "full"])),
        "sequence_parallel": draw(st.booleans()),
        "flash_attention": draw(st.booleans()),
        "overlap": {"dp_grad_reduce": draw(st.booleans()), "param_gather": draw(st.booleans())},
    }
    d: dict[str, Any] = {
        # plan names: NAME_PATTERN (a letter or digit first, then also . _ -)
        "name": draw(st.text("abcdefghij0123456789", min_size=1, max_size=1))
        + draw(st.text("abcdefghij-_.0123456789", max_size=11)),
        "seed": draw(st.integers(0, 2**31)),
        "model": model,
        "training": training,
        "device_groups": groups,
        "replicas": replicas,
    }
    if draw(st.booleans()):
        d["device_types"] = {
            draw(st.sampled_from(DEVICE_TYPES)): {
                "efficiency": draw(st.floats(0.05, 1.0, allow_nan=False))
            },
            "custom-gpu": {
                "peak_tflops": draw(st.floats(1.0, 5000.0)),
                "hbm_GB": 1000.0,
                "hbm_GBps": 3000.0,
                "scaleup_GBps": 400.0,
                "nic_gbps": 400.0,
            },
        }
    if draw(st.booleans()):
        d["network"] = {
            "scale_out": {
                "topology": draw(st.sampled_from(["leaf_spine", "fat_tree"])),
                "link_gbps": draw(st.sampled_from([100, 200, 400.0, 800])),
                "latency_us": draw(st.floats(0.0, 10.0)),
                "oversubscription": draw(st.floats(1.0, 4.0)),
                "rail_optimized": draw(st.booleans()),
                "nodes_per_leaf": draw(st.integers(1, 32)),
                "spines": draw(st.integers(0, 8)),
                # radix 8 holds 8^3/4 = 128 hosts, at least the 72 GPUs drawn (radix 4: 16,
                # a plan whose topology cannot be built, refused at load as it has events)
                "fat_tree_k": draw(st.sampled_from([0, 8])),
            },
            "scale_up": {"latency_us": draw(st.floats(0.0, 2.0))},
            "links": [{"src": "leaf0", "dst": "spine0", "gbps": 100.0, "latency_us": 2.0}],
            "events": [
                {"at_us": 10.0, "kind": "degrade", "src": "leaf0", "dst": "spine0", "factor": 0.5},
                {"at_us": 20.0, "kind": "fail", "src": "leaf0", "dst": "spine0"},
                {"at_us": 30.0, "kind": "restore", "src": "leaf0", "dst": "spine0"},
            ],
        }
    if draw(st.booleans()):
        d["collectives"] = {
            "resharding": draw(st.sampled_from(["lcm", "gather_p2p_scatter", "direct"])),
            "channels": draw(st.integers(1, 4)),
            "granularity": draw(st.sampled_from(["step", "chunked"])),
            "chunks": draw(st.integers(1, 8)),
            "ring_order": draw(st.sampled_from(["hetero_aware", "natural"])),
            "dp_bucket_layers": draw(st.integers(1, 4)),
        }
    return d
