"""``xsim run`` and ``xsim compare`` with ``--job``: several jobs on one fabric (docs/whatif.md).

Kept apart from :mod:`.run` (one module per idea): the placement, the shared replay and what
is written are :mod:`.jobs`'; this module parses, runs and prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import XsimError
from ..options import parse_option_items, split_backend_options
from .args import check_input, default_output
from .fmt import fmt_ns


def run_jobs_command(args: argparse.Namespace) -> int:
    """``xsim run PLAN --job PLAN2 ...``: several jobs on one fabric (docs/whatif.md)."""
    from .._outdir import check_output, output_dir
    from ..backends.registry import check_backend_options, get_backend
    from ..jobs import run_jobs
    from ..report.outputs import write_csv, write_json, write_links, write_run
    from ..report.progress import ProgressBar
    from ..traffic import load_job

    paths = [args.plan, *args.job]
    for p in paths:
        check_input(p, trace_ok=False)
    if args.baseline:
        raise XsimError("--baseline: not with --job (each job's slowdown against running "
                        "alone in its place is reported instead)")
    out = Path(args.output or default_output(args.plan, "run"))
    options = parse_option_items(args.option or [])
    get_backend(args.backend, options)
    check_backend_options(args.backend, options)
    check_output(out, "run", args.force)
    with ProgressBar(3, "xsim run (jobs)", force=args.progress) as bar:
        bar.step("loading the plans")
        plans = [load_job(p) for p in paths]
        bar.step(f"running {args.backend}: {len(plans)} jobs together, then each alone")
        res = run_jobs(plans, args.backend, options, placement=args.placement)
        bar.step("writing outputs")
        table = res.table()
        with output_dir(out, "run", args.force) as tmp:
            for plan, met in zip(res.jobs.plans, res.results, strict=True):
                jdir = tmp / "jobs" / plan.name
                jdir.mkdir(parents=True)
                if isinstance(met, dict):  # background traffic: offered vs achieved load
                    write_json(jdir / "summary.json", met)
                    continue
                assert met.source is not None
                write_run(jdir, met.source, met, plots=not args.no_plots,
                          title=f"{plan.name} beside {len(plans) - 1} other job(s) on "
                                f"{args.backend}")
            write_csv(tmp / "jobs.csv", table)
            write_links(tmp, res.links, plots=not args.no_plots,
                        title=f"{len(plans)} jobs, {args.placement} placement, {args.backend}")
            write_json(tmp / "summary.json", {
                "backend": args.backend, "placement": args.placement,
                "jobs": table.to_dict(orient="records"),
            })
    for row in table.to_dict(orient="records"):
        if "pattern" in row and isinstance(row.get("pattern"), str):
            print(f"traffic {row['job']}: {row['ranks']} GPUs, {row['pattern']}, offered load "
                  f"{row['offered_load']:.0%} of each NIC, achieved {row['achieved_load']:.0%}")
            continue
        print(f"job {row['job']}: {row['ranks']} GPUs, iteration "
              f"{fmt_ns(row['iteration_time_ns'])} ({row['slowdown_pct']:+.2f}% against "
              f"running alone in its place)")
    print(f"wrote {out}/: summary.json, jobs.csv, links.csv"
          + ("" if args.no_plots else ", links.png") + ", jobs/<name>/")
    return 0


def compare_jobs_command(args: argparse.Namespace, backends: list[str]) -> int:
    """``xsim compare PLAN --job PLAN2 ... --backends A,B``: the same placed jobs on each
    backend; writes OUT/compare_jobs.csv, OUT/summary.json and per backend OUT/<b>/ (jobs.csv,
    links.csv, jobs/<name>/)."""
    from .._outdir import check_output, output_dir
    from ..backends.registry import backend_options, check_backend_options, get_backend
    from ..jobs import compare_jobs
    from ..report.outputs import write_csv, write_json, write_links, write_run
    from ..report.progress import ProgressBar
    from ..traffic import load_job

    paths = [args.plan, *args.job]
    for p in paths:
        check_input(p, trace_ok=False)
    out = Path(args.output or default_output(args.plan, "compare"))
    check_output(out, "compare", args.force)
    per = split_backend_options(parse_option_items(args.option or []), backends,
                                {b: backend_options(b) for b in backends})
    for name in backends:
        get_backend(name, per[name])
        check_backend_options(name, per[name])
    with ProgressBar(3, "xsim compare (jobs)", force=args.progress) as bar:
        bar.step("loading the plans")
        plans = [load_job(p) for p in paths]
        bar.step(f"running {', '.join(backends)}: {len(plans)} jobs together, then each alone")
        results, table = compare_jobs(plans, backends, per, placement=args.placement)
        bar.step("writing outputs")
        with output_dir(out, "compare", args.force) as tmp:
            for b, res in results.items():
                for plan, met in zip(res.jobs.plans, res.results, strict=True):
                    jdir = tmp / b / "jobs" / plan.name
                    jdir.mkdir(parents=True)
                    if isinstance(met, dict):
                        write_json(jdir / "summary.json", met)
                        continue
                    assert met.source is not None
                    write_run(jdir, met.source, met, plots=False)
                write_csv(tmp / b / "jobs.csv", res.table())
                write_links(tmp / b, res.links, plots=False)
            write_csv(tmp / "compare_jobs.csv", table)
            write_json(tmp / "summary.json", {
                "backends": backends, "placement": args.placement,
                "jobs": table.to_dict(orient="records"),
            })
    ref = backends[0]
    for row in table.to_dict(orient="records"):
        if f"iteration_time_ns_{ref}" not in row:
            loads = ", ".join(f"{b} {row[f'achieved_load_{b}']:.0%}" for b in backends)
            print(f"traffic {row['job']}: achieved load {loads}")
            continue
        times = ", ".join(f"{b} {fmt_ns(row[f'iteration_time_ns_{b}'])} "
                          f"({row[f'slowdown_pct_{b}']:+.2f}% against alone)" for b in backends)
        diffs = ", ".join(f"{b} {100 * row[f'rel_diff_{b}']:+.2f}%" for b in backends[1:])
        print(f"job {row['job']}: {times}; vs {ref}: {diffs}")
    print(f"wrote {out}/: compare_jobs.csv, summary.json, "
          + ", ".join(f"{b}/jobs.csv" for b in backends))
    return 0
