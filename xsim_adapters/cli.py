"""The ``xsim`` command: validate plans, write traces, run backends, compare them and
sweep over plan variants.

Errors the project raises on purpose (XsimError) print as one ``xsim: error: ...`` line (or a
few) with exit status 1, never a traceback; ``xsim`` without a subcommand prints help, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import XsimError
from .options import parse_option_items, split_backend_options

#: Outputs go to ``out/<input name>-<command>`` when ``-o`` is omitted (``/out/`` is git-ignored).
DEFAULT_OUT_ROOT = "out"
PLAN_SUFFIXES = (".yaml", ".yml")


def default_output(source: str | None, command: str, suffix: str = "") -> str:
    """``out/<name of source without extension>-<command><suffix>``, for an omitted ``-o``."""
    name = Path(source).stem if source else "xsim"
    return str(Path(DEFAULT_OUT_ROOT) / f"{name or 'xsim'}-{command}{suffix}")


def check_input(path: str, trace_ok: bool) -> None:
    """Raise XsimError (one line) unless ``path`` is a plan file (``.yaml``/``.yml``) or, with
    ``trace_ok``, a trace directory (one holding ``manifest.json``)."""
    p = Path(path)
    want = "a plan file (.yaml or .yml)" + (
        " or a trace directory (with manifest.json)" if trace_ok else "")
    if p.is_dir():
        if trace_ok and (p / "manifest.json").is_file():
            return
        raise XsimError(f"{path} is a directory, not {want}")
    if not p.exists():
        raise XsimError(f"plan file not found: {path} (expected {want})")
    if not p.is_file():
        raise XsimError(f"{path}: not a regular file (expected {want})")
    if p.suffix.lower() not in PLAN_SUFFIXES:
        raise XsimError(f"{path}: not {want}: plan file names end in .yaml or .yml")


def _fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.3f} us"
    return f"{ns:.0f} ns"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


# ---------------------------------------------------------------- subcommands


def _runs(items: Sequence[str]) -> list[tuple[list[int], str]]:
    """Consecutive equal items grouped: [(indices, item), ...]."""
    out: list[tuple[list[int], str]] = []
    for i, text in enumerate(items):
        if out and out[-1][1] == text:
            out[-1][0].append(i)
        else:
            out.append(([i], text))
    return out


def _span(word: str, ids: Sequence[int]) -> str:
    """``replica 3``, ``replicas 0-15`` or ``replicas 0,2,5``."""
    if len(ids) == 1:
        return f"{word} {ids[0]}"
    if list(ids) == list(range(ids[0], ids[-1] + 1)):
        return f"{word}s {ids[0]}-{ids[-1]}"
    return f"{word}s " + ",".join(map(str, ids))


def cmd_schema(args: argparse.Namespace) -> int:
    """``xsim schema``: the JSON Schema of plan files, generated from the plan loader."""
    from .plan.schema import schema_text

    text = schema_text()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from ._atomic import write_text_atomic

    print(f"wrote the plan JSON Schema to {write_text_atomic(args.output, text)}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from . import api

    check_input(args.plan, trace_ok=False)
    plan = api.load_plan(args.plan)
    tr = plan.training
    print(f"plan {plan.name!r}: valid")
    print(f"  {plan.num_ranks} ranks on {plan.num_nodes} servers in "
          f"{len(plan.device_groups)} device groups; model {plan.model.name} "
          f"({plan.model.layers} layers, hidden {plan.model.hidden}, seq {plan.model.seq_len})")
    print(f"  training: global batch {tr.global_batch}, micro-batch {tr.micro_batch}, "
          f"schedule {tr.schedule}, ZeRO {tr.zero_stage}, recompute {tr.recompute}")
    print(f"  {plan.dp} replicas:")
    descs = []
    for rep in plan.replicas:
        tps = ",".join(str(s.tp) for s in rep.stages)
        layers = " ".join(f"[{s.layers[0]},{s.layers[1]})" for s in rep.stages)
        groups = ",".join(dict.fromkeys(s.group for s in rep.stages))
        descs.append(f"pp {rep.pp}, tp [{tps}], {rep.micro_batches} micro-batches, "
                     f"layers {layers}, on {groups}")
    for ids, text in _runs(descs):
        print(f"    {_span('replica', ids)}: {text}")
    from .plan.memory import memory_report

    mem = memory_report(plan)
    print("  memory per device (GB): replicas, stage, type, tp: total / capacity")
    lines = [
        (int(r.replica), f"stage {r.stage} {r.device_type} tp {r.tp}: {r.total_GB:.2f} / "
         f"{r.capacity_GB:.2f} (weights {r.weights_GB:.2f}, grads {r.gradients_GB:.2f}, "
         f"optimizer {r.optimizer_GB:.2f}, activations {r.activations_GB:.2f})")
        for r in mem.itertuples()
    ]
    by_text: dict[str, list[int]] = {}
    for rep_id, text in lines:
        by_text.setdefault(text, []).append(rep_id)
    for text, ids in by_text.items():
        print(f"    {_span('replica', ids)} {text}")
    return 0


def _op_counts(trace) -> str:
    from .trace.schema import KINDS

    counts = trace.ops["kind"].value_counts()
    parts = [f"{int(counts.get(i, 0))} {k}" for i, k in enumerate(KINDS)]
    return f"{trace.num_ops} ops ({', '.join(parts)}), {len(trace.deps)} dependency edges"


COARSEN_HELP = (
    "Simulate one representative of each class of identical data-parallel replicas, with "
    "every DP ring flow kept, and only the first p + 8 micro-batches of a 1F1B pipeline of "
    "depth p, adding the left-out steady-state periods back in the metrics (docs/scale.md): "
    "auto (default) does each only for a plan whose trace would exceed 5 million ops (the "
    "replicas on a symmetric fabric, the micro-batches of one class of replicas), on "
    "wherever possible, off never. Ignored when PLAN is a trace directory."
)


def coarsen_arg(sp: argparse.ArgumentParser) -> None:
    """The ``--coarsen`` option of every command that generates a trace."""
    sp.add_argument("--coarsen", choices=("auto", "on", "off"), default="auto",
                    help=COARSEN_HELP)


def cmd_trace(args: argparse.Namespace) -> int:
    from . import api
    from ._outdir import check_output

    check_input(args.plan, trace_ok=False)
    args.output = args.output or default_output(args.plan, "trace")
    check_output(args.output, "trace", args.force)  # before any work
    plan = api.load_plan(args.plan)
    trace = api.generate(plan, coarsen=args.coarsen)
    api.write_trace(trace, args.output, plan, force=args.force)
    print(f"wrote {_op_counts(trace)} to {args.output}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``xsim export``: the trace in a peer simulator's format."""
    from ._outdir import check_output, check_output_file, output_dir

    check_input(args.plan, trace_ok=True)
    if args.npus is not None and (args.format != "chakra" or args.npus < 1):
        raise XsimError(f"--npus: a positive NPU count for --format chakra (got {args.npus} "
                        f"with --format {args.format})")
    if args.output is None:
        suffix = ".goal" if args.format == "goal" else ""
        args.output = default_output(args.plan, f"export-{args.format}", suffix)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    if args.format == "goal":
        check_output_file(args.output, "GOAL schedule", _is_goal_file)
    else:
        from .trace.export_chakra import import_chakra

        import_chakra()  # a missing mlc-chakra is said before any work
        check_output(args.output, "chakra", args.force)
    plan, trace = _load_input(args.plan)
    if trace is None:
        from . import api

        trace = api.generate(plan, coarsen=args.coarsen)
    if args.format == "goal":
        from .trace.export_goal import export_goal

        path = export_goal(trace, args.output)
        print(f"wrote GOAL schedule for {trace.num_ranks} ranks to {path}")
    else:
        from .trace.export_chakra import export_chakra

        with output_dir(args.output, "chakra", args.force) as tmp:
            paths = export_chakra(trace, tmp, collectives=args.collectives, npus=args.npus)
            extra = _write_astra_configs(plan, Path(tmp)) if args.astra_configs else ""
        print(f"wrote {len(paths)} Chakra ET files ({args.collectives}) and "
              f"comm_groups.json{extra} to {args.output}")
    return 0


