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
from matplotlib.ticker import FuncFormatter

from .._atomic import write_atomic
from .._units import axis_unit, fmt_ns
from ..metrics.intervals import union_blocks
from ..trace.schema import COMM_PHASES, COMPUTE_PHASES, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX

MAX_RANK_ROWS = 64
#: What a row of the timeline is, per :func:`timeline_rows` kind (the y-axis label).
ROW_HELP = {
    "rank": "one row per GPU: r<rank> R<replica> s<stage> <GPU type>\n"
            "top half: its compute ops; bottom half: flows it sends or receives",
    "(replica, stage): union over its ranks":
        "one row per pipeline stage: R<replica> s<stage> <GPU type> x<GPUs>\n"
        "(union over its GPUs) top half: compute; bottom half: flows",
}
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


BUBBLE_COLOR = "#9ecae1"  # light blue: waiting on the pipeline
STRAGGLER_COLOR = "#fdae6b"  # light orange: waiting on a slower data-parallel peer
CULPRIT_COLOR = "#d62728"


def plot_timeline(path: str | Path, tf: pd.DataFrame, ranks: pd.DataFrame,
                  title: str = "", stragglers: pd.DataFrame | None = None) -> Path:
    """Draw the timeline (compute in the upper half of each row, communication below) to PNG,
    annotated: pipeline bubbles and (given ``stragglers``, the metrics' straggler frame)
    straggler waits shaded behind the ops, and the rank that made others wait longest (the
    largest ``caused_wait_ns``) marked in red."""
    fig = timeline_figure(tf, ranks, title, stragglers)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))


def _shade(ax: Any, row_of_rank: np.ndarray, k: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           color: str, label: str, hatch: str | None = None) -> Patch | None:
    """Shade intervals (rank, lo, hi) over their rows' full height, behind the ops."""
    if len(k) == 0:
        return None
    rk, rlo, rhi = union_blocks(row_of_rank[k], lo, hi)
    coll = PolyCollection(_rects(rk, rlo, rhi, 0.02, 0.98),  # type: ignore[arg-type]
                          facecolors=color, edgecolors="none", alpha=0.6, zorder=0,
                          label=label, hatch=hatch)
    ax.add_collection(coll)
    return Patch(facecolor=color, alpha=0.6, label=label, hatch=hatch)


