"""The ``xsim sweep`` subcommand: arguments and what it prints and writes.

Exit status: 0 when every variant ran; 1 when any variant failed (its error is in the
``error`` column and printed), unless ``--allow-failures``; 1 for a malformed sweep (bad path
syntax, bad values, unknown backend) before anything runs. The files are written either way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..options import parse_option_items
from .expand import Variant
from .spec import SweepError, SweepSpec, check_axes, load_sweep_file, parse_set

DEFAULT_SWEEP_OUT = "xsim-sweep"
MAX_ERRORS_PRINTED = 10


def add_sweep_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim sweep``."""
    from .runner import EXECUTORS

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
    sp.add_argument("-o", "--output", default=DEFAULT_SWEEP_OUT, metavar="OUT",
                    help=f"The output directory (default: {DEFAULT_SWEEP_OUT}); gets "
                         "sweep.csv, sweep.parquet and sweep.yaml.")
    sp.add_argument("--allow-failures", action="store_true",
                    help="Exit 0 even if some variants failed (their rows carry the error).")
    sp.add_argument("--progress", action="store_true", default=None,
                    help="Draw the progress bar even when stderr is not a terminal.")


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The sweep the command line describes (sweep file, then PLAN, then --set axes)."""
    from .api import spec_for

    if args.sweep:
        spec = load_sweep_file(args.sweep)
        if args.plan:
            plan_spec = spec_for(args.plan, {})
            spec.base, spec.base_dir = plan_spec.base, plan_spec.base_dir
            spec.source, spec.base_path = plan_spec.source, plan_spec.base_path
    elif args.plan:
        spec = spec_for(args.plan, {})
    else:
        raise SweepError("xsim sweep: give a PLAN, a --sweep file, or both")
    axes = dict(spec.axes)
    for item in args.sets:
        path, values = parse_set(item)
        if path in axes:
            raise SweepError(f"--set {path}: this axis is already given (merge the values "
                             "into one --set or one sweep-file entry)")
        axes[path] = values
    if not axes:
        raise SweepError("xsim sweep: no axes (add --set PATH=V1,V2 or axes: in a sweep file)")
    spec.axes = check_axes(axes)
    if args.backend:
        spec.backend = args.backend
    spec.options.update(parse_option_items(args.option or []))
    return spec


def run_sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep, write OUT/, print a short report; returns the exit status."""
    from ..report.progress import ProgressBar
    from .api import run_spec
    from .expand import product
    from .results import write_sweep
    from .runner import make_executor

    spec = spec_from_args(args)
    executor = make_executor(args.executor, args.jobs, args.ray_address)
    total = len(product(spec.axes))
    with ProgressBar(total, "xsim sweep", force=args.progress) as bar:
        variants, frame = run_spec(spec, executor, lambda n: bar.advance(n))
    out = Path(args.output)
    write_sweep(out, frame, spec.to_yaml())
    failed = frame[frame["error"] != ""]
    print(f"{len(frame)} variants of {spec.source} on {spec.backend}: "
          f"{len(frame) - len(failed)} ran, {len(failed)} failed")
    _print_best(frame, variants)
    for i in failed["variant"].head(MAX_ERRORS_PRINTED):
        v = variants[int(i)]
        print(f"  variant {v.index} ({show_overrides(v.overrides)}): {frame['error'].iloc[i]}")
    if len(failed) > MAX_ERRORS_PRINTED:
        print(f"  ... {len(failed) - MAX_ERRORS_PRINTED} more failures in sweep.csv")
    print(f"wrote {out}/: sweep.csv, sweep.parquet, sweep.yaml")
    return 1 if len(failed) and not args.allow_failures else 0


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
