"""``xsim run``, ``xsim compare`` and ``xsim backends``: replay a plan or trace on one
backend or several, and list the backends (``--job``: :mod:`.jobs`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ..errors import XsimError
from ..options import parse_option_items, split_backend_options
from .args import (
    check_input,
    coarsen_arg,
    common_args,
    default_output,
    job_args,
    parse_backends,
)
from .fmt import fmt_bytes, fmt_ns, fmt_pct
from .trace import generate_warned, load_input


def _run_args(sp: argparse.ArgumentParser) -> None:
    """PLAN, ``-o``, ``--option``, the common flags and ``--coarsen``: run's and compare's."""
    sp.add_argument("plan", metavar="PLAN",
                    help="A plan YAML file, or a trace directory written by `xsim trace`.")
    sp.add_argument("-o", "--output", default=None, metavar="OUT",
                    help="The output directory (default: out/<PLAN name>-<command>).")
    sp.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="A backend option; repeat for several (values are read as YAML "
                         "scalars, e.g. seed=1).")
    common_args(sp, force=True, progress=True)
    coarsen_arg(sp)


def add_run_arguments(r: argparse.ArgumentParser) -> None:
    """The options of ``xsim run``."""
    _run_args(r)
    r.add_argument("--backend", default="flow", metavar="NAME",
                   help="The backend to run (default: flow; see `xsim backends`).")
    r.add_argument("--no-plots", action="store_true",
                   help="Skip timeline.png and timeline.perfetto.json.")
    job_args(r, "writes per-job results under OUT/jobs/, jobs.csv (slowdown against "
                "running alone) and links.csv")
    r.add_argument("--links", action="store_true",
                   help="Also write per-link telemetry: links.csv (bytes, busy time, peak "
                        "concurrent flows, utilisation per directed link) and links.png "
                        "(the hottest links); docs/metrics.md.")
    r.add_argument("--baseline", action="store_true",
                   help="For a plan with a perturb: section, also replay it without the "
                        "perturbation on the same backend and report what it cost "
                        "(summary.json perturbation.cost_ns; docs/whatif.md).")


def add_compare_arguments(c: argparse.ArgumentParser) -> None:
    """The options of ``xsim compare``."""
    _run_args(c)
    c.add_argument("--backends", default="flow,ns3", metavar="A,B",
                   help="Comma-separated backends; the first is the reference (default: "
                        "flow,ns3). Prefix an option with a backend name to aim it at that "
                        "backend only, e.g. --option ns3.transport=dctcp.")
    job_args(c, "writes OUT/compare_jobs.csv (each job's iteration time and slowdown on "
                "every backend) and each backend's jobs.csv, links.csv and jobs/ under "
                "OUT/<backend>/")


def add_backends_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``xsim backends``."""
    b.add_argument("--options", action="store_true",
                   help="Also list each backend's options: name, type or allowed values, "
                        "default and what it does.")
    common_args(b, force=False, progress=False)


def print_summary(s: dict[str, Any]) -> None:
    tps = s.get("tokens_per_s")
    print(f"backend {s['backend']}: iteration {fmt_ns(s['iteration_time_ns'])}, "
          f"{tps:,.0f} tokens/s, MFU {fmt_pct(s.get('mfu'))}" if tps is not None else
          f"backend {s['backend']}: iteration {fmt_ns(s['iteration_time_ns'])}, "
          f"MFU {fmt_pct(s.get('mfu'))}")
    for name, d in s.get("device_types", {}).items():
        print(f"  {name}: {d['ranks']} GPUs, {d['achieved_tflops_per_gpu']:.1f} TFLOP/s per GPU, "
              f"MFU {fmt_pct(d.get('mfu'))}")
    m = s["means"]
    # Two views of one rank's time (docs/metrics.md): the first line's figures may overlap
    # (its bubble and straggler wait include time spent communicating); the breakdown's five
    # parts do not and add up to the iteration. The labels say which is which, since the
    # same words appear on both lines with different numbers.
    print(f"  per rank (mean, parts overlap): compute {fmt_ns(m['compute_ns'])}, comm "
          f"{fmt_ns(m['comm_ns'])} (exposed {fmt_ns(m['exposed_comm_ns'])}), bubble incl. comm "
          f"{fmt_ns(m['bubble_ns'])}, straggler wait incl. comm "
          f"{fmt_ns(m['straggler_wait_ns'])}, idle {fmt_ns(m['idle_ns'])}")
    print(f"  time breakdown (mean per rank, parts add up to the iteration): compute "
          f"{fmt_ns(m['breakdown_compute_ns'])}, exposed comm "
          f"{fmt_ns(m['breakdown_exposed_comm_ns'])}, straggler wait excl. comm "
          f"{fmt_ns(m['breakdown_straggler_wait_ns'])}, bubble excl. comm "
          f"{fmt_ns(m['breakdown_bubble_ns'])}, other {fmt_ns(m['breakdown_other_ns'])}")
    worst = s.get("max_straggler")
    if worst:
        print(f"  largest straggler: rank {worst['rank']} made others wait "
              f"{fmt_ns(worst['caused_wait_ns'])} in total")
    cp = s.get("critical_path")
    if cp and cp.get("top_ranks"):
        top = cp["top_ranks"][0]
        print(f"  critical path: compute {fmt_ns(cp['compute_ns'])} (most on rank "
              f"{top['rank']}: {fmt_ns(top['compute_ns'])}), communication "
              f"{fmt_ns(cp['comm_ns'] + cp['barrier_ns'])}")


