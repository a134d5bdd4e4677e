"""``xsim import``: Chakra execution traces (ASTRA-sim's workload input) read into a trace
directory on a plan's cluster (docs/trace.md, "Importing Chakra ET")."""

from __future__ import annotations

import argparse

from .args import check_input, common_args, default_output
from .trace import op_counts


def add_import_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim import``."""
    sp.add_argument("et_dir", metavar="ET_DIR",
                    help="The directory of <prefix>.<rank>.et files (and comm_groups.json).")
    sp.add_argument("--plan", required=True, metavar="PLAN",
                    help="The plan whose device_groups, network and collectives settings the "
                         "ET runs on (rank r of the ET is rank r of the plan).")
    sp.add_argument("-o", "--output", default=None, metavar="DIR",
                    help="The trace directory to write (the plan is stored in it as plan.yaml; "
                         "default: out/<ET_DIR name>-import).")
    sp.add_argument("--prefix", default=None,
                    help="The file prefix (default: the one prefix the directory holds).")
    sp.add_argument("--comm-groups", default=None, metavar="FILE",
                    help="The process groups file (default: ET_DIR/comm_groups.json).")
    common_args(sp, force=True, progress=False)


def cmd_import(args: argparse.Namespace) -> int:
    """``xsim import``: a directory of Chakra ET files as a trace directory on a plan's
    cluster, runnable with ``xsim run TRACE_DIR``."""
    from .. import api
    from .._outdir import check_output
    from ..interop.chakra_import import import_chakra_et
    from ..trace.export_chakra import import_chakra

    import_chakra()  # a missing mlc-chakra is said before any work
    check_input(args.plan, trace_ok=False)
    args.output = args.output or default_output(args.et_dir, "import")
    check_output(args.output, "trace", args.force)
    plan = api.load_plan(args.plan)
    trace = import_chakra_et(args.et_dir, plan, prefix=args.prefix,
                             comm_groups=args.comm_groups)
    api.write_trace(trace, args.output, plan, force=args.force)
    print(f"wrote {op_counts(trace)} (imported from Chakra ET {args.et_dir}) to {args.output}")
    return 0
