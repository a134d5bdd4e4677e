"""Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing).

Layout: one process per replica (``pid = replica + 1``; ranks outside any replica get
``pid = 1001 + device group index``), one thread per (rank, lane): ``tid = rank * 8 + lane``
with lane 0 = compute (every compute op is one "X" event: a rank's compute ops are chained,
so they never overlap on the track) and lanes 1-4 = tp, pp, reshard, dp communication, drawn
as the merged busy intervals of the flows the rank sends or receives (flows of one phase
overlap, and overlapping "X" events on one track do not nest, so they are merged).

Cap (``max_events``, default 400,000 events): when the full picture is larger, only the
lowest rank of every (replica, stage) is kept (its TP peers behave alike); if that is still
larger, only the earliest ``max_events`` events by start time are kept. The rule applied and
the counts are recorded under ``otherData.xsim`` in the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._atomic import write_text_atomic
from ..metrics.intervals import union_blocks
from ..trace.schema import COMM_PHASES, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX

LANES = ("compute", *COMM_PHASES)
LANE_STRIDE = 8
DEFAULT_MAX_EVENTS = 400_000


def _pids(ranks: pd.DataFrame) -> tuple[np.ndarray, dict[int, str]]:
    groups = {g: i for i, g in enumerate(dict.fromkeys(ranks["group"].astype(str)))}
    rep = ranks["replica"].to_numpy(dtype=np.int64)
    gidx = np.array([groups[str(g)] for g in ranks["group"]], dtype=np.int64)
    pid = np.where(rep >= 0, rep + 1, 1001 + gidx)
    names: dict[int, str] = {}
    for p, r, g in zip(pid.tolist(), rep.tolist(), ranks["group"].astype(str), strict=True):
        names.setdefault(p, f"replica {r}" if r >= 0 else f"group {g}")
    return pid, names


def _events(tf: pd.DataFrame, keep_rank: np.ndarray) -> pd.DataFrame:
    """Columns rank, lane, name, start_ns, end_ns, op_id (-1 for merged comm blocks)."""
    comp = tf[(tf["kind"] == KIND_COMPUTE) & keep_rank[tf["rank"].clip(lower=0)]
              & (tf["rank"] >= 0)]
    ev = [pd.DataFrame({
        "rank": comp["rank"].to_numpy(dtype=np.int64), "lane": 0,
        "name": comp["phase_name"].astype(str).to_numpy(),
        "start_ns": comp["start_ns"].to_numpy(), "end_ns": comp["end_ns"].to_numpy(),
        "op_id": comp["op_id"].to_numpy(dtype=np.int64),
        "microbatch": comp["microbatch"].to_numpy(dtype=np.int64),
    })]
    fl = tf[tf["kind"] == KIND_FLOW]
    r = np.concatenate([fl["rank"].to_numpy(dtype=np.int64), fl["dst"].to_numpy(dtype=np.int64)])
    s = np.concatenate([fl["start_ns"].to_numpy()] * 2)
    e = np.concatenate([fl["end_ns"].to_numpy()] * 2)
    ph = np.concatenate([fl["phase"].to_numpy(dtype=np.int64)] * 2)
    for lane, p in enumerate(COMM_PHASES, start=1):
        m = (ph == PHASE_INDEX[p]) & keep_rank[r]
        k, lo, hi = union_blocks(r[m], s[m], e[m])
        ev.append(pd.DataFrame({"rank": k, "lane": lane, "name": p, "start_ns": lo,
                                "end_ns": hi, "op_id": -1, "microbatch": -1}))
    return pd.concat(ev, ignore_index=True)


def perfetto_trace(tf: pd.DataFrame, ranks: pd.DataFrame,
                   max_events: int = DEFAULT_MAX_EVENTS) -> dict[str, Any]:
    """The trace-event document for timeline frame ``tf`` and rank metrics/table ``ranks``."""
    n = len(ranks)
    keep = np.ones(n, dtype=bool)
    ev = _events(tf, keep)
    rule = "all ranks, all events"
    total = len(ev)
    if len(ev) > max_events:
        first = ranks.sort_values("rank").drop_duplicates(["replica", "stage"])["rank"]
        keep = np.zeros(n, dtype=bool)
        keep[first.to_numpy(dtype=np.int64)] = True
        ev = _events(tf, keep)
        rule = "lowest rank of each (replica, stage)"
    if len(ev) > max_events:
        ev = ev.sort_values(["start_ns", "rank", "lane"], kind="stable").head(max_events)
        rule += f"; earliest {max_events} events by start time"
    pid, pnames = _pids(ranks)
    ev = ev.sort_values(["rank", "lane", "start_ns"], kind="stable")
    rank = ev["rank"].to_numpy(dtype=np.int64)
    ts = np.round(ev["start_ns"].to_numpy() / 1000.0, 6)
    dur = np.round((ev["end_ns"] - ev["start_ns"]).to_numpy() / 1000.0, 6)
    events: list[dict[str, Any]] = []
    for p, nm in sorted(pnames.items()):
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": nm}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                       "args": {"sort_index": p}})
    dtype = ranks["device_type"].astype(str).to_numpy()
    stage = ranks["stage"].to_numpy(dtype=np.int64)
    for rk, lane in ev[["rank", "lane"]].drop_duplicates().itertuples(index=False):
        tid = int(rk) * LANE_STRIDE + int(lane)
        events.append({"ph": "M", "name": "thread_name", "pid": int(pid[rk]), "tid": tid,
                       "args": {"name": f"rank {rk} s{stage[rk]} {dtype[rk]} {LANES[lane]}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(pid[rk]), "tid": tid,
                       "args": {"sort_index": tid}})
    for r_, ln, nm, t, d, op, mb in zip(
        rank.tolist(), ev["lane"].tolist(), ev["name"].tolist(), ts.tolist(), dur.tolist(),
        ev["op_id"].tolist(), ev["microbatch"].tolist(), strict=True,
    ):
        e: dict[str, Any] = {"ph": "X", "name": nm, "cat": nm, "pid": int(pid[r_]),
                             "tid": r_ * LANE_STRIDE + ln, "ts": t, "dur": d}
        if op >= 0:
            e["args"] = {"op_id": op, "microbatch": mb}
        events.append(e)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"xsim": {"rule": rule, "events_total": int(total),
                               "events_written": int(len(ev)), "max_events": int(max_events)}},
    }


def write_perfetto(path: str | Path, tf: pd.DataFrame, ranks: pd.DataFrame,
                   max_events: int = DEFAULT_MAX_EVENTS) -> Path:
    """Write :func:`perfetto_trace` as compact JSON to ``path`` atomically."""
    doc = perfetto_trace(tf, ranks, max_events)
    return write_text_atomic(path, json.dumps(doc, separators=(",", ":")))
