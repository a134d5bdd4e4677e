"""What a search writes: the candidates table, the best plans, the Pareto plot, the summary.

Files in OUT (each written atomically; the directory follows docs/outputs.md):
``candidates.parquet`` / ``candidates.csv`` (one row per candidate of the space), ``best.yaml``,
``top/NN.yaml`` (the k best, ready for ``xsim run``), ``pareto.png`` (throughput against cost of
the simulated candidates), ``summary.json`` (space size, evaluations, prune counts by reason,
the best plan, speed-ups over homogeneous subsets) and the rows file ``search.rows.jsonl``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from .._atomic import write_atomic, write_text_atomic
from .bnb import Entry, Searcher, entry_types

SEARCH_FILES = ("candidates.parquet", "candidates.csv", "best.yaml", "pareto.png",
                "summary.json")


def candidates_frame(s: Searcher, entries: list[Entry], statuses: dict[int, str]
                     ) -> pd.DataFrame:
    """One row per candidate: key choices, status (why pruned), bound, results, cost.

    What depends only on a candidate's structure or choice is computed once per structure or
    choice (a space of 150,000 candidates has a few thousand structures)."""
    from .space import candidate_key, structure_label

    by_parts: dict[int, tuple[Any, ...]] = {}
    labels: dict[int, str] = {}
    cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    for e in entries:
        c, ch = e.cand, e.cand.choice
        shared = by_parts.get(id(c.parts))
        if shared is None:
            shared = by_parts[id(c.parts)] = (
                structure_label(c.parts), ",".join(sorted(entry_types(s.spec, e))),
                sum(p.count for p in c.parts), max(p.depth for p in c.parts),
                any(len(p.groups) > 1 for p in c.parts), c.num_gpus, s.price_per_s(c))
        replicas, types, dp, max_pp, mixed, gpus, rate = shared
        label = labels.get(id(ch))
        if label is None:
            label = labels[id(ch)] = ch.label
        row = e.row if e.row is not None and e.row.get("error") == "" else None
        it = float(row["iteration_time_ns"]) if row else math.nan
        tok_s = float(row["tokens_per_s"]) if row else math.nan
        values = (
            e.index, candidate_key(label, c.resharding, replicas),
            statuses.get(e.index, e.status or "pruned:bound"), ch.global_batch, ch.micro_batch,
            ch.schedule, ch.recompute, ch.virtual_stages, ch.zero_stage, ch.sequence_parallel,
            ch.layer_split, ch.order, c.resharding, replicas, types, dp, max_pp, mixed, gpus,
            e.lb_ns,
            "full" if e.full else "pipeline" if math.isfinite(e.lb_ns) else "none",
            e.headroom_GB, it, tok_s, float(row["mfu"]) if row else math.nan,
            e.lb_ns / it if row else math.nan,
            rate * 1e6 / tok_s if row and rate > 0 else math.nan,
            (e.row or {}).get("error", ""))
        for k, v in zip(_COLUMNS, values, strict=True):
            cols[k].append(v)
    return pd.DataFrame(cols)


_COLUMNS = ("candidate", "key", "status", "global_batch", "micro_batch", "schedule", "recompute",
            "virtual_stages", "zero_stage", "sequence_parallel", "layer_split", "order",
            "resharding", "replicas", "device_types", "dp", "max_pp", "mixed", "gpus",
            "lower_bound_ns", "bound", "memory_headroom_GB", "iteration_time_ns", "tokens_per_s",
            "mfu", "bound_over_time", "cost_per_million_tokens", "error")


def plan_yaml(plan: dict[str, Any], comment: str) -> str:
    """A plan dict as YAML text (block style, keys in plan order) with a leading comment."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + yaml.safe_dump(plan, sort_keys=False, default_flow_style=None, width=100)


