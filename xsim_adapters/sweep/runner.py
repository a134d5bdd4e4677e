"""Running variants: one task -> one result row, in this process, a local process pool or Ray.

A task is plain data (the plan as a dict, the backend name and options), so it pickles the
same way for a spawned worker process and for a Ray worker; results come back as plain dicts
in task order whatever order they finish in, so a sweep's frame does not depend on ``jobs``.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from ..errors import BackendUnavailable, XsimError

Task = dict[str, Any]
Row = dict[str, Any]
Progress = Callable[[int], None]
OnResult = Callable[[int, Row], None]  # (task index, row), called as each task finishes

RAY_HINT = 'pip install "xsim-adapters[ray]"'


def run_variant(task: Task) -> Row:
    """Validate, generate, replay and measure one plan; never raises for a plan or backend
    error: the row's ``error`` says what went wrong (``ExceptionType: message``).

    ``task``: ``plan`` (plain data), ``base_dir`` (for relative profile paths), ``backend``,
    ``options``. Row keys: see :func:`summary_row`, plus ``error``, ``wall_s`` and ``cpu_s``
    (seconds of this variant, wall clock and this process's CPU).
    """

    def body() -> Row:
        from .. import api
        from ..feasibility import plan_from_dict

        plan = plan_from_dict(task["plan"], base_dir=task.get("base_dir"))
        if task.get("jobs"):
            return jobs_row(plan, task)
        trace = api.generate(plan)
        timeline = api.run(trace, task.get("backend", "flow"), api.build_topology(plan),
                           task.get("options") or {})
        met = api.metrics(trace, timeline)
        return summary_row(met.summary, met.ranks)

    return guarded(body)


def guarded(body: Callable[[], Row]) -> Row:
    """``body()``'s row with ``error`` "" (or, if it raised, a row whose ``error`` says what
    went wrong: a plan or backend error, or a crash with where it happened), plus ``wall_s``
    and ``cpu_s`` (wall clock and this process's CPU seconds)."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        row = body()
        row["error"] = ""
    except XsimError as e:  # the plan or the backend said no: record it, keep sweeping
        row = {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # a crash in one variant must not lose the others' results
        where = traceback.extract_tb(e.__traceback__)[-1:]
        at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
        row = {"error": f"crash: {type(e).__name__}: {e}{at}"}
    row["wall_s"] = time.perf_counter() - t0
    row["cpu_s"] = time.process_time() - c0  # wall_s >> cpu_s: the worker waited for a core
    return row


def jobs_row(plan: Any, task: Task) -> Row:
    """The variant ``plan`` beside the task's other jobs on one fabric (docs/whatif.md): its
    own :func:`summary_row` (from the shared run), ``alone_iteration_ns`` and
    ``slowdown_pct``; per other job ``k`` (1, 2, ...): ``job<k>`` (its name) and
    ``job<k>_iteration_time_ns`` / ``job<k>_slowdown_pct`` (training) or
    ``job<k>_achieved_load`` (traffic)."""
    from ..jobs import run_jobs
    from ..traffic import job_from_data

    others = [job_from_data(j["data"], j.get("base_dir")) for j in task["jobs"]]
    res = run_jobs([plan, *others], task.get("backend", "flow"), task.get("options") or {},
                   placement=task.get("placement", "packed"))
    met = res.results[0]
    table = res.table()
    row = summary_row(met.summary, met.ranks)
    row["alone_iteration_ns"] = float(table["alone_iteration_ns"].iloc[0])
    row["slowdown_pct"] = float(table["slowdown_pct"].iloc[0])
    for k in range(1, len(table)):
        t = table.iloc[k]
        row[f"job{k}"] = str(t["job"])
        if isinstance(res.results[k], dict):
            row[f"job{k}_achieved_load"] = float(t["achieved_load"])
        else:
            row[f"job{k}_iteration_time_ns"] = float(t["iteration_time_ns"])
            row[f"job{k}_slowdown_pct"] = float(t["slowdown_pct"])
    return row


def summary_row(summary: dict[str, Any], ranks: Any) -> Row:
    """The flat result columns of one run (times in ns, rates per second).

    ``mean_*_ns`` are means over ranks; ``phase_<p>_ns`` are totals over ranks (rank-ns);
    ``mfu_<type>`` / ``tflops_per_gpu_<type>`` are per device type; ``bubble_fraction`` is the
    mean over ranks of bubble / pipeline window.
    """
    row: Row = {
        "plan": summary.get("plan"),
        "ranks": summary["ranks"],
        "num_ops": summary["num_ops"],
        "iteration_time_ns": summary["iteration_time_ns"],
        "tokens_per_s": _num(summary.get("tokens_per_s")),
        "mfu": _num(summary.get("mfu")),
    }
    for name in sorted(summary.get("device_types", {})):
        d = summary["device_types"][name]
        row[f"mfu_{name}"] = _num(d.get("mfu"))
        row[f"tflops_per_gpu_{name}"] = _num(d.get("achieved_tflops_per_gpu"))
    for key, value in summary["means"].items():
        row[f"mean_{key}"] = float(value)
    row["bubble_fraction"] = (float(ranks["bubble_fraction"].mean())
                              if "bubble_fraction" in ranks and len(ranks) else math.nan)
    for phase, value in summary["phases_rank_ns"].items():
        row[f"phase_{phase}_ns"] = float(value)
    return row


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


class Executor(Protocol):
    """Runs ``fn`` on every task and returns the results in task order.

    An executor may also accept ``on_result(index, row)``, called in the parent as each task
    finishes (any order), so results can be saved before the whole sweep ends.
    """

    def map(self, fn: Callable[[Task], Row], tasks: Sequence[Task],
            progress: Progress | None = None) -> list[Row]: ...


def _worker_init(parent_pid: int) -> None:
    """Pool worker start-up: die with the parent (a SIGKILLed sweep leaves no workers)."""
    from .._proc import die_with_parent

    die_with_parent(parent_pid)


def _dead_worker_row(exc: BaseException) -> Row:
    return {"error": "crash: the worker process running this variant died (out of memory, a "
                     f"crash in native code, or killed): {type(exc).__name__}; run it alone "
                     "with `xsim run` to see why", "wall_s": math.nan, "cpu_s": math.nan}


#: Local worker processes one sweep or search may start: each is an interpreter with numpy,
#: pandas and xsim loaded (~150 MB resident), so 256 is already tens of GB; more is a typo.
MAX_LOCAL_JOBS = 256


class LocalExecutor:
    """``jobs`` worker processes (spawned: no state inherited from the parent, the same on
    every OS); ``jobs=1`` runs in this process with no pool at all. Workers die with the
    parent (Linux parent-death signal)."""

    def __init__(self, jobs: int = 1) -> None:
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise XsimError(f"jobs: must be at least 1 (got {jobs!r})")
        if jobs > MAX_LOCAL_JOBS:
            raise XsimError(f"jobs: at most {MAX_LOCAL_JOBS} local worker processes "
                            f"(MAX_LOCAL_JOBS; each is a Python interpreter of its own) (got "
                            f"{jobs}); use --executor ray for a cluster")
        self.jobs = jobs

    def map(self, fn: Callable[[Task], Row], tasks: Sequence[Task],
            progress: Progress | None = None, on_result: OnResult | None = None) -> list[Row]:
        results: dict[int, Row] = {}

        def done(i: int, row: Row) -> None:
            results[i] = row
            if on_result:
                on_result(i, row)
            if progress:
                progress(1)

        if self._in_process(len(tasks)):
            for i, t in enumerate(tasks):
                done(i, fn(t))
            return [results[i] for i in range(len(tasks))]
        pending = list(range(len(tasks)))
        alone = False  # after a pool broke: one worker per task, so the culprit is known
        while pending:
            workers = 1 if alone else min(self.jobs, len(pending))
            batch = pending[:1] if alone else pending
            broken = self._pool_run(fn, tasks, batch, workers, done)
            pending = [i for i in pending if i not in results]
            if broken is not None:
                if alone:  # this single task killed its worker: record it, go on
                    done(batch[0], _dead_worker_row(broken))
                    pending = pending[1:]
                alone = True
        return [results[i] for i in range(len(tasks))]

    def _in_process(self, n_tasks: int) -> bool:
        """Run ``n_tasks`` here, one after the other (one job, or one task): no pool."""
        return min(self.jobs, n_tasks) <= 1

    @staticmethod
    def _pool_run(fn: Callable[[Task], Row], tasks: Sequence[Task], batch: list[int],
                  workers: int, done: OnResult) -> BaseException | None:
        """Run ``batch`` in a fresh pool; return the BrokenProcessPool if a worker died."""
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                   initializer=_worker_init, initargs=(os.getpid(),))
        try:
            broken = run_batch(pool, fn, tasks, batch, done)
            pool.shutdown(wait=True, cancel_futures=broken is not None)
            return broken
        except BaseException:
            kill_pool(pool)
            raise


class DeadlineReached(Exception):
    """:func:`run_batch` stopped at its ``stop_at`` with tasks unfinished (the pool must then
    be killed: its workers are still running them)."""


def run_batch(pool: ProcessPoolExecutor, fn: Callable[[Task], Row], tasks: Sequence[Task],
              batch: list[int], done: OnResult, stop_at: float = math.inf
              ) -> BaseException | None:
    """Run ``batch`` on ``pool``, calling ``done`` in task order among those finished together;
    return the BrokenProcessPool if a worker died (the pool is then unusable). ``stop_at``: a
    :func:`time.monotonic` instant; DeadlineReached if tasks are still running then."""
    futures: dict[Future, int] = {pool.submit(fn, tasks[i]): i for i in batch}
    waiting = set(futures)
    while waiting:
        left = None if stop_at == math.inf else max(stop_at - time.monotonic(), 0.0)
        finished, waiting = wait(waiting, timeout=left, return_when=FIRST_COMPLETED)
        if not finished:
            raise DeadlineReached(f"{len(waiting)} tasks unfinished at the deadline")
        for f in sorted(finished, key=futures.__getitem__):
            try:
                row = f.result()
            except BrokenProcessPool as e:
                return e
            done(futures[f], row)
    return None


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Ctrl-C or SIGTERM: stop now. Kill the running workers (otherwise the pool's exit handler
    waits for their variants to finish) and drop the ones not started."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def import_ray() -> Any:
    """The ``ray`` module, or BackendUnavailable saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(
            f"executor 'ray' needs the ray package, which is not installed: {RAY_HINT} "
            "(or use --executor local)"
        ) from None
    return ray


class RayExecutor:
    """One Ray task per variant on the cluster at ``address`` (``None``: the cluster named by
    ``RAY_ADDRESS``, else a new local one; ``"auto"``: an already running cluster). Every Ray
    worker must have xsim-adapters (and the backend) installed. ``ray_module`` is for tests.

    A variant's plan or backend error comes back in its row like on the local pool; a task
    Ray itself could not finish (its worker died, or its node was lost, after ``max_retries``
    retries) becomes a ``crash:`` row naming the Ray error, and the other variants go on.
    If this process started Ray, it is left running for the next sweep of the process and
    stopped when the process exits.
    """

    def __init__(self, address: str | None = None, ray_module: Any = None,
                 num_cpus: float = 1.0, max_retries: int = 3) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.max_retries = max_retries
        self._ray = ray_module if ray_module is not None else import_ray()

    def map(self, fn: Callable[[Task], Row], tasks: Sequence[Task],
            progress: Progress | None = None, on_result: OnResult | None = None) -> list[Row]:
        ray = self._ray
        if not tasks:
            return []
        if not ray.is_initialized():
            ray.init(address=self.address)
        remote = ray.remote(num_cpus=self.num_cpus, max_retries=self.max_retries)(fn)
        refs = [remote.remote(t) for t in tasks]
        pending = list(refs)
        index = {_ref_key(r): i for i, r in enumerate(refs)}
        results: dict[int, Row] = {}
        while pending:  # results are returned in task order; saved as each one finishes
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[_ref_key(ref)]
                results[i] = self._get(ref)
                if on_result:
                    on_result(i, results[i])
            if progress:
                progress(len(done))
        return [results[i] for i in range(len(tasks))]

    def _get(self, ref: Any) -> Row:
        """The row of a finished task, or a ``crash:`` row if Ray could not run it."""
        error = getattr(getattr(self._ray, "exceptions", None), "RayError", None)
        try:
            return dict(self._ray.get([ref])[0])
        except Exception as e:
            if error is None or not isinstance(e, error):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            return {"error": f"crash: Ray could not run this variant: {type(e).__name__}: "
                             f"{first}; run it alone with `xsim run` to see why",
                    "wall_s": math.nan, "cpu_s": math.nan}


def _ref_key(ref: Any) -> Any:
    """A dict key for a Ray ObjectRef: the ref itself (``ray.wait`` may return new ref objects
    equal to the submitted ones), or its identity when it cannot be hashed."""
    try:
        hash(ref)
    except TypeError:
        return ("id", id(ref))
    return ref


EXECUTORS = ("local", "ray")


def make_executor(name: str, jobs: int = 1, ray_address: str | None = None) -> Executor:
    """The executor called ``name`` (``local`` or ``ray``)."""
    if name == "local":
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(ray_address)
    raise XsimError(f"executor: expected one of {', '.join(EXECUTORS)} (got {name!r})")
