"""Pictures: the timeline of one run, and a side-by-side of several backends' summaries.

Rendering is in bulk (one PolyCollection per phase), never one artist per op, so a 1,024-GPU
trace draws in about the time of a 16-GPU one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection

# Figure (not pyplot): no global backend or window state; savefig renders with Agg.
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .._atomic import write_atomic
from ..metrics.intervals import union_blocks
from ..trace.schema import COMM_PHASES, COMPUTE_PHASES, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX

MAX_RANK_ROWS = 64
PHASE_COLORS = {
    "fwd": "#4C72B0", "bwd": "#DD8452", "recompute": "#8172B3", "optim": "#937860",
    "wgrad": "#E5AE38",
    "tp": "#55A868", "pp": "#C44E52", "reshard": "#DA8BC3", "dp": "#8C8C8C",
    "ep": "#64B5CD", "cp": "#CCB974",
}


def timeline_rows(ranks: pd.DataFrame) -> tuple[np.ndarray, list[str], str]:
    """Map each rank to a row: one row per rank up to 64 ranks, else one per (replica, stage).

    Returns (row of each rank, row labels, what a row is)."""
    n = len(ranks)
    dtype = ranks["device_type"].astype(str).to_numpy()
    if n <= MAX_RANK_ROWS:
        labels = [f"r{r} R{p} s{s} {t}" for r, p, s, t in zip(
            ranks["rank"], ranks["replica"], ranks["stage"], dtype, strict=True)]
        return np.arange(n), labels, "rank"
    key = ranks[["replica", "stage"]].to_numpy(dtype=np.int64)
    uniq, row = np.unique(key, axis=0, return_inverse=True)
    row = row.reshape(-1)
    count = np.bincount(row)
    labels = []
    for i, (rp, st) in enumerate(uniq.tolist()):
        t = ",".join(sorted(set(dtype[row == i])))
        name = f"R{rp} s{st}" if rp >= 0 else "no stage"
        labels.append(f"{name} {t} x{count[i]}")
    return row, labels, "(replica, stage): union over its ranks"


def _rects(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, y0: float, y1: float) -> np.ndarray:
    """Vertices (n, 4, 2) of rectangles [lo, hi] x [row + y0, row + y1], times in ms."""
    lo = lo / 1e6
    hi = hi / 1e6
    return np.stack([
        np.stack([lo, row + y0], axis=1), np.stack([lo, row + y1], axis=1),
        np.stack([hi, row + y1], axis=1), np.stack([hi, row + y0], axis=1),
    ], axis=1)


def plot_timeline(path: str | Path, tf: pd.DataFrame, ranks: pd.DataFrame,
                  title: str = "") -> Path:
    """Draw the timeline (compute in the upper half of each row, communication below) to PNG."""
    row_of_rank, labels, what = timeline_rows(ranks)
    nrows = len(labels)
    fig_h = min(2.0 + 0.28 * nrows, 24.0)
    fig = Figure(figsize=(14, fig_h), dpi=100)
    ax = fig.subplots()
    comp = tf[(tf["kind"] == KIND_COMPUTE) & (tf["rank"] >= 0)]
    fl = tf[tf["kind"] == KIND_FLOW]
    f_rank = np.concatenate([fl["rank"].to_numpy(dtype=np.int64),
                             fl["dst"].to_numpy(dtype=np.int64)])
    f_s = np.concatenate([fl["start_ns"].to_numpy()] * 2)
    f_e = np.concatenate([fl["end_ns"].to_numpy()] * 2)
    f_ph = np.concatenate([fl["phase"].to_numpy(dtype=np.int64)] * 2)
    c_rank = comp["rank"].to_numpy(dtype=np.int64)
    c_ph = comp["phase"].to_numpy(dtype=np.int64)
    handles = []
    for phase in (*COMPUTE_PHASES, *COMM_PHASES):
        if phase in COMPUTE_PHASES:
            m = c_ph == PHASE_INDEX[phase]
            key, s, e, y0, y1 = (row_of_rank[c_rank[m]], comp["start_ns"].to_numpy()[m],
                                 comp["end_ns"].to_numpy()[m], 0.08, 0.55)
        else:
            m = f_ph == PHASE_INDEX[phase]
            key, s, e, y0, y1 = row_of_rank[f_rank[m]], f_s[m], f_e[m], 0.60, 0.92
        if phase in COMPUTE_PHASES and what == "rank" and len(comp) <= 150 * nrows:
            # One box per op with thin white edges, so micro-batches stay distinguishable;
            # with more ops per row the edges would wash the colors out, so merge instead.
            k, lo, hi, edge = key, s, e, "white"
        else:
            k, lo, hi = union_blocks(key, s, e)
            edge = "none"
        if len(k) == 0:
            continue
        verts = _rects(k, lo, hi, y0, y1)  # (n, 4, 2) array: taken as is, no per-box list
        ax.add_collection(PolyCollection(verts, linewidths=0.3,  # type: ignore[arg-type]
                                         facecolors=PHASE_COLORS[phase], edgecolors=edge))
        handles.append(Patch(color=PHASE_COLORS[phase], label=phase))
    end_ms = float(tf["end_ns"].max()) / 1e6 if len(tf) else 1.0
    ax.set_xlim(0, max(end_ms, 1e-9) * 1.01)
    ax.set_ylim(nrows, 0)
    step = max(1, int(np.ceil(nrows / 64)))
    ax.set_yticks(np.arange(0, nrows, step) + 0.5)
    ax.set_yticklabels(labels[::step], fontsize=7 if nrows > 24 else 8)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(f"row = {what}")
    ax.set_title(title or "timeline", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                  title="compute (top) / comm (bottom)", title_fontsize=8)
    fig.tight_layout()
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))


COMPARE_METRICS = (
    ("iteration_time_ns", "iteration time (ms)", 1e-6),
    ("tokens_per_s", "tokens/s", 1.0),
    ("mfu", "MFU", 1.0),
    ("means.compute_ns", "mean compute (ms)", 1e-6),
    ("means.comm_ns", "mean comm (ms)", 1e-6),
    ("means.exposed_comm_ns", "mean exposed comm (ms)", 1e-6),
    ("means.bubble_ns", "mean bubble (ms)", 1e-6),
    ("means.straggler_wait_ns", "mean straggler wait (ms)", 1e-6),
    ("means.idle_ns", "mean idle (ms)", 1e-6),
)


def _get(summary: dict[str, Any], key: str) -> float:
    v: Any = summary
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return float(v) if v is not None else float("nan")


def plot_compare(path: str | Path, summaries: dict[str, dict[str, Any]], title: str = "") -> Path:
    """One small bar chart per headline metric, one bar per backend, to PNG."""
    names = list(summaries)
    ncol = 3
    nrow = int(np.ceil(len(COMPARE_METRICS) / ncol))
    fig = Figure(figsize=(12, 2.6 * nrow), dpi=100)
    axes = np.atleast_1d(fig.subplots(nrow, ncol))
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label, scale) in zip(axes.ravel(), COMPARE_METRICS, strict=False):
        vals = [_get(summaries[b], key) * scale for b in names]
        ax.bar(range(len(names)), vals, color=[colors[i % len(colors)] for i in range(len(names))])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_title(label, fontsize=9)
        for i, v in enumerate(vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.4g}", (i, v), ha="center", va="bottom", fontsize=7)
    for ax in axes.ravel()[len(COMPARE_METRICS):]:
        ax.set_visible(False)
    fig.suptitle(title or "backend comparison", fontsize=10)
    fig.tight_layout()
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