def _write_astra_configs(plan: Any, directory: Path) -> str:
    """ASTRA-sim's network, system and memory files for ``plan`` into ``directory``; warns
    on stderr about what they cannot express. Returns the names written, for the message."""
    from .interop.astra_configs import astra_configs

    files, warnings = astra_configs(plan)
    for name, text in files.items():
        (directory / name).write_text(text)
    for w in warnings:
        print(f"xsim: warning: ASTRA-sim configs: {w}", file=sys.stderr)
    return ", " + ", ".join(files)


def cmd_import(args: argparse.Namespace) -> int:
    """``xsim import``: a directory of Chakra ET files as a trace directory on a plan's
    cluster, runnable with ``xsim run TRACE_DIR`` (docs/trace.md, "Importing Chakra ET")."""
    from . import api
    from ._outdir import check_output
    from .trace.export_chakra import import_chakra

    import_chakra()  # a missing mlc-chakra is said before any work
    check_input(args.plan, trace_ok=False)
    args.output = args.output or default_output(args.et_dir, "import")
    check_output(args.output, "trace", args.force)
    plan = api.load_plan(args.plan)
    from .interop.chakra_import import import_chakra_et

    trace = import_chakra_et(args.et_dir, plan, prefix=args.prefix,
                             comm_groups=args.comm_groups)
    api.write_trace(trace, args.output, plan, force=args.force)
    print(f"wrote {_op_counts(trace)} (imported from Chakra ET {args.et_dir}) to {args.output}")
    return 0


