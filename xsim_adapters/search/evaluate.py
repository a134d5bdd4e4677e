"""Simulating candidates: tasks for the sweep executors, a result cache, the rows file.

A candidate runs as a sweep variant does (validate the plan, generate, replay), on the local
process pool (kept between the search's rounds: :class:`KeptPoolExecutor`) or on Ray, and is
measured by :func:`lean_row` (iteration time, tokens/s, MFU: what the search ranks and
reports, without the per-rank metrics ``xsim run`` computes). Each finished row is appended to
``OUT/search.rows.jsonl`` under the digest of its task (plan, backend, options), so a killed
search resumed with ``--resume`` re-runs nothing it already simulated; since the branch and
bound is deterministic, the resumed search takes the same decisions.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from types import TracebackType
from typing import Any

import numpy as np

from ..metrics.coarse import rank_sources
from ..sweep.results import RowLog, variant_digest
from ..sweep.runner import (
    DeadlineReached,
    Executor,
    LocalExecutor,
    OnResult,
    Task,
    _worker_init,
    guarded,
    kill_pool,
    run_batch,
)
from ..trace.schema import KIND_COMPUTE, Trace
from ..trace.timeline import Timeline

ROWS_FILE = "search.rows.jsonl"
Row = dict[str, Any]


def lean_row(trace: Trace, timeline: Timeline) -> Row:
    """The numbers the search ranks and reports, from a replay (no per-rank metrics, which
    cost more than the replay on large plans): iteration time (the latest op end), tokens/s,
    MFU (all GPUs and per device type: every rank's compute FLOPs, a mirrored rank of a
    coarsened trace counting its representative's, over the iteration time and the peak),
    as :func:`..metrics.summary.summary` defines them."""
    ops = trace.ops
    end = np.rint(timeline.frame["end_ns"].to_numpy(dtype=np.float64)).astype(np.int64)
    it = int(end.max()) if len(end) else 0  # in whole ns, as the metrics' timeline frame
    manifest = trace.manifest
    tokens = (manifest.get("workload") or {}).get("tokens_per_iteration")
    n = trace.num_ranks
    comp = (ops["kind"] == KIND_COMPUTE).to_numpy()
    flops = np.bincount(ops["rank"].to_numpy()[comp], minlength=n,
                        weights=ops["flops"].to_numpy(dtype=np.float64)[comp])[:n]
    flops = flops[rank_sources(trace)]
    types = [r["device_type"] for r in manifest["ranks"]]
    catalog = manifest.get("device_types") or {}
    row: Row = {"plan": manifest.get("plan_name"), "ranks": n, "num_ops": int(len(ops)),
                "iteration_time_ns": it,
                "tokens_per_s": float(tokens) / (it * 1e-9) if tokens and it > 0 else None,
                "coarsened": bool((manifest.get("coarsening") or {}).get("used"))}
    peak_total = 0.0
    for name in sorted(set(types)):
        sel = np.array([t == name for t in types])
        peak = float((catalog.get(name) or {}).get("peak_tflops", 0.0))
        peak_total += peak * int(sel.sum())
        ach = flops[sel].sum() / (it * 1e-9) / 1e12 / int(sel.sum()) if it > 0 else 0.0
        row[f"mfu_{name}"] = ach / peak if peak > 0 else None
    row["mfu"] = (float(flops.sum()) / (it * 1e-9) / 1e12 / peak_total
                  if it > 0 and peak_total > 0 else None)
    return row


def run_candidate(task: Task) -> Row:
    """Validate, generate (``task['coarsen']``, default ``auto``), replay and measure one
    candidate plan with :func:`lean_row`; like :func:`..sweep.runner.run_variant`, never raises
    for a plan or backend error (the row's ``error`` says what went wrong)."""

    def body() -> Row:
        from .. import api
        from ..feasibility import plan_from_dict

        plan = plan_from_dict(task["plan"], base_dir=task.get("base_dir"))
        trace = api.generate(plan, coarsen=task.get("coarsen", "auto"))
        timeline = api.run(trace, task.get("backend", "flow"), api.build_topology(plan),
                           task.get("options") or {})
        timeline.check_complete(trace)
        return lean_row(trace, timeline)

    return guarded(body)


def _picklable(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` can be sent to a worker process (a module-level function)."""
    try:
        pickle.dumps(fn)
    except Exception:  # a closure or lambda (tests' fake simulators): it runs here
        return False
    return True


class KeptPoolExecutor(LocalExecutor):
    """:class:`..sweep.runner.LocalExecutor` whose worker processes live from one ``map`` to
    the next: the search simulates in rounds, and a spawned worker's start-up (importing numpy,
    pandas and xsim, 1-2 s of CPU) is then paid once per search, not once per round. The same
    contract otherwise: spawned workers that die with the parent, rows in task order, a
    worker that dies is replaced and the tasks it may have taken are re-run one per fresh
    worker (the base class's isolation), Ctrl-C kills the workers. Close it (or use it as a
    context manager) to stop the workers."""

    def __init__(self, jobs: int = 1) -> None:
        super().__init__(jobs)
        self._pool: ProcessPoolExecutor | None = None
        self._broken = False  # a worker died in this map: isolate the rest (fresh pools)
        # a time.monotonic() instant (the search's seconds budget): simulations still running
        # then are killed; with one, even a single job runs in a worker, so it can be stopped
        self.stop_at = math.inf
        self._stoppable = False

    def map(self, fn: Callable[[Task], Row], tasks: Sequence[Task],
            progress: Any = None, on_result: OnResult | None = None) -> list[Row]:
        """The rows of ``tasks`` in order; with ``stop_at`` reached, only those finished by
        then (each given to ``on_result`` as it finished; the others were killed)."""
        self._broken = False
        # a deadline stops only simulations in a worker process (fn must pickle to get there)
        self._stoppable = self.stop_at != math.inf and _picklable(fn)
        rows: dict[int, Row] = {}

        def keep(i: int, row: Row) -> None:
            rows[i] = row
            if on_result:
                on_result(i, row)

        try:
            super().map(fn, tasks, progress, keep)
        except DeadlineReached:
            pass  # (the pool was killed in _pool_run)
        return [rows[i] for i in sorted(rows)]

    def _in_process(self, n_tasks: int) -> bool:
        return not self._stoppable and super()._in_process(n_tasks)

    def _pool_run(self, fn: Callable[[Task], Row], tasks: Sequence[Task],  # type: ignore[override]
                  batch: list[int], workers: int, done: OnResult) -> BaseException | None:
        if self._broken:  # isolation after a crash: the base class's one fresh pool per task
            return LocalExecutor._pool_run(fn, tasks, batch, workers, done)
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx,
                                             initializer=_worker_init,
                                             initargs=(os.getpid(),))
        try:
            broken = run_batch(self._pool, fn, tasks, batch, done,
                               self.stop_at if self._stoppable else math.inf)
        except BaseException:
            self._drop(kill=True)
            raise
        if broken is not None:  # that pool is unusable: a new one next time
            self._drop(kill=False)
            self._broken = True
        return broken

    def _drop(self, kill: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:
            kill_pool(pool)
        else:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers."""
        self._drop(kill=False)

    def __enter__(self) -> KeptPoolExecutor:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._drop(kill=et is not None)


class Evaluator:
    """Runs plan tasks on an executor, caching rows by task digest (and logging them)."""

    def __init__(self, executor: Executor | None = None, backend: str = "flow",
                 options: Mapping[str, Any] | None = None, base_dir: str | None = None,
                 rows_log: RowLog | None = None, done: Mapping[str, Row] | None = None,
                 run: Callable[[dict[str, Any]], Row] = run_candidate,
                 coarsen: str = "auto") -> None:
        self.executor = executor or LocalExecutor(1)
        self.backend = backend
        self.options = dict(options or {})
        self.base_dir = base_dir
        self.rows_log = rows_log
        self.cache: dict[str, Row] = dict(done or {})
        self.run = run
        self.coarsen = coarsen
        self.simulated = 0  # simulations actually run by this process (not from the cache)
        self.resumed = set(self.cache)  # digests whose row was read back, not simulated here
        self.distrusted: list[str] = []  # why resumed rows were simulated again (see below)

    def task(self, plan: dict[str, Any]) -> dict[str, Any]:
        t = {"plan": plan, "base_dir": self.base_dir, "backend": self.backend,
             "options": self.options}
        if self.coarsen != "auto":  # (auto stays out: the digests of earlier rows hold)
            t["coarsen"] = self.coarsen
        return t

    def distrust(self, plan: dict[str, Any], why: str) -> bool:
        """Drop the resumed row of ``plan`` from the cache (``why`` is kept), so the next
        :meth:`evaluate` simulates it; False (nothing done) if its row was simulated here."""
        d = variant_digest(self.task(plan))
        if d not in self.resumed:
            return False
        self.resumed.discard(d)
        self.cache.pop(d, None)
        self.distrusted.append(why)
        return True

    def evaluate(self, plans: Sequence[dict[str, Any]], labels: Sequence[str],
                 stop_at: float = math.inf) -> list[Row | None]:
        """Rows of ``plans`` in order: cached ones at once, the others simulated together.
        ``stop_at``: a :func:`time.monotonic` instant at which simulations still running on a
        :class:`KeptPoolExecutor` are killed; their rows are None (other executors finish)."""
        tasks = [self.task(p) for p in plans]
        digests = [variant_digest(t) for t in tasks]
        todo = [k for k, d in enumerate(digests) if d not in self.cache]

        finished = [0]

        def saved(i: int, row: Row) -> None:
            k = todo[i]
            finished[0] += 1
            self.cache[digests[k]] = row
            if self.rows_log is not None:
                self.rows_log.append(digests[k], k, {"candidate": labels[k]}, row)

        if todo:
            sub = [tasks[k] for k in todo]
            if isinstance(self.executor, KeptPoolExecutor):
                self.executor.stop_at = stop_at
            try:
                if "on_result" in inspect.signature(self.executor.map).parameters:
                    self.executor.map(self.run, sub, None,
                                      on_result=saved)  # type: ignore[call-arg]
                else:
                    for i, row in enumerate(self.executor.map(self.run, sub, None)):
                        saved(i, row)
            finally:
                if isinstance(self.executor, KeptPoolExecutor):
                    self.executor.stop_at = math.inf
            self.simulated += finished[0]
        return [self.cache.get(d) for d in digests]
