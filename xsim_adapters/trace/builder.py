"""Traces built op by op: synthetic traffic jobs, nccl-tests collectives, tests and custom
workloads.

The workload generator builds traces in bulk from a plan; :class:`TraceBuilder` builds one op at
a time when there is no plan. The result is an ordinary :class:`~xsim_adapters.trace.schema.Trace`.
Ring collectives lowered as the generator lowers them are :mod:`xsim_adapters.testing.handmade`
(they need the generator's lowering, which the trace contract must not import).

>>> tb = TraceBuilder(4)
>>> send = tb.flow(0, 1, 1 << 20)
>>> trace = tb.build()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from .schema import (
    COLLECTIVE_COLUMNS,
    DEP_COLUMNS,
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    OP_COLUMNS,
    PHASE_INDEX,
    SCHEMA_VERSION,
    Trace,
)

_DEFAULTS: dict[str, Any] = {c: -1 for c in OP_COLUMNS}
_DEFAULTS.update(bytes=0, duration_ns=0, flops=0.0)


class TraceBuilder:
    """Builds a Trace op by op; op ids are dense in creation order.

    ``ranks``: a rank count, or ``(device group, device type)`` per global rank (the manifest's
    rank table, which metrics group by). ``peak_tflops`` per device type and
    ``tokens_per_iteration`` feed the MFU and tokens/s metrics.
    """

    def __init__(self, ranks: int | Sequence[tuple[str, str]], *,
                 peak_tflops: Mapping[str, float] | None = None,
                 tokens_per_iteration: int = 0, plan_name: str = "handmade") -> None:
        self.ranks = ([("g", "gpu")] * ranks) if isinstance(ranks, int) else list(ranks)
        self.rows: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int]] = []
        self.colls: list[dict[str, Any]] = []
        self.peak = dict(peak_tflops or {t: 100.0 for _, t in self.ranks})
        self.tokens = tokens_per_iteration
        self.plan_name = plan_name

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def add(self, kind: int, rank: int, *, phase: str, deps: Iterable[int] = (),
            **columns: Any) -> int:
        """Append an op of ``kind`` (a ``KIND_*``) owned by ``rank``; returns its op id.
        ``columns`` sets any other op column (``dst``, ``bytes``, ``duration_ns``, tags)."""
        op = len(self.rows)
        row = dict(_DEFAULTS)
        row.update(op_id=op, kind=kind, rank=rank, phase=PHASE_INDEX[phase])
        row.update(columns)
        self.rows.append(row)
        self.dep(deps, op)
        return op

    def compute(self, rank: int, duration_ns: int, *, phase: str = "fwd",
                deps: Iterable[int] = (), **tags: Any) -> int:
        """A compute op of ``duration_ns`` on ``rank``."""
        return self.add(KIND_COMPUTE, rank, phase=phase, deps=deps, duration_ns=duration_ns,
                        **tags)

    def flow(self, src: int, dst: int, nbytes: int, *, phase: str = "dp",
             deps: Iterable[int] = (), **tags: Any) -> int:
        """A flow of ``nbytes`` from rank ``src`` to rank ``dst``."""
        return self.add(KIND_FLOW, src, phase=phase, deps=deps, dst=dst, bytes=nbytes, **tags)

    def barrier(self, *, rank: int = -1, phase: str = "dp", deps: Iterable[int] = (),
                **tags: Any) -> int:
        """A zero-time join of ``deps``."""
        return self.add(KIND_BARRIER, rank, phase=phase, deps=deps, **tags)

    def dep(self, preds: int | Iterable[int], succ: int) -> None:
        """Edges ``pred -> succ`` for one predecessor or several."""
        for p in [preds] if isinstance(preds, int) else preds:
            self.edges.append((p, succ))

    def collective(self, cid: int, kind: str, phase: str, ranks: Sequence[int], nbytes: int,
                   algorithm: str = "ring", **columns: Any) -> None:
        """A row of the collectives frame (``kind``: all_reduce, reshard, p2p, ...)."""
        row = {"collective": cid, "kind": kind, "phase": PHASE_INDEX[phase], "bytes": nbytes,
               "ranks": ",".join(map(str, ranks)), "algorithm": algorithm, "channels": 1,
               "sync_group": -1, "layer_start": -1, "layer_stop": -1, "chunk": -1}
        row.update(columns)
        self.colls.append(row)

    def build(self, replicas: list[dict[str, Any]] | None = None) -> Trace:
        """The Trace; ``replicas`` goes to the manifest's workload section as is."""
        ops = pd.DataFrame(self.rows, columns=list(OP_COLUMNS)).astype(OP_COLUMNS)
        deps = pd.DataFrame(self.edges, columns=list(DEP_COLUMNS)).astype(DEP_COLUMNS)
        colls = pd.DataFrame(self.colls, columns=list(COLLECTIVE_COLUMNS)).astype(
            COLLECTIVE_COLUMNS)
        manifest = {
            "schema_version": SCHEMA_VERSION, "plan_name": self.plan_name,
            "plan_digest": "0" * 16,
            # no node: a hand-made trace knows its ranks' labels, not where they sit
            "ranks": [{"rank": r, "group": g, "device_type": t, "local": 0}
                      for r, (g, t) in enumerate(self.ranks)],
            "device_types": {t: {"peak_tflops": p} for t, p in self.peak.items()},
            "workload": {"tokens_per_iteration": self.tokens, "replicas": replicas or []},
            "num_ops": len(ops), "num_deps": len(deps),
            "groups": sorted({g for g, _ in self.ranks}),
        }
        return Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest)
