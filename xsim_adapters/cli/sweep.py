"""The ``xsim sweep`` subcommand: arguments and what it prints and writes.

Exit status: 0 when every variant ran; 1 when any variant failed (its error is in the
``error`` column and printed), unless ``--allow-failures``; 1 for a malformed sweep (bad path
syntax, bad values, unknown backend) before anything runs. The files are written either way.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..options import parse_option_items
from ..sweep.expand import Variant
from ..sweep.results import ROWS_FILE, RowLog, variant_digest
from ..sweep.spec import (
    SweepError,
    SweepSpec,
    check_axes,
    check_axis_paths,
    load_sweep_file,
    parse_set,
)
from .args import check_input, common_args, default_output, job_args

MAX_ERRORS_PRINTED = 10


def add_sweep_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim sweep``."""
    from ..sweep.runner import EXECUTORS

    sp.add_argument("plan", metavar="PLAN", nargs="?",
                    help="The base plan YAML file (optional with --sweep, whose base it "
                         "replaces).")
    sp.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=V1,V2",
                    help="An axis: a plan path (as in plan error messages, e.g. "
                         "replicas[1].stages[0].layers) and its values, read as a YAML flow "
                         "list (1,2 or lcm,direct or [0,16],[0,20]). Repeat for more axes; "
                         "the first varies slowest.")
    sp.add_argument("--sweep", metavar="FILE",
                    help="A sweep YAML file with base (plan path, relative to the file), "
                         "axes ({path: [values]}) and optionally backend and options; --set "
                         "axes are added after its axes.")
    sp.add_argument("--backend", default=None, metavar="NAME",
                    help="The backend every variant runs on (default: the sweep file's, "
                         "else flow).")
    sp.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="A backend option for every variant; repeat for several.")
    sp.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                    help="Variants run at once (local worker processes; default 1, which "
                         "runs them in this process).")
    sp.add_argument("--executor", choices=EXECUTORS, default="local",
                    help="Where variants run: local processes, or a Ray cluster (needs "
                         'pip install "xsim-adapters[ray]").')
    sp.add_argument("--ray-address", metavar="ADDR", default=None,
                    help="The Ray cluster to connect to (e.g. auto, or ray://host:10001); "
                         "default: RAY_ADDRESS, else a local Ray instance.")
    sp.add_argument("-o", "--output", default=None, metavar="OUT",
                    help="The output directory (default: out/<PLAN or sweep file name>-sweep); "
                         "gets "
                         "sweep.csv, sweep.parquet and sweep.yaml.")
    sp.add_argument("--resume", action="store_true",
                    help="Keep OUT and its finished rows (OUT/sweep.rows.jsonl) and run only "
                         "the variants without a successful row there; says how many it "
                         "skipped.")
    sp.add_argument("--allow-failures", action="store_true",
                    help="Exit 0 even if some variants failed (their rows carry the error).")
    job_args(sp, "each variant of PLAN runs beside them: sweep.csv gets its slowdown_pct "
                 "and each other job's job<k>_* columns")
    common_args(sp, force=True, progress=True)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``xsim sweep``: see docs/sweep.md."""
    if args.plan:
        check_input(args.plan, trace_ok=False)
    if args.output is None:
        args.output = default_output(args.plan or args.sweep, "sweep")
    return run_sweep_command(args)


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The sweep the command line describes (sweep file, then PLAN, then --set axes)."""
    from ..sweep.api import spec_for

    if args.sweep:
        spec = load_sweep_file(args.sweep)
        if args.plan:
            plan_spec = spec_for(args.plan, {})
            spec.base, spec.base_dir = plan_spec.base, plan_spec.base_dir
            spec.source, spec.base_path = plan_spec.source, plan_spec.base_path
    elif args.plan:
        spec = spec_for(args.plan, {})
    else:
        raise SweepError("give a PLAN, a --sweep file, or both")
    axes = dict(spec.axes)
    for item in args.sets:
        path, values = parse_set(item)
        if path in axes:
            raise SweepError(f"--set {path}: this axis is already given (merge the values "
                             "into one --set or one sweep-file entry)")
        axes[path] = values
    if not axes:
        raise SweepError("no axes (add --set PATH=V1,V2 or axes: in a sweep file)")
    spec.axes = check_axes(axes)
    check_axis_paths(spec.axes)  # before OUT is touched or any variant runs
    if args.backend:
        spec.backend = args.backend
    spec.options.update(parse_option_items(args.option or []))
    if args.job:
        from ..sweep.spec import read_job

        spec.jobs = [*spec.jobs, *(read_job(j) for j in args.job)]
    if args.job or not spec.jobs:
        spec.placement = args.placement
    return spec