def pareto_front(cost: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both lower cost and higher rate."""
    order = np.lexsort((-rate, cost))
    front, best = [], -np.inf
    for i in order:
        if rate[i] > best:
            front.append(i)
            best = rate[i]
    return np.asarray(front, dtype=np.int64)


def write_pareto(path: Path, frame: pd.DataFrame, priced: bool,
                 summary: dict[str, Any] | None = None) -> None:
    """Throughput (tokens/s) against cost ($ per million tokens, or GPU-hours per million
    tokens without prices) of the simulated candidates, the Pareto front joined; with the
    search's ``summary``, its best and each homogeneous baseline's best (``summary.json``'s
    ``search`` and ``homogeneous``) marked and labelled."""
    from matplotlib.figure import Figure

    ok = frame[frame["status"] == "evaluated"]
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    if priced:
        cost = ok["cost_per_million_tokens"].to_numpy(float)
        ax.set_xlabel("cost ($ per million tokens)")
    else:
        cost = (ok["gpus"] / ok["tokens_per_s"] * 1e6 / 3600).to_numpy(float)
        ax.set_xlabel("GPU-hours per million tokens")
    rate = ok["tokens_per_s"].to_numpy(float)
    for mixed, marker in ((False, "o"), (True, "^")):
        sel = ok["mixed"].to_numpy(bool) == mixed
        ax.scatter(cost[sel], rate[sel], s=14, marker=marker, alpha=0.6,
                   label="mixed-type replicas" if mixed else "pure replicas")
    if len(ok):
        f = pareto_front(cost, rate)
        f = f[np.argsort(cost[f])]
        ax.plot(cost[f], rate[f], "k-", lw=1, label="Pareto front")
    for label, key, marker in pareto_marks(summary or {}):
        at = np.flatnonzero(ok["key"].to_numpy() == key)
        if len(at):
            i = int(at[0])
            ax.scatter([cost[i]], [rate[i]], s=90, marker=marker, facecolors="none",
                       edgecolors="black", linewidths=1.2, zorder=3, label=label)
            ax.annotate(label, (cost[i], rate[i]), xytext=(6, -10), textcoords="offset points",
                        fontsize=7, gid="baseline")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("xsim search: simulated candidates")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))


def pareto_marks(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, candidate key, marker) of the search's best and of each homogeneous baseline's
    best (at the search's batch, and at its own best batch when that is another one)."""
    marks = []
    best = (summary.get("search") or {}).get("best")
    if best:
        marks.append(("best (search)", best, "*"))
    for t, o in sorted((summary.get("homogeneous") or {}).items()):
        same = (o.get("same_batch") or {}).get("best")
        own = (o.get("own_batch") or {}).get("best")
        if same:
            marks.append((f"baseline: {t} only", same, "s"))
        if own and own != same:
            marks.append((f"baseline: {t} only, own batch", own, "D"))
    return marks


def write_outputs(out: Path, s: Searcher, entries: list[Entry], statuses: dict[int, str],
                  summary: dict[str, Any], top: list[Entry]) -> pd.DataFrame:
    """Every search file into ``out`` (an existing directory the caller holds). The names are
    added to OUT's stamp first: a search killed while writing them leaves nothing that blocks
    the next run into OUT."""
    from .._outdir import claim_files
    from .space import plan_dict

    tops = [f"top/{k:02d}.yaml" for k in range(1, len(top) + 1)]
    claim_files(out, ["candidates.csv", "candidates.parquet", "pareto.png", "summary.json",
                      *(["best.yaml"] if top else []), *tops])
    frame = candidates_frame(s, entries, statuses)
    write_atomic(out / "candidates.csv", lambda tmp: frame.to_csv(tmp, index=False))
    write_atomic(out / "candidates.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
    (out / "top").mkdir(exist_ok=True)
    for k, e in enumerate(top, 1):
        it = float(e.row["iteration_time_ns"]) if e.row else math.nan
        note = (f"xsim search {s.spec.name}: rank {k} of the simulated candidates\n"
                f"{e.cand.key}\niteration {it / 1e6:.3f} ms on flow (lower bound "
                f"{e.lb_ns / 1e6:.3f} ms)")
        text = plan_yaml(plan_dict(s.spec, e.cand, f"{s.spec.name}-top{k}"), note)
        write_text_atomic(out / "top" / f"{k:02d}.yaml", text)
        if k == 1:
            write_text_atomic(out / "best.yaml", text.replace(f"{s.spec.name}-top1",
                                                              f"{s.spec.name}-best"))
    write_pareto(out / "pareto.png", frame, bool(s.spec.prices_per_gpu_hour), summary)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return frame