def add_import_command(add) -> None:
    """Register ``xsim import`` (``add``: :func:`build_parser`'s sub-command adder)."""
    i = add("import", "Read a directory of Chakra execution traces (ASTRA-sim's workload "
                      "input, one .et file per rank) into a trace directory on a plan's "
                      "cluster; run it with `xsim run TRACE_DIR`.", cmd_import)
    i.add_argument("et_dir", metavar="ET_DIR",
                   help="The directory of <prefix>.<rank>.et files (and comm_groups.json).")
    i.add_argument("--plan", required=True, metavar="PLAN",
                   help="The plan whose device_groups, network and collectives settings the "
                        "ET runs on (rank r of the ET is rank r of the plan).")
    i.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="The trace directory to write (the plan is stored in it as plan.yaml; "
                        "default: out/<ET_DIR name>-import).")
    i.add_argument("--prefix", default=None,
                   help="The file prefix (default: the one prefix the directory holds).")
    i.add_argument("--comm-groups", default=None, metavar="FILE",
                   help="The process groups file (default: ET_DIR/comm_groups.json).")
    i.add_argument("--force", action="store_true", help=FORCE_HELP)


def _is_goal_file(path: Path) -> bool:
    """Whether ``path`` looks like a GOAL schedule (first line ``num_ranks N``): the only
    existing file ``xsim export --format goal`` replaces."""
    import re

    try:
        with open(path, "rb") as fh:
            head = fh.readline(64)
    except OSError:
        return False
    return re.fullmatch(rb"num_ranks \d+\r?\n?", head) is not None


def _load_input(path: str):
    """(plan, trace or None) from a plan file or a trace directory."""
    from . import api

    p = Path(path)
    if p.is_dir():
        trace, plan = api.load_trace_and_plan(p)
        return plan, trace
    return api.load_plan(p), None