def timeline_figure(tf: pd.DataFrame, ranks: pd.DataFrame, title: str = "",
                    stragglers: pd.DataFrame | None = None) -> Figure:
    """The annotated timeline as a matplotlib Figure (see :func:`plot_timeline`)."""
    from ..metrics.ranks import bubble_intervals, straggler_intervals

    row_of_rank, labels, what = timeline_rows(ranks)
    nrows = len(labels)
    fig_h = min(2.0 + 0.28 * nrows, 24.0)
    fig = Figure(figsize=(14, fig_h), dpi=100)
    ax = fig.subplots()
    shades = [_shade(ax, row_of_rank, *bubble_intervals(tf, len(ranks), stragglers), BUBBLE_COLOR,
                     "pipeline bubble")]
    if stragglers is not None:
        shades.append(_shade(ax, row_of_rank, *straggler_intervals(stragglers, tf),
                             STRAGGLER_COLOR, "straggler wait", hatch="//"))
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
    end_ns = float(tf["end_ns"].max()) if len(tf) else 1e6
    scale, unit = axis_unit(end_ns)  # the unit the terminal prints the iteration in
    ax.set_xlim(0, max(end_ns, 1.0) / 1e6 * 1.01)  # data in ms; ticks in the chosen unit
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x * 1e6 / scale:g}"))
    ax.set_ylim(nrows, 0)
    step = max(1, int(np.ceil(nrows / 64)))
    ax.set_yticks(np.arange(0, nrows, step) + 0.5)
    ticks = ax.set_yticklabels(labels[::step], fontsize=7 if nrows > 24 else 8)
    ax.set_xlabel(f"time ({unit}); iteration {fmt_ns(end_ns)}")
    ax.set_ylabel(ROW_HELP[what] if what in ROW_HELP else f"row = {what}", fontsize=8)
    ax.set_title(title or "timeline", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    caused = ranks["caused_wait_ns"].to_numpy(dtype=np.float64) if "caused_wait_ns" in ranks \
        else np.zeros(0)
    if len(caused) and caused.max() > 0:
        worst = int(np.argmax(caused))
        row = int(row_of_rank[worst])
        if row % step == 0:
            ticks[row // step].set_color(CULPRIT_COLOR)
            ticks[row // step].set_fontweight("bold")
        rank = int(ranks["rank"].iloc[worst])
        # above the plot's top right corner, clear of the title and the legend
        ax.text(1.0, 1.01, f"culprit: rank {rank} made others wait {fmt_ns(caused[worst])}"
                " (red row)", transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
                color=CULPRIT_COLOR, fontweight="bold", gid="culprit")
        ax.axhspan(row, row + 1, color=CULPRIT_COLOR, alpha=0.12, zorder=0, gid="culprit-row")
    handles += [h for h in shades if h is not None]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                  title="compute (top) / comm (bottom)", title_fontsize=8)
    fig.tight_layout()
    return fig


#: Least half-width of the comparison picture's axis, in %: differences below it stay short.
MIN_SPAN_PCT = 1.0

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


def relative_differences(summaries: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Per headline metric (rows, by label) and backend (columns, every backend but the first),
    ``100 * (backend - reference) / |reference|`` in %, the first backend being the reference;
    NaN where the reference is 0 or a value is missing."""
    names = list(summaries)
    ref = names[0]
    out = {}
    for b in names[1:]:
        col = []
        for key, _label, _scale in COMPARE_METRICS:
            a, v = _get(summaries[ref], key), _get(summaries[b], key)
            col.append(100.0 * (v - a) / abs(a) if a != 0 and np.isfinite(a) else float("nan"))
        out[b] = col
    return pd.DataFrame(out, index=pd.Index([m[1] for m in COMPARE_METRICS], name="metric"))


def compare_figure(summaries: dict[str, dict[str, Any]], title: str = "") -> Figure:
    """Relative differences against the first backend, in % (see :func:`plot_compare`)."""
    names = list(summaries)
    rel = relative_differences(summaries)
    others = names[1:]
    nmet = len(rel)
    fig = Figure(figsize=(10, 1.2 + 0.45 * nmet * max(1, len(others))), dpi=100)
    ax = fig.subplots()
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    h = 0.8 / max(1, len(others))
    finite = rel.to_numpy()[np.isfinite(rel.to_numpy())]
    # the axis spans at least +-MIN_SPAN_PCT: a 0.04% difference must look small, not fill it
    span = max(float(np.abs(finite).max()) if len(finite) else 0.0, MIN_SPAN_PCT)
    for j, b in enumerate(others):
        y = np.arange(nmet) + (j - (len(others) - 1) / 2) * h
        vals = rel[b].to_numpy()
        ax.barh(y, np.nan_to_num(vals), height=h, color=colors[(j + 1) % len(colors)],
                label=f"{b} vs {names[0]}")
        for yy, v in zip(y, vals, strict=True):
            text = "n/a (reference is 0)" if not np.isfinite(v) else f"{v:+.3g}%"
            x = 0.0 if not np.isfinite(v) else v
            ax.annotate(text, (x, yy), xytext=(3 if x >= 0 else -3, 0),
                        textcoords="offset points", ha="left" if x >= 0 else "right",
                        va="center", fontsize=7, gid="rel-diff")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlim(-span * 1.35, span * 1.35)
    ax.set_yticks(np.arange(nmet))
    ax.set_yticklabels([m.split(" (")[0] for m in rel.index], fontsize=8)  # no units: in %
    ax.invert_yaxis()
    ax.set_xlabel(f"difference relative to {names[0]} (%): (backend - {names[0]}) / "
                  f"|{names[0]}|; axis at least ±{MIN_SPAN_PCT:g}%, largest "
                  f"{float(np.abs(finite).max()) if len(finite) else 0.0:.3g}%")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "backend comparison", fontsize=10)
    fig.tight_layout()
    return fig


def plot_compare(path: str | Path, summaries: dict[str, dict[str, Any]], title: str = "") -> Path:
    """Relative differences of the headline metrics (iteration time, tokens/s, MFU, mean
    compute, communication, bubble, straggler wait, idle) of every backend against the first
    (the reference), in %, one horizontal bar per metric and backend, to PNG."""
    fig = compare_figure(summaries, title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
