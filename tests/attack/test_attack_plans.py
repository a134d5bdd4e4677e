"""Hostile plans and profiles: each gets exit 1, one error line naming the YAML path or file,
no traceback, in bounded time and memory (a forked child under an address-space limit).

Every case runs ``xsim trace PLAN -o OUT`` (so a plan that wrongly validated would also have to
generate and write its trace inside the limits). Bombs are generated here, never committed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from attack_runner import assert_clean_error, run_cli

from xsim_adapters.plan import limits as lim

ROOT = Path(__file__).resolve().parents[2]
BASE_TEXT = (ROOT / "workloads" / "homogeneous-h100.yaml").read_text()
BASE: dict[str, Any] = yaml.safe_load(BASE_TEXT)
PROFILE_HEADER = "tp,micro_batch,seq_len,fwd_layer_us,bwd_layer_us\n"

# A case: (id, build(tmp_path) -> plan path, text expected in the error line).
Case = tuple[str, Callable[[Path], Path], str]
CASES: list[Case] = []


def _write(tmp: Path, data: str | bytes, name: str = "plan.yaml") -> Path:
    p = tmp / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


def text_case(cid: str, text: str | bytes, named: str) -> None:
    CASES.append((cid, lambda tmp, t=text: _write(tmp, t), named))


def mutate_case(cid: str, mutate: Callable[[dict[str, Any]], Any], named: str) -> None:
    def build(tmp: Path) -> Path:
        d = copy.deepcopy(BASE)
        mutate(d)
        return _write(tmp, yaml.safe_dump(d, sort_keys=False, allow_unicode=True))

    CASES.append((cid, build, named))


def put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the value at a dotted path (``network.scale_out.link_gbps``), creating mappings."""
    keys = path.split(".")

    def mutate(d: dict[str, Any]) -> None:
        node = d
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {} if not isinstance(node.get(k), str) else {"preset": node[k]}
            node = node[k]
        node[keys[-1]] = value

    return mutate