def cmd_run(args: argparse.Namespace) -> int:
    """``xsim run``: one backend on a plan or trace; writes OUT/ and prints the summary."""
    from .. import api
    from .._outdir import check_output, output_dir
    from ..backends.registry import check_backend_options, get_backend
    from ..report.outputs import write_links, write_run
    from ..report.progress import ProgressBar

    if args.job:
        from .jobs import run_jobs_command

        return run_jobs_command(args)
    check_input(args.plan, trace_ok=True)
    out = Path(args.output or default_output(args.plan, "run"))
    options = parse_option_items(args.option or [])
    get_backend(args.backend, options)  # fail on an unknown or unavailable backend first
    check_backend_options(args.backend, options)  # and on an unknown option or a bad value
    check_output(out, "run", args.force)  # and on an output path we may not replace
    with ProgressBar(5, "xsim run", force=args.progress) as bar:
        bar.step("loading the input")
        plan, trace = load_input(args.plan)
        if args.baseline and not plan.perturb.active:
            raise XsimError("--baseline: the plan has no perturb: section, so there is no "
                            "perturbation to cost (docs/whatif.md)")
        if trace is None:
            bar.set_label("generating the trace")
            trace = generate_warned(plan, args.coarsen)
        bar.step("building the topology")
        topology = api.build_topology(plan)
        hook = bar.replay_hook(args.backend)  # a step the backend moves through its replay
        timeline = api.run(trace, args.backend, topology, {**options, "progress": hook})
        bar.step("computing metrics")
        met = api.metrics(trace, timeline)
        if args.baseline:
            bar.set_label(f"running {args.backend} without the perturbation")
            api.add_perturbation_cost(met, plan, args.backend, options)
        bar.step("writing outputs")
        # The whole run directory is one unit: written beside OUT, then swapped in.
        with output_dir(out, "run", args.force) as tmp:
            (tmp / "trace").mkdir()
            api.write_trace_files(trace, tmp / "trace", plan)
            write_run(tmp, timeline, met, plots=not args.no_plots,
                      title=f"{plan.name} on {timeline.backend}")
            if args.links:
                write_links(tmp, api.link_metrics(trace, timeline, topology),
                            plots=not args.no_plots, title=f"{plan.name} on {timeline.backend}")
    print_summary(met.summary)
    pc = met.summary.get("perturbation", {})
    if "cost_ns" in pc:
        print(f"  perturbation cost: {fmt_ns(pc['cost_ns'])} per iteration "
              f"({pc['cost_pct']:+.2f}% over {fmt_ns(pc['baseline_iteration_ns'])})")
    print(f"wrote {out}/: trace/, timeline.parquet, ranks.csv, summary.json"
          + ("" if args.no_plots else ", timeline.png, timeline.perfetto.json")
          + ("" if not args.links else ", links.csv" + ("" if args.no_plots else ", links.png")))
    return 0