def run_sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep, write OUT/, print a short report; returns the exit status."""
    from ..report.progress import ProgressBar
    from ..sweep.api import run_spec
    from ..sweep.expand import product
    from ..sweep.results import write_sweep
    from ..sweep.runner import make_executor

    spec = spec_from_args(args)
    executor = make_executor(args.executor, args.jobs, args.ray_address)
    total = len(product(spec.axes))
    with open_sweep_dir(Path(args.output), args.resume, args.force) as (out, done):
        if args.resume:
            from ..sweep.rowsfile import warn_dropped

            warn_dropped(done, "row")
            print(f"resuming in {args.output}: {len(done)} finished variants on record in "
                  f"{ROWS_FILE}")
        with ProgressBar(total, "xsim sweep", force=args.progress, unit="variants") as bar, \
                RowLog(out / ROWS_FILE) as log:
            bar.set_label(f"{total} variants on {spec.backend} ({args.executor} executor)")
            variants, frame = run_spec(spec, executor, lambda n: bar.advance(n), log, done)
        write_sweep(out, frame, spec.to_yaml())
    if args.resume:
        skipped = sum(variant_digest(t) in done for t in _tasks(spec, variants))
        print(f"skipped {skipped} variants already finished in {args.output}/{ROWS_FILE}")
    failed = frame[frame["error"] != ""]
    print(f"{len(frame)} variants of {spec.source} on {spec.backend}: "
          f"{len(frame) - len(failed)} ran, {len(failed)} failed")
    _print_best(frame, variants)
    for i in failed["variant"].head(MAX_ERRORS_PRINTED):
        v = variants[int(i)]
        print(f"  variant {v.index} ({show_overrides(v.overrides)}): {frame['error'].iloc[i]}")
    if len(failed) > MAX_ERRORS_PRINTED:
        print(f"  ... {len(failed) - MAX_ERRORS_PRINTED} more failures in sweep.csv")
    print(f"wrote {args.output}/: sweep.csv, sweep.parquet, sweep.yaml, {ROWS_FILE}")
    return 1 if len(failed) and not args.allow_failures else 0


@contextlib.contextmanager
def open_sweep_dir(out: Path, resume: bool, force: bool
                   ) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(the directory to fill, the finished rows to reuse with ``resume``), locked by this
    sweep throughout (:func:`.._outdir.fill_output`): a new OUT fills row by row in place, so
    a kill keeps the rows; an earlier output is replaced whole at the end, and survives any
    failure before."""
    from .._outdir import SWEEP_STAMP_FILES, fill_output
    from ..sweep.results import read_rows

    with fill_output(out, "sweep", force, resume, SWEEP_STAMP_FILES) as (target, kept):
        yield target, (read_rows(target / ROWS_FILE) if kept else {})


def _tasks(spec: SweepSpec, variants: list[Variant]) -> list[dict[str, Any]]:
    from ..sweep.api import task_for

    return [task_for(spec, v.plan) for v in variants if v.plan is not None]


def show_overrides(overrides: dict[str, Any]) -> str:
    """``path=value, ...`` with values as YAML (``null``, ``true``, ``[0, 16]``), the way
    ``--set`` reads them."""
    return ", ".join(f"{k}={_yaml_scalar(v)}" for k, v in overrides.items())


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, str):
        return v
    text = yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def _print_best(frame: pd.DataFrame, variants: list[Variant]) -> None:
    ok = frame[frame["error"] == ""]
    if ok.empty:
        return
    best = ok.loc[ok["iteration_time_ns"].idxmin()]
    what = show_overrides(variants[int(best["variant"])].overrides)
    print(f"  fastest: variant {best['variant']} ({what}): iteration "
          f"{best['iteration_time_ns'] / 1e6:.3f} ms, {best['tokens_per_s']:,.0f} tokens/s")
