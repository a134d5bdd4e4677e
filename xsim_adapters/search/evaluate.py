"""Simulating candidates: tasks for the sweep executors, a result cache, the rows file.

A candidate runs exactly as a sweep variant does (:func:`..sweep.runner.run_variant`: validate
the plan, generate, replay, measure), on the local process pool or on Ray. Each finished row is
appended to ``OUT/search.rows.jsonl`` under the digest of its task (plan, backend, options), so
a killed search resumed with ``--resume`` re-runs nothing it already simulated; since the
branch and bound is deterministic, the resumed search takes the same decisions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..sweep.results import RowLog, variant_digest
from ..sweep.runner import Executor, LocalExecutor, run_variant

ROWS_FILE = "search.rows.jsonl"
Row = dict[str, Any]


class Evaluator:
    """Runs plan tasks on an executor, caching rows by task digest (and logging them)."""

    def __init__(self, executor: Executor | None = None, backend: str = "flow",
                 options: Mapping[str, Any] | None = None, base_dir: str | None = None,
                 rows_log: RowLog | None = None, done: Mapping[str, Row] | None = None,
                 run: Callable[[dict[str, Any]], Row] = run_variant) -> None:
        self.executor = executor or LocalExecutor(1)
        self.backend = backend
        self.options = dict(options or {})
        self.base_dir = base_dir
        self.rows_log = rows_log
        self.cache: dict[str, Row] = dict(done or {})
        self.run = run
        self.simulated = 0  # simulations actually run by this process (not from the cache)

    def task(self, plan: dict[str, Any]) -> dict[str, Any]:
        return {"plan": plan, "base_dir": self.base_dir, "backend": self.backend,
                "options": self.options}

    def evaluate(self, plans: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[Row]:
        """Rows of ``plans`` in order: cached ones at once, the others simulated together."""
        tasks = [self.task(p) for p in plans]
        digests = [variant_digest(t) for t in tasks]
        todo = [k for k, d in enumerate(digests) if d not in self.cache]

        def saved(i: int, row: Row) -> None:
            k = todo[i]
            self.cache[digests[k]] = row
            if self.rows_log is not None:
                self.rows_log.append(digests[k], k, {"candidate": labels[k]}, row)

        if todo:
            sub = [tasks[k] for k in todo]
            if "on_result" in inspect.signature(self.executor.map).parameters:
                self.executor.map(self.run, sub, None, on_result=saved)  # type: ignore[call-arg]
            else:
                for i, row in enumerate(self.executor.map(self.run, sub, None)):
                    saved(i, row)
            self.simulated += len(todo)
        return [self.cache[d] for d in digests]
