"""The ``xsim search`` subcommand: arguments, the output directory, what it prints.

Exit status: 0 when a best plan was found; 1 when no candidate could run (or a malformed spec).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..search.evaluate import ROWS_FILE
from .args import common_args, default_output


def add_search_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim search``."""
    from ..sweep.runner import EXECUTORS

    sp.add_argument("spec", metavar="SPEC",
                    help="The search spec YAML file (model, training, cluster, space, "
                         "prices, budget; see docs/search.md).")
    sp.add_argument("-o", "--output", default=None, metavar="OUT",
                    help="The output directory (default: out/<SPEC name>-search); gets "
                         "candidates.csv/.parquet, best.yaml, top/, pareto.png, summary.json.")
    sp.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                    help="Simulations run at once (local worker processes; default 1).")
    sp.add_argument("--executor", choices=EXECUTORS, default="local",
                    help="Where simulations run: local processes, or a Ray cluster.")
    sp.add_argument("--ray-address", metavar="ADDR", default=None,
                    help="The Ray cluster to connect to (default: RAY_ADDRESS, else local).")
    sp.add_argument("--top", default="5", metavar="K",
                    help="How many of the best plans to write as top/NN.yaml (and confirm; "
                         "default 5).")
    sp.add_argument("--confirm", metavar="BACKEND", default=None,
                    help="Re-run the top K plans on a packet backend (ns3 or htsim) and "
                         "report both iteration times.")
    sp.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="A backend option for --confirm; repeat for several.")
    sp.add_argument("--exhaustive", action="store_true",
                    help="Simulate every feasible candidate (no cut by the bound).")
    sp.add_argument("--no-baselines", action="store_true",
                    help="Skip the homogeneous-subset searches (and their speed-ups).")
    sp.add_argument("--max-evaluations", default=None, metavar="N",
                    help="Override budget.evaluations of the spec (simulations per pass).")
    sp.add_argument("--max-seconds", default=None, metavar="S",
                    help="Override budget.seconds of the spec: wall time of the whole "
                         "command, enumeration included (simulations still running then are "
                         "stopped; the result then depends on machine speed).")
    sp.add_argument("--coarsen", choices=("auto", "on", "off"), default="auto",
                    help="Coarsening of identical replicas in every simulation (default auto: "
                         "only where it is exact; on: also on oversubscribed fabrics, with the "
                         "error docs/scale.md measures).")
    sp.add_argument("--resume", action="store_true",
                    help="Keep OUT and the simulations recorded in OUT/search.rows.jsonl; "
                         "the search replays its decisions and simulates only what is new.")
    common_args(sp, force=True, progress=True)


def cmd_search(args: argparse.Namespace) -> int:
    """``xsim search``: see docs/search.md."""
    if args.output is None:
        args.output = default_output(args.spec, "search")
    return run_search_command(args)