def _print_summary(s: dict[str, Any]) -> None:
    tps = s.get("tokens_per_s")
    print(f"backend {s['backend']}: iteration {_fmt_ns(s['iteration_time_ns'])}, "
          f"{tps:,.0f} tokens/s, MFU {_pct(s.get('mfu'))}" if tps is not None else
          f"backend {s['backend']}: iteration {_fmt_ns(s['iteration_time_ns'])}, "
          f"MFU {_pct(s.get('mfu'))}")
    for name, d in s.get("device_types", {}).items():
        print(f"  {name}: {d['ranks']} GPUs, {d['achieved_tflops_per_gpu']:.1f} TFLOP/s per GPU, "
              f"MFU {_pct(d.get('mfu'))}")
    m = s["means"]
    print(f"  per rank (mean): compute {_fmt_ns(m['compute_ns'])}, comm {_fmt_ns(m['comm_ns'])} "
          f"(exposed {_fmt_ns(m['exposed_comm_ns'])}), bubble {_fmt_ns(m['bubble_ns'])}, "
          f"straggler wait {_fmt_ns(m['straggler_wait_ns'])}, idle {_fmt_ns(m['idle_ns'])}")
    print(f"  time breakdown (mean per rank): compute {_fmt_ns(m['breakdown_compute_ns'])}, "
          f"exposed comm {_fmt_ns(m['breakdown_exposed_comm_ns'])}, straggler wait "
          f"{_fmt_ns(m['breakdown_straggler_wait_ns'])}, bubble "
          f"{_fmt_ns(m['breakdown_bubble_ns'])}, other {_fmt_ns(m['breakdown_other_ns'])}")
    worst = s.get("max_straggler")
    if worst:
        print(f"  largest straggler: rank {worst['rank']} made others wait "
              f"{_fmt_ns(worst['caused_wait_ns'])} in total")
    cp = s.get("critical_path")
    if cp and cp.get("top_ranks"):
        top = cp["top_ranks"][0]
        print(f"  critical path: compute {_fmt_ns(cp['compute_ns'])} (most on rank "
              f"{top['rank']}: {_fmt_ns(top['compute_ns'])}), communication "
              f"{_fmt_ns(cp['comm_ns'] + cp['barrier_ns'])}")


def cmd_run(args: argparse.Namespace) -> int:
    from . import api
    from ._outdir import check_output, output_dir
    from .backends.registry import check_backend_options, get_backend
    from .report.outputs import write_links, write_run
    from .report.progress import ProgressBar

    if args.job:
        from .cli_jobs import run_jobs_command

        return run_jobs_command(args)
    check_input(args.plan, trace_ok=True)
    out = Path(args.output or default_output(args.plan, "run"))
    options = parse_option_items(args.option or [])
    get_backend(args.backend, options)  # fail on an unknown or unavailable backend first
    check_backend_options(args.backend, options)  # and on an unknown option or a bad value
    check_output(out, "run", args.force)  # and on an output path we may not replace
    with ProgressBar(5, "xsim run", force=args.progress) as bar:
        bar.step("loading the input")
        plan, trace = _load_input(args.plan)
        if args.baseline and not plan.perturb.active:
            raise XsimError("--baseline: the plan has no perturb: section, so there is no "
                            "perturbation to cost (docs/whatif.md)")
        if trace is None:
            bar.set_label("generating the trace")
            trace = api.generate(plan, coarsen=args.coarsen)
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
    _print_summary(met.summary)
    pc = met.summary.get("perturbation", {})
    if "cost_ns" in pc:
        print(f"  perturbation cost: {_fmt_ns(pc['cost_ns'])} per iteration "
              f"({pc['cost_pct']:+.2f}% over {_fmt_ns(pc['baseline_iteration_ns'])})")
    print(f"wrote {out}/: trace/, timeline.parquet, ranks.csv, summary.json"
          + ("" if args.no_plots else ", timeline.png, timeline.perfetto.json")
          + ("" if not args.links else ", links.csv" + ("" if args.no_plots else ", links.png")))
    return 0