def rename_group(new: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d["device_groups"] = {new: d["device_groups"]["h100"]}
        d["replicas"]["uniform"]["group"] = new

    return mutate


# ---------------------------------------------------------------- bombs
def _laughs(where: str) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    body = BASE_TEXT.replace(f"\n{where}:", f"\n{where}_unused:") if where != "name" else (
        BASE_TEXT.replace("name: llama2-7b-16xh100", "name: *a9")
    )
    if where == "seed":
        return "\n".join(lines) + "\nseed: *a9\n" + BASE_TEXT
    if where == "training":
        return "\n".join(lines) + "\n" + BASE_TEXT.replace("training:", "training: *a9\nx:", 1)
    return "\n".join(lines) + "\n" + body


text_case("bomb-laughs-name", _laughs("name"), "MAX_YAML_")
text_case("bomb-laughs-seed", _laughs("seed"), "MAX_YAML_")
text_case("bomb-laughs-training", _laughs("training"), "MAX_YAML_")
text_case("bomb-alias-count", "x: &x 1\ny: [" + ",".join(["*x"] * 500) + "]\n" + BASE_TEXT,
          "MAX_YAML_ALIASES")
text_case("bomb-recursive-alias", "x: &x [1, *x]\n" + BASE_TEXT, "recursive")
text_case("bomb-deep-flow", "name: " + "[" * 1000 + "]" * 1000 + "\n", "MAX_YAML_DEPTH")
text_case("bomb-deep-block", "".join(f"{' ' * i}k{i}:\n" for i in range(700)) + "\n",
          "MAX_YAML_DEPTH")
text_case("bomb-big-file", BASE_TEXT + "#" * (lim.MAX_PLAN_BYTES + 10) + "\n", "MAX_PLAN_BYTES")
text_case("bomb-many-values", BASE_TEXT + "pad: [" + "1," * 300_000 + "1]\n", "MAX_YAML_NODES")
text_case("bomb-long-int", BASE_TEXT + "seed: " + "9" * 5000 + "\n", "line")
mutate_case("bomb-nodes-uniform", put("device_groups.h100.nodes", 100_000_000),
            "device_groups.h100.nodes")
mutate_case("bomb-gpus-per-node", put("device_groups.h100.gpus_per_node", 10**12),
            "device_groups.h100.gpus_per_node")
mutate_case("bomb-devices-range", put("replicas.uniform.devices", [0, 1073741824]),
            "replicas.uniform.devices")
mutate_case("bomb-dp", put("replicas.uniform.dp", 10**9), "replicas.uniform.dp")
mutate_case("bomb-chunks", lambda d: d.update(collectives={"granularity": "chunked",
                                                            "chunks": 100_000_000}),
            "collectives.chunks")
mutate_case("bomb-chunks-at-limit", lambda d: d.update(
    collectives={"granularity": "chunked", "chunks": lim.MAX_CHUNKS, "channels": 64}),
    "MAX_TRACE_OPS")
mutate_case("bomb-channels", put("collectives.channels", 40_000), "collectives.channels")
mutate_case("bomb-layers-int16", put("model.layers", 40_000), "model.layers")
# 4 M micro-batches: GPipe has no steady state to merge, so the trace is refused by its size
# (a 1F1B pipeline of the same plan is simulated with p + 8 micro-batches: docs/scale.md)
mutate_case("bomb-micro-batches", lambda d: (put("training.global_batch", 1 << 22)(d),
                                             put("training.schedule", "gpipe")(d)),
            "MAX_TRACE_OPS")
mutate_case("bomb-global-batch", put("training.global_batch", 1 << 40), "training.global_batch")
mutate_case("bomb-fat-tree", put("network.scale_out.fat_tree_k", 100_000),
            "network.scale_out.fat_tree_k")
mutate_case("bomb-hidden", put("model.hidden", 1 << 40), "model.hidden")
mutate_case("bomb-activation-bytes", lambda d: (put("model.seq_len", lim.MAX_SEQ_LEN)(d),
                                                put("model.hidden", lim.MAX_HIDDEN)(d),
                                                put("model.ffn_hidden", lim.MAX_HIDDEN)(d),
                                                put("model.heads", 32)(d),
                                                put("model.kv_heads", 32)(d),
                                                put("training.micro_batch", 1 << 12)(d),
                                                put("training.global_batch", 1 << 13)(d)),
            "2^53")

# ---------------------------------------------------------------- crashes (overflow, types)
for field, value in [
    ("peak_tflops", 1e-300), ("peak_tflops", float("inf")), ("peak_tflops", float("nan")),
    ("peak_tflops", -5), ("hbm_GBps", 1e-300), ("nic_gbps", float("nan")),
    ("efficiency", 1e-300), ("hbm_GB", 1e300), ("scaleup_GBps", "fast"),
]:
    mutate_case(f"crash-{field}-{value}", put(f"device_types.H100-80GB.{field}", value),
                f"device_types.H100-80GB.{field}")
mutate_case("crash-link-gbps-tiny", put("network.scale_out.link_gbps", 1e-300),
            "network.scale_out.link_gbps")
mutate_case("crash-latency-huge", put("network.scale_out.latency_us", 1e300),
            "network.scale_out.latency_us")
mutate_case("crash-event-inf", put("network.events", [{"at_us": float("inf"), "kind": "fail",
                                                       "src": "a", "dst": "b"}]),
            "network.events[0].at_us")
mutate_case("crash-slow-device", lambda d: d.update(
    device_types={"H100-80GB": {"peak_tflops": lim.MIN_RATE, "hbm_GBps": lim.MIN_RATE}},
    model={"preset": "llama2-7b", "seq_len": 1 << 20}), "2^53")
text_case("crash-timestamp", BASE_TEXT + "seed: 2001-13-45\n", "invalid YAML")
text_case("crash-unhashable-key", BASE_TEXT + "? [1, 2]\n: 3\n", "line")
text_case("crash-python-tag", BASE_TEXT.replace("name: llama2-7b-16xh100",
                                                "name: !!python/object:os.system ls"), "line")
text_case("crash-binary-tag", BASE_TEXT.replace("name: llama2-7b-16xh100",
                                                "name: !!binary aGVsbG8="), "name")
text_case("crash-not-a-mapping", "- just\n- a list\n", "top level")
text_case("crash-duplicate-huge-key", BASE_TEXT + "name: " + "x" * 200 + "\n", "duplicate")
mutate_case("crash-name-null", put("name", None), "name")
mutate_case("crash-name-list", put("name", list(range(10**4))), "name")
mutate_case("crash-huge-unknown-key", lambda d: d.update({"k" * 100_000: 1}), "unknown key")
mutate_case("crash-replicas-string", put("replicas", "x" * 100_000), "replicas")
mutate_case("crash-tp-huge", put("replicas.uniform.tp", 10**60), "replicas.uniform")

# ---------------------------------------------------------------- names
for cid, name in [
    ("dotdot", "../../x"), ("absolute", "/tmp/xsim-attack-owned"), ("deps", "../deps"),
    ("slash", "a/b"), ("nul", "a\0b"), ("empty", ""), ("dot", "."), ("dots", ".."),
    ("long", "g" * 65), ("newline", "a\nb"), ("space", "my group"), ("unicode", "grüppe"),
    ("backslash", "a\\b"), ("leading-dash", "-rf"), ("int", 5),
]:
    mutate_case(f"name-group-{cid}", rename_group(name), "device_groups")
mutate_case("name-group-case-twin", lambda d: d["device_groups"].update(
    H100={"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}), "device_groups.H100")
mutate_case("name-plan-dotdot", put("name", "../x"), "name")
mutate_case("name-plan-huge", put("name", "n" * 500_000), "name")
mutate_case("name-type-slash", lambda d: d.update(device_types={"../t": {
    "peak_tflops": 1, "hbm_GB": 1, "hbm_GBps": 1, "scaleup_GBps": 1, "nic_gbps": 1}}),
    "device_types")

# ---------------------------------------------------------------- decoding (plan files)
text_case("decode-utf16", BASE_TEXT.encode("utf-16"), "byte offset 0")
text_case("decode-utf16-le-no-bom", BASE_TEXT.encode("utf-16-le"), "plan.yaml")
text_case("decode-latin1", BASE_TEXT.encode() + "# caf\xe9\n".encode("latin-1"),
          f"byte offset {len(BASE_TEXT.encode()) + 5}")
text_case("decode-binary", bytes(range(256)) * 4, "byte offset")
CASES.append(("decode-directory", lambda tmp: tmp, "is a directory"))
CASES.append(("decode-missing-no-extension", lambda tmp: tmp / "no-such-plan", "not found"))
CASES.append(("decode-device-file", lambda tmp: Path("/dev/zero"), "not a regular file"))


# ---------------------------------------------------------------- profiles
def profile_case(cid: str, content: str | bytes | None, named: str, target: str = "") -> None:
    def build(tmp: Path) -> Path:
        if target:
            rel = target
        else:
            rel = "prof.csv"
            if isinstance(content, bytes):
                (tmp / rel).write_bytes(content)
            else:
                (tmp / rel).write_text(content or "")
        d = copy.deepcopy(BASE)
        d["device_types"] = {"H100-80GB": {"profile": rel}}
        return _write(tmp, yaml.safe_dump(d, sort_keys=False))

    CASES.append((cid, build, named))


ROW = "4,1,2048,210.5,421.0\n"
profile_case("profile-passwd", None, "device_types.H100-80GB.profile", target="/etc/passwd")
profile_case("profile-directory", None, "is a directory", target="/tmp")
profile_case("profile-utf16", (PROFILE_HEADER + ROW).encode("utf-16"), "byte offset 0")
profile_case("profile-latin1", (PROFILE_HEADER + "# caf\xe9\n").encode("latin-1"),
             f"byte offset {len(PROFILE_HEADER) + 5}")
profile_case("profile-nan", PROFILE_HEADER + "4,1,2048,nan,421.0\n", "column fwd_layer_us")
profile_case("profile-huge-value", PROFILE_HEADER + "4,1,2048,1e300,421.0\n",
             "column fwd_layer_us")
profile_case("profile-nul", PROFILE_HEADER + "4,1,2048,\0,1\n", "prof.csv")
profile_case("profile-no-header", "", "prof.csv")
profile_case("profile-missing-column", "tp,micro_batch\n1,1\n", "bwd_layer_us")
profile_case("profile-big", PROFILE_HEADER + ROW * 60_000, "byte limit")
profile_case("profile-long-field", PROFILE_HEADER + "4,1,2048," + "9" * 200_000 + ",1\n",
             "prof.csv")


@pytest.mark.parametrize(("build", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_plan(build, named, tmp_path):
    """exit 1, one line naming the path or file, no traceback, bounded time and memory."""
    plan = build(tmp_path)
    out = run_cli(["trace", str(plan), "-o", str(tmp_path / "out")], cwd=str(tmp_path))
    assert_clean_error(out, named)
    assert not (tmp_path / "out").exists()
    assert "root:" not in out.stderr  # a profile path never echoes the file it names


def test_no_file_escapes_through_a_group_name(tmp_path):
    """A plan never writes outside the output directory (the group-name cases above)."""
    assert not Path("/tmp/xsim-attack-owned.parquet").exists()
    assert not (tmp_path.parent / "x.parquet").exists()


def test_estimate_bounds_the_shipped_plans():
    """The op-count estimate that refuses plans is an upper bound, within 10%, of the truth."""
    from xsim_adapters import api
    from xsim_adapters.workload.estimate import estimate_ops

    for name in ("homogeneous-h100.yaml", "uneven-layers.yaml", "hetero-pipeline-reshard.yaml"):
        plan = api.load_plan(ROOT / "workloads" / name)
        n, est = api.generate(plan).num_ops, estimate_ops(plan)
        assert n <= est <= 1.1 * n, (name, n, est)


def test_a_stored_plan_yaml_gets_the_larger_limits():
    """xsim's own plan.yaml beside a trace spells out every stage (a valid 4,096-stage plan has
    ~60,000 values), so it is read with MAX_STORED_YAML_NODES; a user's plan is not."""
    from xsim_adapters.errors import PlanError
    from xsim_adapters.plan.bounded_yaml import parse_yaml

    text = "stages:\n" + "- {group: h100, devices: [0, 1], tp: 1}\n" * 6_000  # 54,003 values
    assert len(parse_yaml(text, stored=True)["stages"]) == 6_000
    with pytest.raises(PlanError, match="MAX_YAML_NODES"):
        parse_yaml(text)