@contextlib.contextmanager
def open_search_dir(out: Path, resume: bool, force: bool
                    ) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(the directory to fill, the recorded rows to reuse with ``resume``), locked by this
    search throughout (:func:`.._outdir.fill_output`: a new OUT fills in place, an earlier
    output is replaced whole at the end and survives any failure before)."""
    from .._outdir import fill_output
    from ..sweep.results import read_rows

    with fill_output(out, "search", force, resume, (ROWS_FILE,)) as (target, kept):
        yield target, (read_rows(target / ROWS_FILE) if kept else {})


def run_search_command(args: argparse.Namespace) -> int:
    """Run the search, write OUT/, print a short report; returns the exit status."""
    import dataclasses
    import time

    started = time.monotonic()  # the seconds budget and the reported time count from here

    from ..search.budget import parse_count, parse_seconds
    from ..search.evaluate import KeptPoolExecutor
    from ..search.spec import load_search_spec
    from ..sweep.runner import make_executor

    evaluations = parse_count(args.max_evaluations, "--max-evaluations")
    seconds = parse_seconds(args.max_seconds, "--max-seconds")
    top = parse_count(args.top, "--top") or 5
    spec = load_search_spec(args.spec)
    budget = spec.budget
    if evaluations is not None:
        budget = dataclasses.replace(budget, evaluations=evaluations)
    if seconds is not None:
        budget = dataclasses.replace(budget, seconds=seconds)
    spec = dataclasses.replace(spec, budget=budget)
    executor = (KeptPoolExecutor(args.jobs) if args.executor == "local"
                else make_executor(args.executor, args.jobs, args.ray_address))
    with open_search_dir(Path(args.output), args.resume, args.force) as (out, done):
        result, ev = _search_into(out, done, spec, executor, args, top, started)
    if ev.distrusted:  # resumed rows no simulation can give (below the proven bound)
        import sys

        n = len(ev.distrusted)
        print(f"xsim: warning: {Path(args.output) / ROWS_FILE}: {n} simulation row"
              f"{'s' if n > 1 else ''} below the proven lower bound, simulated again instead "
              f"of trusted ({ev.distrusted[0]}{f'; and {n - 1} more' if n > 1 else ''})",
              file=sys.stderr)
    _report(result, args.output, time.monotonic() - started)
    return 0 if result.best is not None else 1


def _search_into(out: Path, done: dict[str, Any], spec: Any, executor: Any,
                 args: argparse.Namespace, top: int, started: float) -> tuple[Any, Any]:
    """Run the search writing its rows and results into ``out`` (held by the caller);
    returns (result, evaluator)."""
    from ..options import parse_option_items
    from ..report.progress import ProgressBar
    from ..search.api import search, write_result
    from ..search.bnb import enumerate_space
    from ..search.bound import Analyzer
    from ..search.budget import Deadline
    from ..search.evaluate import Evaluator, KeptPoolExecutor
    from ..sweep.results import RowLog
    from ..sweep.rowsfile import warn_dropped

    budget = spec.budget
    if args.resume:
        warn_dropped(done, "simulation row")
        print(f"resuming in {args.output}: {len(done)} simulations on record in {ROWS_FILE}")
    an = Analyzer(spec)
    entries = enumerate_space(spec, an, Deadline(budget.seconds, started).enumeration_deadline())
    feasible = sum(1 for e in entries if e.status == "")
    with RowLog(out / ROWS_FILE) as log, \
            ProgressBar(feasible, "xsim search", force=args.progress) as bar, \
            contextlib.ExitStack() as stack:
        if isinstance(executor, KeptPoolExecutor):
            stack.enter_context(executor)
        ev = Evaluator(executor, base_dir=spec.base_dir, rows_log=log, done=done,
                       coarsen=args.coarsen)
        result = search(spec, evaluator=ev, exhaustive=args.exhaustive,
                        baselines=not args.no_baselines, top=top, confirm=args.confirm,
                        confirm_options=parse_option_items(args.option or []),
                        progress=lambda n, note: bar.advance(n, note), entries=entries,
                        analyzer=an, started=started)
        result.summary["simulated_now"] = ev.simulated
        write_result(result, out)
    return result, ev


def _report(result: Any, out: str, wall_s: float) -> None:
    """What the search found; ``wall_s``: seconds the whole command took (outputs written)."""
    s = result.summary
    partial = s["analysed"] < s["space_size"]
    why = (f" (budget reached during enumeration: {s['space_size'] - s['analysed']:,} "
           "candidates not analysed; best not proven)" if partial
           else "" if s["proven_optimal"] else " (budget reached: best not proven)")
    print(f"{s['spec']}: space {s['space_size']} plans, {s['feasible']} feasible, "
          f"{s['evaluated']} simulated ({s['simulations']} in all passes) in {wall_s:.1f} s"
          + why)
    print("  " + ", ".join(f"{k} {v}" for k, v in s["prune_counts"].items()))
    b = result.best
    if b is None:
        print("  no candidate ran")
        return
    print(f"  best: {b.cand.key}: iteration {float(b.row['iteration_time_ns']) / 1e6:.3f} ms, "
          f"{float(b.row['tokens_per_s']):,.0f} tokens/s")
    m = s["search"]
    gap = ("no bound (candidates not analysed)" if partial or m["bound_over_best"] is None
           else f"{m['bound_over_best']:.4f}")
    print(f"  proven bound / best objective: {gap}; the best plan's bound / its time: "
          f"{m['best_bound_over_time']:.4f}")
    for t, h in s.get("homogeneous", {}).items():
        same, own = h["speedup_same_batch"], h["speedup_own_batch"]
        fmt = (lambda x: "n/a" if x is None else f"{x:.3f}x")  # noqa: E731
        print(f"  speed-up over {t} alone: {fmt(same)} at the same global batch, "
              f"{fmt(own)} against its own best batch")
    print(f"wrote {out}/: best.yaml, top/, candidates.csv, candidates.parquet, pareto.png, "
          f"summary.json, {ROWS_FILE}")
