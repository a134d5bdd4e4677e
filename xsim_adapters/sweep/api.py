"""The sweep API: a SweepSpec from a plan and axes, and running it (locally or on Ray).

Reference: ``docs/sweep.md``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from .expand import Variant, expand
from .results import RowLog, build_frame, variant_digest
from .runner import Executor, LocalExecutor, make_executor, run_variant
from .spec import SweepError, SweepSpec, check_axis_paths, read_plan_data

if TYPE_CHECKING:
    from ..plan.model import Plan
    from .runner import Progress, Row


def spec_for(plan_or_path: Plan | Mapping[str, Any] | str | os.PathLike[str],
             axes: Mapping[str, Any], backend: str = "flow",
             options: Mapping[str, Any] | None = None) -> SweepSpec:
    """A SweepSpec from a Plan (its explicit ``plan_to_dict`` form), a plan dict, a plan YAML
    path or YAML text."""
    from ..plan import Plan, parse_yaml, plan_to_dict

    base_dir: str | None = None
    base_path: str | None = None
    if isinstance(plan_or_path, Plan):
        base, source = plan_to_dict(plan_or_path), plan_or_path.name
    elif isinstance(plan_or_path, Mapping):
        base, source = dict(plan_or_path), "<plan dict>"
    elif isinstance(plan_or_path, os.PathLike) or "\n" not in str(plan_or_path):
        base, base_dir, source = read_plan_data(Path(plan_or_path))
        base_path = str(Path(plan_or_path).resolve())
    else:
        data = parse_yaml(str(plan_or_path))
        if not isinstance(data, Mapping):
            raise SweepError("the plan text is not a mapping")
        base, source = dict(data), "<plan text>"
    return SweepSpec(base=base, axes=dict(axes), backend=backend, options=dict(options or {}),
                     base_dir=base_dir, source=source, base_path=base_path)


def task_for(spec: SweepSpec, plan: dict[str, Any] | None) -> dict[str, Any]:
    """One variant's task (plain data, see :func:`.runner.run_variant`); with other jobs,
    their data and the placement too."""
    task: dict[str, Any] = {"plan": plan, "base_dir": spec.base_dir, "backend": spec.backend,
                            "options": spec.options}
    if spec.jobs:
        task["jobs"] = [{"data": j["data"], "base_dir": j["base_dir"]} for j in spec.jobs]
        task["placement"] = spec.placement
    return task


def run_spec(spec: SweepSpec, executor: Executor | None = None,
             progress: Progress | None = None, rows_log: RowLog | None = None,
             done: Mapping[str, dict[str, Any]] | None = None,
             ) -> tuple[list[Variant], pd.DataFrame]:
    """Expand ``spec`` and run every variant that could be built; (variants, result frame).

    The backend and its options are checked once before any work (an unknown or unavailable
    backend, an unknown option or a bad value fails the whole sweep); a variant whose
    overrides or plan fail, or which crashes, records its error in its row. ``rows_log`` gets
    each row as soon as its variant finishes; ``done`` (digest -> row, from an earlier run's
    rows file) supplies the rows of variants not run again.
    """
    from ..backends.registry import check_backend_options, get_backend

    get_backend(spec.backend, spec.options)
    check_backend_options(spec.backend, spec.options)
    check_axis_paths(spec.axes)  # a typo in a path fails the sweep, not every variant
    executor = executor or LocalExecutor(1)
    done = done or {}
    variants = expand(spec.base, spec.axes, spec.base_dir)
    runnable = [v for v in variants if v.plan is not None]
    tasks = [task_for(spec, v.plan) for v in runnable]
    digests = [variant_digest(t) for t in tasks]
    todo = [k for k, d in enumerate(digests) if d not in done]
    if progress:  # the failed overrides and the resumed variants are done already
        progress(len(variants) - len(todo))

    def saved(i: int, row: Row) -> None:
        k = todo[i]
        if rows_log is not None:
            rows_log.append(digests[k], runnable[k].index, runnable[k].overrides, row)

    todo_tasks = [tasks[k] for k in todo]
    if rows_log is not None and "on_result" in inspect.signature(executor.map).parameters:
        new = executor.map(run_variant, todo_tasks, progress,
                           on_result=saved)  # type: ignore[call-arg]  # checked just above
    else:  # an executor without on_result: rows are saved when it returns
        new = executor.map(run_variant, todo_tasks, progress)
        for i, row in enumerate(new):
            saved(i, row)
    by_task = dict(zip(todo, new, strict=True))
    results = iter([by_task[k] if k in by_task else dict(done[digests[k]])
                    for k in range(len(tasks))])
    rows = [next(results) if v.plan is not None else {"error": v.error, "wall_s": 0.0, "cpu_s": 0.0}
            for v in variants]
    return variants, build_frame(variants, rows)


def sweep(plan_or_path: Plan | Mapping[str, Any] | str | os.PathLike[str],
          axes: Mapping[str, Any], backend: str = "flow", jobs: int = 1,
          executor: str | Executor = "local", options: Mapping[str, Any] | None = None,
          ray_address: str | None = None) -> pd.DataFrame:
    """Run every combination of ``axes`` ({yaml path: [values]}) over the plan on ``backend``.

    Returns one row per variant in product order (the first axis varies slowest): ``variant``,
    one column per axis path, ``error`` ("" if it ran), iteration_time_ns, tokens_per_s, mfu,
    ``mfu_<type>``, ``mean_*_ns`` (per rank), bubble_fraction, ``phase_<p>_ns`` (rank-ns) and
    wall_s and cpu_s (seconds; the only columns that depend on ``jobs`` or ``executor``,
    listed in ``TIMING_COLUMNS``).
    ``executor``: ``"local"`` (``jobs`` processes), ``"ray"`` (needs ``ray``) or an object
    with the :class:`Executor` ``map`` method.
    """
    spec = spec_for(plan_or_path, axes, backend, options)
    ex = make_executor(executor, jobs, ray_address) if isinstance(executor, str) else executor
    return run_spec(spec, ex)[1]
