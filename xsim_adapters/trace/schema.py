"""The trace: the contract between the workload generator and every backend.

In memory a :class:`Trace` is two pandas frames plus a manifest:

``ops`` (one row per op, ``op_id`` dense 0..N-1 and equal to the row index, sorted by op_id):

==============  =======  ===============================================================
column          dtype    meaning
==============  =======  ===============================================================
op_id           int64    dense id, global across device groups
kind            int8     ``KIND_COMPUTE`` (0), ``KIND_FLOW`` (1), ``KIND_BARRIER`` (2)
rank            int32    owner: compute rank, flow source, barrier owner (-1 if none)
dst             int32    flow destination rank; -1 for other kinds
bytes           int64    flow payload bytes; 0 for other kinds
duration_ns     int64    compute duration; a barrier's delay (else 0); a flow's start latency:
                         the time from its last predecessor's end to its first byte (NCCL's
                         per-call latency and protocol cost, 0 for plain transfers)
flops           float64  model FLOPs the compute op performs on its rank (0 for other kinds)
phase           int8     index into ``PHASES``
replica         int16    data-parallel replica (-1: none, e.g. a DP sync barrier)
stage           int16    pipeline stage within the replica (-1: none)
microbatch      int32    micro-batch (-1: none)
layer_start     int16    first layer covered (-1: none; -2 embedding; model.layers: head)
layer_stop      int16    one past the last layer covered (-1: none)
collective      int32    collective id (-1: none); ids are global and dense
step            int32    ring step within the collective (-1: none)
channel         int16    ring / channel within the collective (-1: none)
==============  =======  ===============================================================

``deps`` (edges, global across groups): ``pred`` int32, ``succ`` int32 (schema 2; int64
before); an op starts when all of its predecessors have ended. There are no implicit
dependencies: compute ops of one rank are chained by explicit edges in the order the rank runs
them, so a backend only executes the DAG.

``collectives`` (one row per collective): ``collective`` int32, ``kind`` (str: all_reduce,
reduce_scatter, all_gather, reshard, p2p), ``phase`` int8, ``bytes`` int64 (payload S per rank
for ring collectives, total moved for reshard/p2p), ``ranks`` (str: comma-joined ring order;
for p2p and reshard the two stages' ranks, each comma-joined, joined by ``;``), ``algorithm``
(str), ``channels`` int16, ``sync_group`` int32 (DP sync group, -1 otherwise),
``layer_start``/``layer_stop`` int16, ``chunk`` int32 (LCM multi-ring chunk index, -1 otherwise).

``manifest`` (dict, JSON on disk): ``schema_version``, ``plan_name``, ``plan_digest``,
``generator`` settings, ``ranks`` (list of {rank, group, node, device_type, local}),
``op_counts`` (per kind and phase), ``num_ops``, ``num_deps``, ``groups`` (names),
``device_types`` ({name: {peak_tflops, hbm_GBps, scaleup_GBps, nic_gbps, efficiency}}),
``workload`` ({global_batch, micro_batch, seq_len, tokens_per_iteration, schedule, dp,
replicas: [{replica, pp, tp: [..], micro_batches, layers: [[a, b], ..]}]}).

On disk (see :mod:`xsim_adapters.trace.io`)::

    DIR/manifest.json
    DIR/groups/<device group>.parquet   ops whose ``rank`` is in that group (barriers with
                                        rank -1 go to the first group)
    DIR/deps.parquet
    DIR/collectives.parquet
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# 2: a flow's ``duration_ns`` is its start latency (NCCL's per-member cost, which version 1
# traces carried as one timed barrier per member before its first send).
SCHEMA_VERSION = 2

KIND_COMPUTE = 0
KIND_FLOW = 1
KIND_BARRIER = 2
KINDS = ("compute", "flow", "barrier")

# "wgrad" (weight-gradient pass W of a zero-bubble schedule) is last so older indices hold.
# "ep" (expert-parallel all-to-all) and "cp" (context-parallel K/V ring) came later still.
PHASES = ("fwd", "bwd", "recompute", "tp", "pp", "reshard", "dp", "optim", "wgrad", "ep", "cp")
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
COMPUTE_PHASES = ("fwd", "bwd", "recompute", "optim", "wgrad")
COMM_PHASES = ("tp", "pp", "reshard", "dp", "ep", "cp")
# Phases a manifest lists only when the trace has ops of them (dense traces stay as before).
OPTIONAL_PHASES = ("ep", "cp")

LAYER_EMBEDDING = -2  # layer_start value for the embedding lookup

OP_COLUMNS: dict[str, Any] = {
    "op_id": np.int64,
    "kind": np.int8,
    "rank": np.int32,
    "dst": np.int32,
    "bytes": np.int64,
    "duration_ns": np.int64,
    "flops": np.float64,
    "phase": np.int8,
    "replica": np.int16,
    "stage": np.int16,
    "microbatch": np.int32,
    "layer_start": np.int16,
    "layer_stop": np.int16,
    "collective": np.int32,
    "step": np.int32,
    "channel": np.int16,
}
# int32: a trace has fewer than 2^31 ops (MAX_TRACE_OPS is 50 M); 8 bytes per edge, not 16
DEP_COLUMNS: dict[str, Any] = {"pred": np.int32, "succ": np.int32}
COLLECTIVE_COLUMNS: dict[str, Any] = {
    "collective": np.int32,
    "kind": object,
    "phase": np.int8,
    "bytes": np.int64,
    "ranks": object,
    "algorithm": object,
    "channels": np.int16,
    "sync_group": np.int32,
    "layer_start": np.int16,
    "layer_stop": np.int16,
    "chunk": np.int32,
}


@dataclass
class Trace:
    """A backend-agnostic trace: ops, dependency edges, collectives and a manifest."""

    ops: pd.DataFrame
    deps: pd.DataFrame
    collectives: pd.DataFrame
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_ranks(self) -> int:
        return len(self.manifest["ranks"])

    def flows(self) -> pd.DataFrame:
        return self.ops[self.ops["kind"] == KIND_FLOW]

    def phase_name(self, idx: int) -> str:
        return PHASES[idx]


def is_dense_ids(ids: np.ndarray) -> bool:
    """Whether ``ids`` is exactly 0, 1, ..., len - 1 (checked in slices: no per-op copy)."""
    step = 1 << 20
    for lo in range(0, len(ids), step):
        part = ids[lo:lo + step]
        if not np.array_equal(part, np.arange(lo, lo + len(part))):
            return False
    return True


def empty_ops() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in OP_COLUMNS.items()})
