"""Background traffic: a synthetic job of point-to-point messages sharing the fabric.

A traffic file describes hosts (device groups, as in a plan) and a pattern; it runs beside one
or more training jobs (``xsim run PLAN --job traffic.yaml``, :mod:`xsim_adapters.jobs`), so a
user can ask what other tenants' traffic does to a training run::

    traffic:
      name: tenants
      device_groups: {bg: {type: H100-80GB, nodes: 4, gpus_per_node: 8}}
      pattern: permutation     # permutation | all_to_all | incast
      load: 0.5                # offered load per GPU, fraction of its NIC rate, (0, 1]
      message_bytes: 8388608   # one message (one flow), bytes
      duration_ms: 50          # how long each sender keeps sending; default: the longest
                               # training job's iteration alone in its place
      fan_in: 8                # incast only: senders per receiver
      seed: 0                  # permutation draw

The model is closed-loop on/off traffic: every GPU sends messages of ``message_bytes`` one after
another to its destinations, and after each message waits ``t_msg x (1/load - 1)``, where
``t_msg = message_bytes x 8 / nic_gbps`` is the message's time at its own NIC's rate. On an
idle fabric the GPU then offers exactly ``load`` of its NIC rate; when the fabric is congested
its messages take longer and it offers less (as a window-limited sender does). Senders send
``floor(duration / (t_msg / load))`` messages (at least one).

Destinations: ``permutation``: one partner per GPU for the whole run, a seeded random
permutation of the GPUs in which no GPU sends to a GPU of its own server (every GPU receives
from exactly one; servers in random order with their GPUs shuffled, laid end to end, each GPU
sending to the one a largest server's size further on); ``all_to_all``: GPU ``i`` of ``n`` sends its
``k``-th message to GPU ``(i + 1 + k mod (n - 1)) mod n``, cycling through every other GPU;
``incast``: GPUs in groups of ``fan_in + 1`` consecutive ranks, the first receives from the
others. The traffic's messages are ``pp`` (point-to-point) flows in its own trace; they never
enter a training job's metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PlanError
from .plan import _fields as f
from .plan.bounded_yaml import parse_yaml
from .plan.loader import read_plan_file
from .plan.model import DeviceGroup, DeviceType, NetworkSpec
from .plan.presets import _device_presets
from .plan.replicas import parse_groups
from .trace.builder import TraceBuilder
from .trace.schema import KIND_BARRIER, KIND_FLOW, Trace

PATTERNS = ("permutation", "all_to_all", "incast")
TRAFFIC_KEYS = ("name", "device_groups", "pattern", "load", "message_bytes", "duration_ms",
                "fan_in", "seed")
REQUIRED_TRAFFIC_KEYS = ("name", "device_groups", "pattern", "load", "message_bytes")
# Messages of one traffic job, all senders together: a bound on the trace it generates.
MAX_TRAFFIC_MESSAGES = 500_000
MAX_MESSAGE_BYTES = 1 << 40
# Second word of the permutation draw's seed (a fixed, arbitrary constant).
PERMUTATION_STREAM_ID = 0x7A


@dataclass(frozen=True)
class TrafficSpec:
    """A validated traffic file (see the module docstring)."""

    name: str
    device_groups: tuple[DeviceGroup, ...]
    device_types: dict[str, DeviceType]
    pattern: str
    load: float
    message_bytes: int
    duration_ms: float | None = None  # None: the longest training job's iteration
    fan_in: int = 8
    seed: int = 0
    network: NetworkSpec = field(default_factory=NetworkSpec)  # left out: shares the jobs'

    @property
    def num_ranks(self) -> int:
        return sum(g.num_devices for g in self.device_groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.nodes for g in self.device_groups)

    def group_rank_offset(self, name: str) -> int:
        off = 0
        for g in self.device_groups:
            if g.name == name:
                return off
            off += g.num_devices
        raise KeyError(name)


def load_job(path: str | os.PathLike[str]) -> Any:
    """A job file for ``xsim run --job``: a traffic file (top key ``traffic:``) as a
    TrafficSpec, anything else as a validated Plan. The file is read and parsed once."""
    p = Path(path)
    return job_from_data(parse_yaml(read_plan_file(p), str(p)), str(p.resolve().parent),
                         source=str(p))


def job_from_data(data: Any, base_dir: str | None = None, source: str | None = None) -> Any:
    """A job from plain data: a traffic file's (top key ``traffic:``) as a TrafficSpec,
    anything else as a validated Plan (``base_dir`` resolves its relative paths; ``source``
    names the file in the error when it is a search spec or a sweep file)."""
    from .feasibility import plan_from_dict

    if isinstance(data, dict) and "traffic" in data:
        return traffic_from_dict(data, source)
    return plan_from_dict(data, base_dir=base_dir, source=source)


def load_traffic(path: str | os.PathLike[str]) -> TrafficSpec:
    """Read and validate a traffic file; PlanError naming the place otherwise."""
    p = Path(path)
    return traffic_from_dict(parse_yaml(read_plan_file(p), str(p)), str(p))


def traffic_from_dict(d: Any, source: str | None = None) -> TrafficSpec:
    """Plain data (what YAML gives) -> TrafficSpec (``source``: the file, for messages)."""
    from .plan.kinds import TRAFFIC_SPEC, check_kind

    check_kind(d, TRAFFIC_SPEC, source)
    top = f.expect_mapping(d, "")
    f.check_keys(top, "", ("traffic",), ("traffic",))
    path = "traffic"
    m = f.expect_mapping(top["traffic"], path)
    f.check_keys(m, path, TRAFFIC_KEYS, REQUIRED_TRAFFIC_KEYS)
    name = f.check_name(m["name"], f.join(path, "name"), "traffic name")
    presets = _device_presets()
    groups = parse_groups(m["device_groups"], f.join(path, "device_groups"), presets)
    pattern = f.get_enum(m, "pattern", path, PATTERNS)
    load = f.get_number(m, "load", path, at_most=1.0)
    nbytes = f.get_int(m, "message_bytes", path, maximum=MAX_MESSAGE_BYTES)
    duration = None
    if "duration_ms" in m:
        duration = f.get_number(m, "duration_ms", path, at_most=1e9)
    fan_in = f.get_int(m, "fan_in", path, 8)
    seed = f.get_int(m, "seed", path, 0, minimum=0)
    n = sum(g.num_devices for g in groups)
    if n < 2:
        raise PlanError(f.join(path, "device_groups"), f"expected at least 2 GPUs to send "
                                                       f"between (got {n})")
    if pattern == "incast" and fan_in >= n:
        raise PlanError(f.join(path, "fan_in"), f"expected fewer senders than the {n} GPUs "
                                                f"(got {fan_in})")
    if pattern == "permutation" and sum(g.nodes for g in groups) < 2:
        raise PlanError(f.join(path, "pattern"), "permutation sends between servers: expected "
                                                 "at least 2 servers")
    return TrafficSpec(
        name=name, device_groups=groups,
        device_types={g.type: presets[g.type] for g in groups},
        pattern=pattern, load=load, message_bytes=nbytes, duration_ms=duration,
        fan_in=fan_in, seed=seed,
    )


def destinations(spec: TrafficSpec, messages: int) -> np.ndarray:
    """int64 (senders, messages): destination rank of each sender's k-th message (-1: the GPU
    only receives). Senders are all ranks 0..n-1 in rank order."""
    n = spec.num_ranks
    ranks = np.arange(n)
    if spec.pattern == "all_to_all":
        k = np.arange(messages)
        return (ranks[:, None] + 1 + k[None, :] % (n - 1)) % n
    if spec.pattern == "incast":
        size = spec.fan_in + 1
        head = ranks - ranks % size
        dst = np.where(ranks % size == 0, -1, head)
        dst = np.where(head + 1 >= n, -1, dst)  # a last group with no sender keeps quiet
        return np.repeat(dst[:, None], messages, axis=1)
    server = _servers(spec)
    m = int(np.bincount(server).max())
    if 2 * m > n:
        raise PlanError("traffic.device_groups", f"permutation sends every GPU to another "
                                                 f"server: no server may hold more than half "
                                                 f"of the {n} GPUs (one holds {m})")
    # Servers in a random order, each server's GPUs shuffled, laid end to end; GPU at position
    # i sends to the one at i + m (mod n). A server's block is at most m long and m <= n/2, so
    # the shift always leaves the block: a permutation with no same-server pair.
    rng = np.random.default_rng([spec.seed, PERMUTATION_STREAM_ID])
    order = np.concatenate([rng.permutation(np.flatnonzero(server == s_))
                            for s_ in rng.permutation(int(server.max()) + 1)])
    perm = np.empty(n, dtype=np.int64)
    perm[order] = order[(np.arange(n) + m) % n]
    return np.repeat(perm[:, None], messages, axis=1)


def _servers(spec: TrafficSpec) -> np.ndarray:
    out = []
    node = 0
    for g in spec.device_groups:
        out.append(node + np.arange(g.num_devices) // g.gpus_per_node)
        node += g.nodes
    return np.concatenate(out)


def _nic_gbps(spec: TrafficSpec) -> np.ndarray:
    return np.concatenate([
        np.full(g.num_devices, g.nic_gbps if g.nic_gbps is not None
                else spec.device_types[g.type].nic_gbps, dtype=np.float64)
        for g in spec.device_groups
    ])


def generate_traffic(spec: TrafficSpec, duration_ns: float) -> Trace:
    """The traffic job's trace for ``duration_ns`` of sending (see the module docstring)."""
    nic = _nic_gbps(spec)
    msg_ns = spec.message_bytes * 8.0 / nic  # per sender, at its own NIC rate
    period_ns = msg_ns / spec.load
    per = np.maximum(1, np.floor(duration_ns / period_ns)).astype(np.int64)
    messages = int(per.max())
    if int(per.sum()) > MAX_TRAFFIC_MESSAGES:
        raise PlanError("traffic", f"{int(per.sum()):,} messages exceed MAX_TRAFFIC_MESSAGES "
                                   f"({MAX_TRAFFIC_MESSAGES:,}): raise message_bytes or lower "
                                   f"load or duration_ms")
    dst = destinations(spec, messages)
    gap = np.rint(msg_ns * (1.0 / spec.load - 1.0)).astype(np.int64)
    ranks = [(g.name, g.type) for g in spec.device_groups for _ in range(g.num_devices)]
    tb = TraceBuilder(ranks, plan_name=spec.name)
    for r in range(spec.num_ranks):
        prev: list[int] = []
        for k in range(int(per[r])):
            d = int(dst[r, k])
            if d < 0:
                break
            op = tb.flow(r, d, spec.message_bytes, phase="pp", deps=prev, microbatch=k)
            prev = [op]
            if gap[r] > 0:
                prev = [tb.add(KIND_BARRIER, r, phase="pp", deps=prev,
                               duration_ns=int(gap[r]))]
    return tb.build()