def print_run_info(info: Any) -> None:
    """What each backend simulated as packets vs fluid, and its start-up vs replay time."""
    print("what each backend simulated (packets: packet by packet; fluid: rate model) and where"
          " its time went:")
    for r in info.itertuples(index=False):
        flows = r.packet_flows + r.fluid_flows
        share = "" if math.isnan(r.fluid_bytes_pct) else f" ({r.fluid_bytes_pct:.1f}% of bytes)"
        print(f"  {r.backend}: packets {r.packet_flows:,} of {flows:,} flows,"
              f" {fmt_bytes(r.packet_bytes)}; fluid {r.fluid_flows:,} flows,"
              f" {fmt_bytes(r.fluid_bytes)}{share}; start-up {r.startup_s:.2f} s, replay"
              f" {r.replay_s:.2f} s, wall {r.wall_s:.2f} s")
        if r.off_route_flows:
            print(f"  {r.backend}: {r.off_route_flows:,} packet flows ran on other links than"
                  " the other backends route them (one path per GPU pair); add `ecmp:"
                  " connection` under `network:` for identical routing (docs/ns3.md)")


def cmd_compare(args: argparse.Namespace) -> int:
    """``xsim compare``: several backends on the identical trace and topology."""
    from .. import api
    from ..report.outputs import write_csv, write_run
    from ..report.plot import plot_compare
    from ..report.progress import ProgressBar

    backends = parse_backends(args.backends)
    from .._outdir import check_output, output_dir
    from ..backends.registry import backend_options, check_backend_options, get_backend

    if args.job:
        from .jobs import compare_jobs_command

        return compare_jobs_command(args, backends)

    check_input(args.plan, trace_ok=True)
    out = Path(args.output or default_output(args.plan, "compare"))
    check_output(out, "compare", args.force)

    per = split_backend_options(parse_option_items(args.option or []), backends,
                                {b: backend_options(b) for b in backends})
    for name in backends:  # fail on an unknown or unavailable backend before any work
        get_backend(name, per[name])
    for name in backends:  # and on an unknown option or a bad value
        check_backend_options(name, per[name])
    with ProgressBar(3 + len(backends), "xsim compare", force=args.progress) as bar:
        bar.step("loading the input")
        plan, trace = load_input(args.plan)
        if trace is None:
            bar.set_label("generating the trace")
            trace = generate_warned(plan, args.coarsen)
        bar.step("building the topology")
        topology = api.build_topology(plan)
        # each backend's replay is a step of its own, moved by the backend's progress reports
        cmp = api.compare_backends(plan, backends, per, trace=trace, topology=topology,
                                   progress=bar.replay_hook)
        bar.step("writing outputs")
        with output_dir(out, "compare", args.force) as tmp:
            (tmp / "trace").mkdir()
            api.write_trace_files(trace, tmp / "trace", plan)
            for name in backends:
                write_run(tmp / name, cmp.timelines[name], cmp.metrics[name], plots=False)
            write_csv(tmp / "compare.csv", cmp.table)
            write_csv(tmp / "compare_ranks.csv", cmp.ranks)
            write_csv(tmp / "compare_runs.csv", cmp.run_info)
            plot_compare(tmp / "compare.png", {b: cmp.metrics[b].summary for b in backends},
                         title=f"{plan.name}: {' vs '.join(backends)}")
    for name in backends:
        print_summary(cmp.metrics[name].summary)
    print_run_info(cmp.run_info)
    ref = backends[0]
    for b in backends[1:]:
        t = cmp.pairs[(ref, b)].metrics.set_index("metric")
        rel = t.loc["iteration_time_ns", "rel_diff"]
        print(f"{b} vs {ref}: iteration time {100 * rel:+.2f}%")
    print(f"wrote {out}/: compare.csv, compare_ranks.csv, compare_runs.csv, compare.png, "
          + ", ".join(f"{b}/summary.json" for b in backends))
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    """``xsim backends``: every installed backend, its availability and (``--options``)
    its options."""
    from ..backends.registry import backend_options, list_backends
    from ..options import option_table

    rows = list_backends()
    if not rows:
        print("no backends are installed (entry-point group xsim_adapters.backends is empty)")
        return 0
    width = max(len(n) for n, _, _ in rows)
    for name, ok, reason in rows:
        status = "available" if ok else "unavailable"
        print(f"{name:<{width}}  {status}" + (f": {reason}" if reason else ""))
        if args.options:
            try:
                lines = option_table(backend_options(name))
            except XsimError as exc:  # a plugin that does not import has no option list
                lines = [f"(options unknown: {exc})"]
            for line in lines:
                print(f"    --option {line}")
    return 0