def _print_run_info(info: Any) -> None:
    """What each backend simulated as packets vs fluid, and its start-up vs replay time."""
    print("what each backend simulated (packets: packet by packet; fluid: rate model) and where"
          " its time went:")
    for r in info.itertuples(index=False):
        flows = r.packet_flows + r.fluid_flows
        share = "" if math.isnan(r.fluid_bytes_pct) else f" ({r.fluid_bytes_pct:.1f}% of bytes)"
        print(f"  {r.backend}: packets {r.packet_flows:,} of {flows:,} flows,"
              f" {_fmt_bytes(r.packet_bytes)}; fluid {r.fluid_flows:,} flows,"
              f" {_fmt_bytes(r.fluid_bytes)}{share}; start-up {r.startup_s:.2f} s, replay"
              f" {r.replay_s:.2f} s, wall {r.wall_s:.2f} s")
        if r.off_route_flows:
            print(f"  {r.backend}: {r.off_route_flows:,} packet flows ran on other links than"
                  " the other backends route them (one path per GPU pair); add `ecmp:"
                  " connection` under `network:` for identical routing (docs/ns3.md)")


def _fmt_bytes(n: int) -> str:
    """Bytes in decimal units: ``512 B``, ``3.4 MB``, ``1.2 TB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def job_args(sp: argparse.ArgumentParser, writes: str) -> None:
    """``--job`` and ``--placement`` (several jobs on one fabric, docs/whatif.md)."""
    sp.add_argument("--job", action="append", metavar="PLAN",
                    help="Another plan (job) or traffic file to run beside PLAN on PLAN's "
                         "network; repeat for more. Each job keeps its own device groups; "
                         f"{writes} (docs/whatif.md).")
    sp.add_argument("--placement", choices=("packed", "spread"), default="packed",
                    help="With --job: packed puts each job on consecutive servers; spread "
                         "deals servers round-robin so jobs share every leaf (default: "
                         "packed).")


def cmd_compare(args: argparse.Namespace) -> int:
    from . import api
    from .report.outputs import write_csv, write_run
    from .report.plot import plot_compare
    from .report.progress import ProgressBar

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if len(set(backends)) < 2:
        raise XsimError(f"--backends needs at least two different names (got {args.backends!r})")
    from ._outdir import check_output, output_dir
    from .backends.registry import backend_options, check_backend_options, get_backend

    if args.job:
        from .cli_jobs import compare_jobs_command

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
        plan, trace = _load_input(args.plan)
        if trace is None:
            bar.set_label("generating the trace")
            trace = api.generate(plan, coarsen=args.coarsen)
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
        _print_summary(cmp.metrics[name].summary)
    _print_run_info(cmp.run_info)
    ref = backends[0]
    for b in backends[1:]:
        t = cmp.pairs[(ref, b)].metrics.set_index("metric")
        rel = t.loc["iteration_time_ns", "rel_diff"]
        print(f"{b} vs {ref}: iteration time {100 * rel:+.2f}%")
    print(f"wrote {out}/: compare.csv, compare_ranks.csv, compare_runs.csv, compare.png, "
          + ", ".join(f"{b}/summary.json" for b in backends))
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from .backends.registry import backend_options, list_backends
    from .options import option_table

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


def cmd_sweep(args: argparse.Namespace) -> int:
    """``xsim sweep``: see docs/sweep.md."""
    from .sweep.cli import run_sweep_command

    if args.plan:
        check_input(args.plan, trace_ok=False)
    if args.output is None:
        args.output = default_output(args.plan or args.sweep, "sweep")
    return run_sweep_command(args)


def cmd_search(args: argparse.Namespace) -> int:
    """``xsim search``: see docs/search.md."""
    from .search.cli import run_search_command

    if args.output is None:
        args.output = default_output(args.spec, "search")
    return run_search_command(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``xsim calibrate``: fit a device type's efficiency to measured iteration times."""
    from .calibrate import fit
    from .plan import load_plan

    pairs = []
    for item in args.measured:
        path, sep, secs = item.rpartition("=")
        try:
            value = float(secs)
        except ValueError:
            value = float("nan")
        if not sep or not path or not value > 0:
            print(f"xsim: error: --measured: expected PLAN=SECONDS with SECONDS > 0 (got {item!r})",
                  file=sys.stderr)
            return 2
        pairs.append((load_plan(path), value))
    c = fit(pairs, args.device_type, args.field)
    print(f"{c.device_type}.{c.field}: {c.before:g} -> {c.value:g}"
          f" ({c.simulations} simulations{'; at the search bound' if c.at_bound else ''})")
    for (plan, secs), e0, e1 in zip(pairs, c.errors_before, c.errors_after, strict=True):
        print(f"  {plan.name}: measured {secs:g} s, error {100 * e0:+.1f}% -> {100 * e1:+.1f}%")
    print(f"plan override:\n  device_types:\n    {c.device_type}: {{{c.field}: {c.value:g}}}")
    return 0