def traffic_summary(spec: TrafficSpec, trace: Trace, frame: Any) -> dict[str, Any]:
    """Offered vs achieved load: per sending GPU, payload bits over its sending span (first
    message start to last message end) divided by its NIC rate; mean over senders."""
    ops = trace.ops
    fl = (ops["kind"] == KIND_FLOW).to_numpy()
    src = ops["rank"].to_numpy()[fl]
    start = frame["start_ns"].to_numpy()[fl]
    end = frame["end_ns"].to_numpy()[fl]
    nbytes = ops["bytes"].to_numpy()[fl].astype(np.float64)
    n = spec.num_ranks
    lo = np.full(n, np.inf)
    hi = np.zeros(n)
    np.minimum.at(lo, src, start)
    np.maximum.at(hi, src, end)
    bits = np.bincount(src, weights=nbytes * 8.0, minlength=n)
    senders = bits > 0
    achieved = bits[senders] / (hi[senders] - lo[senders]) / _nic_gbps(spec)[senders]
    return {
        "job": spec.name, "pattern": spec.pattern, "ranks": n,
        "messages": int(fl.sum()), "bytes": int(nbytes.sum()),
        "offered_load": spec.load,
        "achieved_load": float(achieved.mean()) if len(achieved) else 0.0,
        "iteration_time_ns": int(round(float(end.max()))) if len(end) else 0,
    }

