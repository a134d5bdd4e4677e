"""``xsim trace`` and ``xsim export``: a plan's trace written as ours, or in a peer
simulator's format (GOAL, Chakra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import XsimError
from .args import check_input, coarsen_arg, common_args, default_output


def op_counts(trace: Any) -> str:
    """``N ops (a compute, b send, ...), E dependency edges`` of a trace."""
    from ..trace.schema import KINDS

    counts = trace.ops["kind"].value_counts()
    parts = [f"{int(counts.get(i, 0))} {k}" for i, k in enumerate(KINDS)]
    return f"{trace.num_ops} ops ({', '.join(parts)}), {len(trace.deps)} dependency edges"


def load_input(path: str) -> tuple[Any, Any]:
    """(plan, trace or None) from a plan file or a trace directory."""
    from .. import api

    p = Path(path)
    if p.is_dir():
        trace, plan = api.load_trace_and_plan(p)
        return plan, trace
    return api.load_plan(p), None


def generate_warned(plan: Any, coarsen: str) -> Any:
    """``api.generate``; a coarsening forced where it is not exact (``--coarsen on``) is said
    on stderr, as summary.json's ``coarsening.warning`` records it."""
    from .. import api

    trace = api.generate(plan, coarsen=coarsen)
    warning = (trace.manifest.get("coarsening") or {}).get("warning")
    if warning:
        print(f"xsim: warning: {warning}", file=sys.stderr)
    return trace


def add_trace_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim trace``."""
    sp.add_argument("plan", metavar="PLAN", help="The plan YAML file.")
    sp.add_argument("-o", "--output", default=None, metavar="DIR",
                    help="The trace directory to write (the plan is stored in it as plan.yaml; "
                         "default: out/<PLAN name>-trace).")
    common_args(sp, force=True, progress=False)
    coarsen_arg(sp)


def cmd_trace(args: argparse.Namespace) -> int:
    """``xsim trace``: generate a plan's trace and write it to a directory."""
    from .. import api
    from .._outdir import check_output

    check_input(args.plan, trace_ok=False)
    args.output = args.output or default_output(args.plan, "trace")
    check_output(args.output, "trace", args.force)  # before any work
    plan = api.load_plan(args.plan)
    trace = generate_warned(plan, args.coarsen)
    api.write_trace(trace, args.output, plan, force=args.force)
    print(f"wrote {op_counts(trace)} to {args.output}")
    return 0


def add_export_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim export``."""
    sp.add_argument("plan", metavar="PLAN",
                    help="A plan YAML file, or a trace directory written by `xsim trace`.")
    sp.add_argument("--format", choices=("goal", "chakra"), required=True,
                    help="The output format.")
    sp.add_argument("-o", "--output", default=None, metavar="PATH",
                    help="The GOAL file to write, or the directory for the Chakra files "
                         "(default: out/<PLAN name>-export-goal.goal, resp. "
                         "out/<PLAN name>-export-chakra).")
    sp.add_argument("--collectives", choices=("coll", "p2p"), default="coll",
                    help="Chakra only: 'coll' writes each ring collective as one "
                         "COMM_COLL_NODE per member rank (ASTRA-sim runs its own algorithm); "
                         "'p2p' writes every flow as a send/receive pair (our exact schedule). "
                         "Default: coll.")
    sp.add_argument("--npus", type=int, default=None, metavar="N",
                    help="Chakra only: write files for N NPUs (at least the plan's ranks); the "
                         "ranks beyond the plan's get one idle node, for an ASTRA-sim topology "
                         "with more NPUs than the plan has GPUs.")
    sp.add_argument("--astra-configs", action="store_true",
                    help="Chakra only: also write ASTRA-sim's analytical network.yml, "
                         "system.json and memory.json for the plan's cluster, with a warning "
                         "for what they cannot express (docs/trace.md).")
    common_args(sp, force=True, progress=False)
    coarsen_arg(sp)


def cmd_export(args: argparse.Namespace) -> int:
    """``xsim export``: the trace in a peer simulator's format."""
    from .._outdir import check_output, check_output_file, output_dir

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
        from ..trace.export_chakra import import_chakra

        import_chakra()  # a missing mlc-chakra is said before any work
        check_output(args.output, "chakra", args.force)
    plan, trace = load_input(args.plan)
    if trace is None:
        trace = generate_warned(plan, args.coarsen)
    if args.format == "goal":
        from ..trace.export_goal import export_goal

        path = export_goal(trace, args.output)
        print(f"wrote GOAL schedule for {trace.num_ranks} ranks to {path}")
    else:
        from ..trace.export_chakra import export_chakra

        with output_dir(args.output, "chakra", args.force) as tmp:
            paths = export_chakra(trace, tmp, collectives=args.collectives, npus=args.npus)
            extra = _write_astra_configs(plan, Path(tmp)) if args.astra_configs else ""
        print(f"wrote {len(paths)} Chakra ET files ({args.collectives}) and "
              f"comm_groups.json{extra} to {args.output}")
    return 0


def _write_astra_configs(plan: Any, directory: Path) -> str:
    """ASTRA-sim's network, system and memory files for ``plan`` into ``directory``; warns
    on stderr about what they cannot express. Returns the names written, for the message."""
    from ..interop.astra_configs import astra_configs

    files, warnings = astra_configs(plan)
    for name, text in files.items():
        (directory / name).write_text(text)
    for w in warnings:
        print(f"xsim: warning: ASTRA-sim configs: {w}", file=sys.stderr)
    return ", " + ", ".join(files)


def _is_goal_file(path: Path) -> bool:
    """Whether ``path`` looks like a GOAL schedule (first line ``num_ranks N``): the only
    existing file ``xsim export --format goal`` replaces."""
    import re

    try:  # check_output_file calls this on regular files only (a FIFO would block)
        with open(path, "rb") as fh:
            head = fh.readline(64)
    except OSError:
        return False
    return re.fullmatch(rb"num_ranks \d+\r?\n?", head) is not None
