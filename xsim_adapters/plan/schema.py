"""The JSON Schema of the plan format, generated from the code that validates plans.

Nothing here lists fields. The readers of :mod:`._fields` (``get_int``, ``get_enum``,
``check_keys``, ...) report what they accept to a recorder while the real loader
(:func:`.loader.parse_plan_dict`) reads a few exemplar plans that use every section and every
alternative form; the recorded paths, types, bounds, defaults and key sets become the schema.
A field added to the loader through those readers is in the schema with no other change;
``tests/test_plan_schema.py`` checks that the committed ``docs/plan.schema.json`` equals a
fresh one (``xsim schema -o docs/plan.schema.json`` regenerates it).

The schema checks the shape of a plan (keys, types, ranges, choices). What it cannot say is
checked by the loader only: divisibility (``tp`` must divide ``heads``), device ranges within
a group, layer coverage, memory feasibility. Every key the loader allows is in the schema; a
key whose reader never ran on the exemplars is allowed with any value.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from . import _fields as f

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_TITLE = "xsim-adapters plan"
_INDEX = re.compile(r"\[\d+\]")

_GROUPS = {
    "h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8},
    "a100": {"type": "my-a100", "nodes": 1, "gpus_per_node": 8, "nic_gbps": 200,
             "nvlink_domain_gpus": 8},
}
_DEVICE_TYPE = {  # a full definition: every key but profile (a CSV file)
    "peak_tflops": 312, "hbm_GB": 80, "hbm_GBps": 2039, "scaleup_GBps": 300, "nic_gbps": 200,
    "fp32_tflops": 19.5, "tf32_tflops": 156, "fp8_tflops": 0, "fp4_tflops": 0,
    "efficiency": 0.5,
    "hbm_efficiency": 0.8, "fp8_efficiency": 0, "bf16": True, "sm_count": 108, "pcie_p2p": True,
    "burst_clock_MHz": 1410, "sustained_clock_MHz": 1410, "source": "exemplar",
}
# Exemplar plans: between them every section, optional key and alternative form (preset or
# mapping model, list or uniform replicas, recompute as a word or a boolean, link events).
# Sizes differ (16 and 8 GPUs) so that bounds taken from the plan (a rank's maximum) differ
# and are left out of the schema (:func:`_merge`).
EXEMPLARS: tuple[dict[str, Any], ...] = (
    {
        "name": "schema-a", "seed": 1,
        "model": {"preset": "tiny-gpt", "name": "t", "layers": 4, "hidden": 256,
                  "ffn_hidden": 1024, "heads": 8, "kv_heads": 4, "seq_len": 128, "vocab": 1000,
                  "dtype": "bf16", "gated_mlp": True},
        "training": {"global_batch": 8, "micro_batch": 1, "schedule": "interleaved",
                     "virtual_stages": 2, "recompute": "selective", "sequence_parallel": True,
                     "overlap": {"tp_comm": True}},
        "device_types": {"my-a100": _DEVICE_TYPE, "H100-80GB": {"efficiency": 0.6}},
        "device_groups": _GROUPS,
        "network": {
            "scale_out": {"topology": "leaf_spine", "link_gbps": 400},
            "scale_up": {"latency_us": 0.5},
            "links": [{"src": "leaf0", "dst": "spine0", "gbps": 100, "latency_us": 1.0}],
            "events": [
                {"at_us": 10, "kind": "fail", "src": "leaf0", "dst": "spine0", "factor": 0},
                {"at_us": 20, "kind": "degrade", "src": "leaf0", "dst": "spine0",
                 "factor": 0.5},
                {"at_us": 30, "kind": "restore", "src": "leaf0", "dst": "spine0"},
                {"at_us": 40, "kind": "nic_down", "rank": 1},
                {"at_us": 50, "kind": "nic_up", "rank": 1},
            ],
            "ecmp": "connection",
            "nccl_net": "socket", "socket_nthreads": 2, "nsocks_per_thread": 8,
            "per_flow_gbps": 10,
            "transport": {
                "lossless": "pfc", "pfc": {"buffer_bytes": 16777216, "alpha": 0.25,
                                           "xon_offset_bytes": 18064},
                "ecn": {"kmin_bytes": 5000, "kmax_bytes": 200000, "pmax": 0.01,
                        "reference_gbps": 40},
                "cc": "dcqcn",
                "dcqcn": {"g": 0.00390625, "alpha_timer_us": 55, "rate_timer_us": 55,
                          "byte_counter_bytes": 10485760, "fast_recovery_steps": 5,
                          "rai_mbps": 40, "rhai_mbps": 400, "min_rate_mbps": 1,
                          "cnp_interval_us": 50, "initial_alpha": 1.0},
            },
        },
        "replicas": [
            {"stages": [{"group": "h100", "devices": [0, 2], "tp": 2, "layers": [0, 2]},
                        {"group": "h100", "devices": [2, 4], "tp": 2, "layers": [2, 4]}],
             "batch_share": 0.5},
            {"stages": [{"group": "a100", "devices": [0, 2], "tp": 2},
                        {"group": "a100", "devices": [2, 4], "tp": 2}],
             "auto_layers": "by_compute", "batch_share": 0.5},
        ],
        "collectives": {"resharding": "lcm"},
        "perturb": {"slow": [{"rank": 0, "factor": 1.1}, {"ranks": [1, 2], "factor": 1.2},
                             {"group": "a100", "devices": [0, 2], "factor": 0.9},
                             {"server": 1, "factor": 1.05},
                             {"rank": 3, "factor": 2.0, "from_us": 100, "until_us": 300}],
                    "jitter": {"sigma": 0.05}},
    },
    {
        "name": "schema-b", "model": "tiny-gpt",
        "training": {"global_batch": 8, "micro_batch": 1, "recompute": True,
                     "zero_stage": 3, "fsdp": {"reshard_after_forward": True, "prefetch": 1,
                                               "hsdp_shard": 0}},
        "device_groups": {"h100": _GROUPS["h100"]},
        "perturb": {"slow": [{"rank": 7, "factor": 1.5}, {"server": 0, "factor": 1.5}]},
        "replicas": {"uniform": {"group": "h100", "tp": 2, "pp": 2, "dp": 2,
                                 "devices": [0, 8], "micro_batches": 4, "order": "tp-dp-pp"}},
    },
    {
        "name": "schema-c", "model": "tiny-gpt",
        "training": {"global_batch": 8, "micro_batch": 1},
        "device_groups": {"h100": _GROUPS["h100"]},
        "network": {"transport": {"lossless": "none", "cc": "hpcc",
                                  "pfc": {"xoff_bytes": 300000, "xon_bytes": 200000},
                                  "hpcc": {"eta": 0.95, "max_stage": 5, "w_ai_bytes": 80}}},
        "replicas": [{"uniform": {"group": "h100", "tp": 2, "batch_share": 0.25}}],
    },
    {
        "name": "schema-d", "model": "tiny-gpt",
        "training": {"global_batch": 8, "micro_batch": 1},
        "device_groups": {"h100": _GROUPS["h100"]},
        "replicas": {"uniform": {"group": "h100", "tp": 4, "pp": 2, "batch_share": 1.0}},
    },
    {
        "name": "schema-f",
        "model": {"layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 4,
                  "seq_len": 128, "vocab": 1000, "gated_mlp": True, "mlp_bias": True,
                  "attention": {"mla": {"q_lora_rank": 64, "kv_lora_rank": 32,
                                        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                                        "v_head_dim": 32}},
                  "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden": 128,
                          "shared_experts": 1, "shared_ffn_hidden": 128, "every": 1,
                          "first_dense_layers": 0, "router": "sigmoid_topk",
                          "capacity_factor": 1.5, "routing": "zipf", "zipf_exponent": 1.2,
                          "placement": "uniform", "alltoall": "hierarchical",
                          "router_bias": True}},
        "training": {"global_batch": 8, "micro_batch": 1, "sequence_parallel": True},
        "device_groups": {"h100": _GROUPS["h100"]},
        "replicas": {"uniform": {"group": "h100", "tp": 2, "dp": 4, "ep": 4, "etp": 2,
                                 "cp": 2}},
    },
    {
        "name": "schema-g",
        "model": {"preset": "mixtral-8x7b", "layers": 2, "seq_len": 4096,
                  "moe": {"placement": "by_speed"}, "attention": {
                      "head_dim": 64, "bias": True, "sliding_window": 512, "full_every": 2,
                      "sinks": True}},
        "training": {"global_batch": 8, "micro_batch": 1, "sequence_parallel": True},
        "device_groups": {"h100": _GROUPS["h100"]},
        "replicas": [{"stages": [{"group": "h100", "devices": [0, 8], "layers": [0, 2],
                                  "ep": 1, "cp": 1, "etp": 1}]}],
    },
    {
        "name": "schema-h",
        "model": {"preset": "deepseek-v3", "layers": 4, "attention": {"mla": {
            "kv_lora_rank": 256}}},
        "training": {"global_batch": 8, "micro_batch": 1, "sequence_parallel": True},
        "device_groups": {"h100": _GROUPS["h100"]},
        "replicas": {"uniform": {"group": "h100", "tp": 8, "pp": 1, "dp": 1}},
    },
    {
        "name": "schema-e", "model": "tiny-gpt",
        "training": {"global_batch": 8, "micro_batch": 1},
        "device_groups": {"h100": _GROUPS["h100"]},
        "replicas": [
            {"stages": [{"group": "h100", "devices": [0, 4], "layers": [0, 4]}],
             "micro_batches": 4},
            {"uniform": {"group": "h100", "devices": [4, 8], "tp": 4, "micro_batches": 4}},
        ],
    },
)


class _Recorder:
    """What the readers of :mod:`._fields` accepted, by YAML path."""

    def __init__(self) -> None:
        self.fragments: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.defaults: dict[str, list[Any]] = defaultdict(list)
        self.shapes: dict[str, dict[tuple[str, ...], set[str]]] = defaultdict(dict)
        self.containers: dict[str, set[str]] = defaultdict(set)
        self.name_maps: dict[str, set[str]] = defaultdict(set)  # parent path -> key names
        self.value_names: set[str] = set()  # paths whose value is a name

    @staticmethod
    def _ours(path: str) -> bool:
        return not path.startswith("presets/")  # the packaged presets' own parsing

    def field(self, path: str, fragment: dict[str, Any], default: Any) -> None:
        if self._ours(path):
            if fragment not in self.fragments[path]:
                self.fragments[path].append(fragment)
            if default is not f.MISSING and default is not None:
                self.defaults[path].append(default)

    def keys(self, path: str, allowed: list[str], required: list[str]) -> None:
        if self._ours(path):
            shape = tuple(allowed)
            seen = self.shapes[path].get(shape)  # required only on some path: not required
            self.shapes[path][shape] = set(required) if seen is None else seen & set(required)

    def container(self, path: str, kind: str) -> None:
        if self._ours(path):
            self.containers[path].add(kind)

    def name(self, value: Any, path: str) -> None:
        if not self._ours(path):
            return
        if isinstance(value, str) and path.endswith("." + value):
            self.name_maps[path[: -len(value) - 1]].add(value)
        else:
            self.value_names.add(path)

    def normalize(self, path: str) -> str:
        """``replicas[1].stages[0]`` -> ``replicas[].stages[]``; a name key -> ``*``."""
        path = _INDEX.sub("[]", path)
        for parent, names in self.name_maps.items():
            for name in names:
                for cut in (".", "[", ""):
                    head = f"{parent}.{name}{cut}"
                    if path == head.rstrip(".[") or (cut and path.startswith(head)):
                        return f"{parent}.*" + path[len(head) - len(cut):]
        return path


def _tree(rec: _Recorder) -> dict[str, dict[str, Any]]:
    """Normalized path -> what was recorded there."""
    nodes: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"fragments": [], "shapes": {}, "containers": set(), "defaults": []})
    for path, frags in rec.fragments.items():
        node = nodes[rec.normalize(path)]
        for frag in frags:
            if frag not in node["fragments"]:
                node["fragments"].append(frag)
        node["defaults"].extend(rec.defaults.get(path, []))
    for path, shapes in rec.shapes.items():
        node = nodes[rec.normalize(path)]
        for shape, req in shapes.items():
            seen = node["shapes"].get(shape)
            node["shapes"][shape] = req if seen is None else seen & req
    for path, kinds in rec.containers.items():
        nodes[rec.normalize(path)]["containers"] |= kinds
    for path in rec.value_names:
        nodes[rec.normalize(path)]["fragments"].append(
            {"type": "string", "pattern": f"^{f.NAME_PATTERN}$"})
    for parent in rec.name_maps:
        nodes[rec.normalize(parent)]["name_map"] = True
    return nodes


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum")


def _merge(fragments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fragments of one path that differ only in bounds are one fragment with the bounds all
    of them share: a bound taken from the plan (a rank below the plan's rank count) differs
    between exemplars and is left to the loader."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for fr in fragments:
        key = json.dumps({k: v for k, v in fr.items() if k not in _BOUNDS}, sort_keys=True)
        groups.setdefault(key, []).append(fr)
    out = []
    for same in groups.values():
        merged = dict(same[0])
        for b in _BOUNDS:
            if any(fr.get(b) != merged.get(b) for fr in same):
                merged.pop(b, None)
        out.append(merged)
    return out


def _node_schema(nodes: dict[str, dict[str, Any]], path: str) -> dict[str, Any]:
    node = nodes.get(path)
    if node is None:
        return {}  # a key the exemplars never reached: any value (the loader still checks)
    alts: list[dict[str, Any]] = _merge(node["fragments"])
    if node.get("name_map"):
        alts.append({"type": "object", "propertyNames": {"pattern": f"^{f.NAME_PATTERN}$"},
                     "additionalProperties": _node_schema(nodes, f"{path}.*" if path else "*")})
    elif node["shapes"]:
        for shape, req in sorted(node["shapes"].items()):
            obj: dict[str, Any] = {"type": "object", "properties": {
                k: _node_schema(nodes, f"{path}.{k}" if path else k) for k in shape}}
            if req:
                obj["required"] = [k for k in shape if k in req]
            obj["additionalProperties"] = False
            alts.append(obj)
    elif "object" in node["containers"]:
        alts.append({"type": "object"})
    if "array" in node["containers"]:
        alts.append({"type": "array", "items": _node_schema(nodes, f"{path}[]")})
    out: dict[str, Any] = alts[0] if len(alts) == 1 else {"anyOf": alts} if alts else {}
    # a default computed from the plan (a stage's tp = its devices) varies between the
    # exemplars: only a constant one is a default
    if node["defaults"] and all(d == node["defaults"][0] for d in node["defaults"]):
        out = {**out, "default": node["defaults"][0]}
    return out


def plan_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of plan files, from the loader's own readers."""
    from .loader import parse_plan_dict

    rec = _Recorder()
    f.RECORDER = rec
    try:
        for plan in EXEMPLARS:
            parse_plan_dict(json.loads(json.dumps(plan)))
    finally:
        f.RECORDER = None
    schema = _node_schema(_tree(rec), "")
    return {"$schema": SCHEMA_DIALECT, "title": SCHEMA_TITLE,
            "description": "Deployment plan of xsim-adapters (docs/plan.md). Generated by "
                           "`xsim schema` from the plan loader; checks shape, not feasibility.",
            **schema}


def schema_text() -> str:
    """:func:`plan_schema` as the JSON text ``xsim schema`` writes (stable key order)."""
    return json.dumps(plan_schema(), indent=1) + "\n"
