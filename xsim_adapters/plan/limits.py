"""Limits that bound the work a plan can cause, checked before anything large is built.

A plan is user input and may be hostile: a few bytes of YAML can ask for a hundred million
devices or chunks. Every limit here is documented in docs/plan.md ("Limits") and named in the
error that enforces it, so a refused plan says which limit it hit and by how much.

Three layers:

- the file (:mod:`.loader`): size, YAML nesting depth, alias uses and nodes after alias
  expansion (a "billion laughs" document is refused while it is being composed);
- field ranges (:mod:`.sections`, :mod:`.replicas`): each integer the trace stores fits its
  column's dtype (``int16`` layers, replicas and channels), device counts are bounded;
- the plan as a whole (the limits below, enforced by :func:`xsim_adapters.feasibility.check_size`
  after the plan validated and before any trace is generated: it needs the generator's op
  estimate and cost model): estimated op count and memory, longest compute op, largest byte
  count, so that generation can neither run out of memory nor overflow an ``int64``.
"""

from __future__ import annotations

import os
import resource

from ..errors import PlanError

# ---- the file
MAX_PLAN_BYTES = 1 << 20  # 1 MiB; the shipped plans are under 5 KB
MAX_YAML_DEPTH = 32  # nesting of mappings and lists; the shipped plans nest 5 deep
MAX_YAML_ALIASES = 100  # uses of `*anchor`
MAX_YAML_NODES = 50_000  # scalars, lists and mappings, aliases expanded (the 1,024-GPU plan: ~300)

# a plan.yaml xsim wrote beside a trace lists every replica and stage: room for 65,536 stages
MAX_STORED_PLAN_BYTES = 64 << 20
MAX_STORED_YAML_NODES = 2_000_000

# ---- field ranges (the trace's integer columns: schema.OP_COLUMNS)
INT16_MAX = (1 << 15) - 1
MAX_DEVICES = 65_536  # all device groups together: 4x the 16,384-GPU design target
MAX_LAYERS = INT16_MAX - 1  # layer_stop of the head op is layers + 1 (int16)
MAX_REPLICAS = INT16_MAX  # replica column (int16)
MAX_CHANNELS = 1024  # channel column is int16; NCCL itself uses at most 32 per collective
MAX_CHUNKS = 4096  # pipelined pieces per ring edge (collectives.granularity: chunked)
MAX_HIDDEN = 1 << 20
MAX_FFN_HIDDEN = 1 << 22
MAX_SEQ_LEN = 1 << 24
MAX_VOCAB = 1 << 24
MAX_BATCH = 1 << 24  # global_batch and micro_batch (sequences)
MAX_FAT_TREE_K = 256  # a k-ary fat tree has 5k^2/4 switches and k^3/4 hosts
MIN_RATE = 1e-3  # smallest TFLOP/s, GB/s or Gb/s a device or link may have
MAX_RATE = 1e9  # largest; beyond it durations round to zero
MAX_TIME_US = 1e12  # latencies and event times (11.6 days)
MAX_CLOCK_MHZ = 1e5  # SM clocks of a device type (100 GHz: far above any part)

# ---- the plan as a whole
MAX_TRACE_OPS = 50_000_000  # ops of one trace (the 1,024-GPU shipped plan has 2.6 million)
# Peak resident memory while generating, writing and replaying a trace, per op: measured 500
# bytes on the 1,024-GPU shipped plan (2.55 M ops, 1.27 GB max RSS for generate + write);
# the estimate uses 600 to leave room for a backend.
BYTES_PER_OP = 600
MAX_EXACT = 1 << 53  # every duration (ns) and byte count stays exact in float64 and int64


def memory_budget_bytes() -> int:
    """What this process may allocate: physical memory, or the address-space limit if lower."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 1 << 40
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(phys, soft) if soft != resource.RLIM_INFINITY else phys


def check_ops(ops: int) -> None:
    """Refuse a trace of about ``ops`` ops over :data:`MAX_TRACE_OPS` or the memory budget."""
    if ops > MAX_TRACE_OPS:
        raise PlanError(
            "",
            f"the plan's trace would have about {ops:,} ops, over the limit of "
            f"{MAX_TRACE_OPS:,} (MAX_TRACE_OPS, docs/plan.md#limits); use fewer micro-batches, "
            "channels, chunks or devices",
        )
    need, budget = ops * BYTES_PER_OP, memory_budget_bytes()
    if need > budget:
        raise PlanError(
            "",
            f"the plan's trace of about {ops:,} ops needs about {need / 1e9:.1f} GB "
            f"({BYTES_PER_OP} bytes per op), more than the {budget / 1e9:.1f} GB this process "
            "may use (physical memory or ulimit -v)",
        )