# ---------------------------------------------------------------- parser


FORCE_HELP = ("Replace an earlier xsim output of another kind at the output path (never "
              "files xsim did not write; see docs/outputs.md).")


def progress_args(sp: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--quiet`` (one destination, ``progress``: True, False or None for
    "only when stderr is a terminal"), shared by every command that draws a progress bar."""
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="Draw the progress bar even when stderr is not a terminal.")
    g.add_argument("-q", "--quiet", dest="progress", action="store_false", default=None,
                   help="Draw no progress bar (by default it is drawn only when stderr is a "
                        "terminal).")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xsim",
        description="Simulate one training iteration of an LLM deployment plan on a "
                    "heterogeneous GPU cluster, on a choice of network simulators.",
    )
    from . import __version__

    p.add_argument("--version", action="version", version=f"xsim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_: str, fn) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=fn)
        return sp

    v = add("validate", "Check a plan and print its ranks, replicas and memory per stage.",
            cmd_validate)
    v.add_argument("plan", metavar="PLAN", help="The plan YAML file to check.")

    sc = add("schema", "Print (or write) the JSON Schema of plan files, generated from the "
                       "plan loader, for editors: docs/plan.md#editor-support.", cmd_schema)
    sc.add_argument("-o", "--output", default=None, metavar="FILE",
                    help="The file to write (default: print to standard output).")

    t = add("trace", "Generate the trace of a plan and write it to a directory.", cmd_trace)
    t.add_argument("plan", metavar="PLAN", help="The plan YAML file.")
    t.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="The trace directory to write (the plan is stored in it as plan.yaml; "
                        "default: out/<PLAN name>-trace).")
    t.add_argument("--force", action="store_true", help=FORCE_HELP)
    coarsen_arg(t)

    e = add("export", "Write the trace of a plan (or of a trace directory) in a peer "
                      "simulator's format: GOAL text for LogGOPSim/ATLAHS, or Chakra "
                      "execution traces (protobuf, one .et file per rank) for ASTRA-sim.",
            cmd_export)
    e.add_argument("plan", metavar="PLAN",
                   help="A plan YAML file, or a trace directory written by `xsim trace`.")
    e.add_argument("--format", choices=("goal", "chakra"), required=True,
                   help="The output format.")
    e.add_argument("-o", "--output", default=None, metavar="PATH",
                   help="The GOAL file to write, or the directory for the Chakra files "
                        "(default: out/<PLAN name>-export-goal.goal, resp. "
                        "out/<PLAN name>-export-chakra).")
    e.add_argument("--collectives", choices=("coll", "p2p"), default="coll",
                   help="Chakra only: 'coll' writes each ring collective as one "
                        "COMM_COLL_NODE per member rank (ASTRA-sim runs its own algorithm); "
                        "'p2p' writes every flow as a send/receive pair (our exact schedule). "
                        "Default: coll.")
    e.add_argument("--npus", type=int, default=None, metavar="N",
                   help="Chakra only: write files for N NPUs (at least the plan's ranks); the "
                        "ranks beyond the plan's get one idle node, for an ASTRA-sim topology "
                        "with more NPUs than the plan has GPUs.")
    e.add_argument("--astra-configs", action="store_true",
                   help="Chakra only: also write ASTRA-sim's analytical network.yml, "
                        "system.json and memory.json for the plan's cluster, with a warning "
                        "for what they cannot express (docs/trace.md).")
    e.add_argument("--force", action="store_true", help=FORCE_HELP)
    coarsen_arg(e)
    add_import_command(add)

    def run_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("plan", metavar="PLAN",
                        help="A plan YAML file, or a trace directory written by `xsim trace`.")
        sp.add_argument("-o", "--output", default=None, metavar="OUT",
                        help="The output directory (default: out/<PLAN name>-<command>).")
        sp.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="A backend option; repeat for several (values are read as YAML "
                             "scalars, e.g. seed=1).")
        progress_args(sp)
        sp.add_argument("--force", action="store_true", help=FORCE_HELP)
        coarsen_arg(sp)

    r = add("run", "Run one backend on a plan or trace and write the timeline, per-rank "
                   "metrics, summary and pictures.", cmd_run)
    run_args(r)
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

    c = add("compare", "Run several backends on the identical trace and topology and write "
                       "their metrics side by side.", cmd_compare)
    run_args(c)
    c.add_argument("--backends", default="flow,ns3", metavar="A,B",
                   help="Comma-separated backends; the first is the reference (default: "
                        "flow,ns3). Prefix an option with a backend name to aim it at that "
                        "backend only, e.g. --option ns3.transport=dctcp.")
    job_args(c, "writes OUT/compare_jobs.csv (each job's iteration time and slowdown on "
                "every backend) and each backend's jobs.csv, links.csv and jobs/ under "
                "OUT/<backend>/")

    from .sweep.cli import add_sweep_arguments

    add_sweep_arguments(add("sweep", "Run every combination of plan overrides (--set or a sweep "
                                     "file) on one backend and write one result row per "
                                     "variant to OUT/sweep.csv and OUT/sweep.parquet.",
                            cmd_sweep))

    from .search.cli import add_search_arguments

    add_search_arguments(add("search", "Search the plans a spec allows for the fastest (or "
                                       "cheapest) one on its cluster: branch and bound with "
                                       "an analytical lower bound, simulated on the flow "
                                       "backend; writes the best plans and every candidate.",
                             cmd_search))

    cal = add("calibrate", "Fit one compute constant of a device type (efficiency or "
                           "hbm_efficiency) to iteration times measured on your own cluster, "
                           "by bisection on the flow backend, and print the plan override.",
              cmd_calibrate)
    cal.add_argument("--measured", action="append", required=True, metavar="PLAN=SECONDS",
                     help="A plan you ran and its measured iteration time; repeat for several.")
    cal.add_argument("--device-type", required=True, metavar="NAME",
                     help="The device type whose constant is fitted (every plan must use it).")
    cal.add_argument("--field", default="efficiency", choices=("efficiency", "hbm_efficiency"),
                     help="The constant to fit (default: efficiency).")

    from .bench_collective import add_arguments, cmd_bench_collective

    add_arguments(add("bench-collective", "Sweep one collective over a device group from 1 KiB "
                                          "to 8 GiB as nccl-tests does (algbw and busbw "
                                          "columns, optional CSV and plot).",
                      cmd_bench_collective))

    b = add("backends", "List every installed backend with its availability and, if it "
                        "cannot run here, the reason.", cmd_backends)
    b.add_argument("--options", action="store_true",
                   help="Also list each backend's options: name, type or allowed values, "
                        "default and what it does.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``xsim``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    from ._proc import Terminated, install_sigterm_handler

    install_sigterm_handler()  # SIGTERM cleans temporary files like Ctrl-C does
    try:
        return int(args.func(args))
    except XsimError as exc:
        print(f"xsim: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `xsim validate plan.yaml | head`: the reader left
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - flushing at exit must not fail
        return 0
    except OSError as exc:  # a missing or unwritable file the user named
        print(f"xsim: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print("xsim: terminated" if terminated else "xsim: interrupted", file=sys.stderr)
        return 143 if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
