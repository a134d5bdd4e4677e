"""Running a whole search: the main pass, the homogeneous baselines, confirmation, outputs.

Reference: ``docs/search.md``.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .._argcheck import PATH_TYPES, check_arg
from ..sweep.runner import Executor, LocalExecutor, make_executor
from .bnb import (
    STATUS_BUDGET,
    Entry,
    Outcome,
    Progress,
    Searcher,
    entry_types,
    enumerate_space,
    outcome_summary,
    prune_counts,
)
from .bound import Analyzer
from .budget import Deadline
from .evaluate import Evaluator, KeptPoolExecutor
from .space import plan_dict
from .spec import SearchSpec, load_search_spec


@dataclass
class SearchResult:
    """What a search found. ``summary`` is what ``summary.json`` holds."""

    spec: SearchSpec
    entries: list[Entry]
    outcome: Outcome
    baselines: dict[str, dict[str, Outcome]]
    summary: dict[str, Any]
    top: list[Entry]
    frame: pd.DataFrame | None = None
    statuses: dict[int, str] = field(default_factory=dict)

    @property
    def best(self) -> Entry | None:
        return self.outcome.best


def _speedup(best: Entry | None, base: Outcome) -> float | None:
    if best is None or best.row is None or base.best is None or base.best.row is None:
        return None
    return float(best.row["tokens_per_s"]) / float(base.best.row["tokens_per_s"])


def search(spec: SearchSpec | str | os.PathLike[str], executor: Executor | str | None = None,
           *, jobs: int = 1, ray_address: str | None = None,
           evaluator: Evaluator | None = None, exhaustive: bool = False,
           baselines: bool = True, top: int = 5, confirm: str | None = None,
           confirm_options: dict[str, Any] | None = None,
           progress: Progress | None = None, entries: list[Entry] | None = None,
           analyzer: Analyzer | None = None, coarsen: str = "auto",
           started: float | None = None) -> SearchResult:
    """Search ``spec`` (a SearchSpec, or a spec YAML path or text) for the best plan on its
    cluster and return the result (``.best``, ``.summary``; docs/search.md).

    ``executor``: where simulations run, as for sweeps: ``"local"`` (``jobs`` worker
    processes, the default), ``"ray"`` (at ``ray_address``) or an :class:`Executor` object.
    ``exhaustive``: simulate every feasible candidate (no cut by the bound; for checking the
    bound). ``baselines``: also search each single-device-type subset of the cluster at the
    best plan's global batch and at any batch of the spec. ``confirm``: re-run the ``top``
    best on that backend (ns3, htsim). ``entries``: the space as :func:`enumerate_space`
    gave it for this spec with ``analyzer`` (to not enumerate twice). ``coarsen``: how the
    simulations coarsen identical replicas (``auto``, ``on``, ``off``; docs/scale.md).
    ``started``: the :func:`time.monotonic` instant the command started (default: now), from
    which the seconds budget and the reported wall time count (search/budget.py).
    """
    t0 = time.monotonic() if started is None else started
    check_arg("search", "spec", spec, (SearchSpec, *PATH_TYPES),
              "a SearchSpec, a path (str or os.PathLike) of a search spec, or YAML text")
    check_arg("search", "jobs", jobs, int, "a number of simulations at once (int >= 1)")
    if isinstance(executor, str):
        executor = make_executor(executor, jobs, ray_address)
    if not isinstance(spec, SearchSpec):
        spec = load_search_spec(spec)
    deadline = Deadline(spec.budget.seconds, t0)
    an = analyzer or Analyzer(spec)
    if entries is None:
        entries = enumerate_space(spec, an, deadline.enumeration_deadline())
    t_enum = deadline.elapsed()
    kept = None
    if evaluator is None and (executor is None or type(executor) is LocalExecutor):
        # the search simulates in rounds: keep the worker processes between them
        kept = KeptPoolExecutor(executor.jobs if executor is not None else jobs)
        executor = kept
    ev = evaluator or Evaluator(executor, base_dir=spec.base_dir, coarsen=coarsen)
    try:
        return _search(spec, entries, ev, an, deadline, t_enum, exhaustive, baselines, top,
                       confirm, confirm_options, progress)
    finally:
        if kept is not None:
            kept.close()


def _search(spec: SearchSpec, entries: list[Entry], ev: Evaluator, an: Analyzer,
            deadline: Deadline, t_enum: float, exhaustive: bool, baselines: bool, top: int,
            confirm: str | None, confirm_options: dict[str, Any] | None,
            progress: Progress | None) -> SearchResult:
    s = Searcher(spec, entries, ev, progress, an, deadline)
    main = s.run("search", exhaustive=exhaustive)
    statuses = dict(main.statuses)
    summary: dict[str, Any] = {
        "spec": spec.name,
        "objective": spec.objective,
        "space_size": len(entries) + s.not_analysed,
        # phase 1 stopped by the seconds budget: the candidates after these were not analysed
        # (not in candidates.csv; counted as not_reached:budget)
        "analysed": len(entries),
        "feasible": main.considered,
        "evaluated": main.evaluated,
        "prune_counts": prune_counts(entries, main),
        "proven_optimal": main.proven,
        "enumerate_s": round(t_enum, 3),
        "search": outcome_summary(main, spec),
    }
    base: dict[str, dict[str, Outcome]] = {}
    if baselines and main.best is not None:
        gb = main.best.cand.choice.global_batch
        for t in sorted({g.type for g in spec.device_groups}):
            def only(e: Entry, t: str = t) -> bool:
                return entry_types(spec, e) == frozenset({t})

            def at_gb(e: Entry, only: Callable[[Entry], bool] = only) -> bool:
                return only(e) and e.cand.choice.global_batch == gb

            same = s.run(f"{t} at batch {gb}", at_gb)
            own = (same if len(spec.global_batches) == 1
                   else s.run(f"{t} at its best batch", only))
            base[t] = {"same_batch": same, "own_batch": own}
        summary["homogeneous"] = {
            t: {"same_batch": outcome_summary(o["same_batch"], spec),
                "own_batch": outcome_summary(o["own_batch"], spec),
                "speedup_same_batch": _speedup(main.best, o["same_batch"]),
                "speedup_own_batch": _speedup(main.best, o["own_batch"])}
            for t, o in base.items()
        }
        for o in (x for d in base.values() for x in d.values()):
            for k, v in o.statuses.items():
                if v in ("evaluated", "error"):  # simulated by a baseline pass
                    statuses[k] = v
    def rank(e: Entry) -> tuple[float, str]:
        assert e.row is not None
        return s.objective(e.cand, float(e.row["iteration_time_ns"])), e.cand.key

    ranked = sorted((e for e in entries if e.status == "evaluated" and e.row is not None),
                    key=rank)
    top_entries = ranked[:top]
    summary["simulations"] = s.simulations
    counts = Counter(statuses.get(e.index, e.status or "pruned:bound") for e in entries)
    if s.not_analysed:
        counts[STATUS_BUDGET] += s.not_analysed
    summary["status_counts"] = dict(sorted(counts.items()))
    if confirm:
        summary["confirm"] = _confirm(spec, ev, top_entries, confirm, confirm_options or {},
                                      deadline)
    summary["wall_s"] = round(deadline.elapsed(), 3)  # from the command's start
    return SearchResult(spec, entries, main, base, summary, top_entries, statuses=statuses)


def _confirm(spec: SearchSpec, ev: Evaluator, top: list[Entry], backend: str,
             options: dict[str, Any], deadline: Deadline) -> list[dict[str, Any]]:
    """Re-run ``top`` on a packet backend; one record per plan with both times. Within the
    seconds budget: none once it is spent, and runs still going at its end are stopped."""
    from ..backends.registry import check_backend_options, get_backend

    get_backend(backend, options)
    check_backend_options(backend, options)
    packet = Evaluator(ev.executor, backend=backend, options=options, base_dir=ev.base_dir,
                       rows_log=ev.rows_log, done=ev.cache)
    rows = ([None] * len(top) if deadline.passed() else
            packet.evaluate([plan_dict(spec, e.cand) for e in top], [e.cand.key for e in top],
                            deadline.at))
    out = []
    for e, got in zip(top, rows, strict=True):
        row = got or {"error": "not run: the seconds budget ran out first"}
        flow = float(e.row["iteration_time_ns"]) if e.row is not None else math.nan
        it = row.get("iteration_time_ns")
        out.append({"candidate": e.index, "key": e.cand.key, "flow_iteration_time_ns": flow,
                    f"{backend}_iteration_time_ns": it, "error": row.get("error", ""),
                    "ratio": (float(it) / flow) if it and row.get("error") == "" else None})
    return out


def write_result(result: SearchResult, out: Path) -> pd.DataFrame:
    """Write every output file of ``result`` into the directory ``out`` (which exists)."""
    from .outputs import write_outputs

    s = Searcher(result.spec, result.entries, Evaluator())
    frame = write_outputs(out, s, result.entries, result.statuses, result.summary, result.top)
    result.frame = frame
    return frame
