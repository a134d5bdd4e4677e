"""The ``xsim`` command: the parser (one entry per subcommand, its options defined by the
command family's module) and the dispatch.

Errors the project raises on purpose (XsimError) print as one ``xsim: error: ...`` line (or a
few) with exit status 1, never a traceback; ``xsim`` without a subcommand prints help, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import PlanWarning, XsimError
from .args import common_args
from .calibrate import add_calibrate_arguments, cmd_calibrate
from .interop import add_import_arguments, cmd_import
from .plan import add_schema_arguments, add_validate_arguments, cmd_schema, cmd_validate
from .run import (
    add_backends_arguments,
    add_compare_arguments,
    add_run_arguments,
    cmd_backends,
    cmd_compare,
    cmd_run,
)
from .trace import add_export_arguments, add_trace_arguments, cmd_export, cmd_trace

Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The ``xsim`` parser: every subcommand in the order ``xsim --help`` lists them."""
    p = argparse.ArgumentParser(
        prog="xsim",
        description="Simulate one training iteration of an LLM deployment plan on a "
                    "heterogeneous GPU cluster, on a choice of network simulators.",
    )
    from .._version import __version__

    p.add_argument("--version", action="version", version=f"xsim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_: str, fn: Command,
            arguments: Callable[[argparse.ArgumentParser], None] | None = None
            ) -> argparse.ArgumentParser:
        """One subcommand: its help, the function it runs, its options (``arguments``, or
        added by the caller to the returned parser)."""
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=fn)
        if arguments is not None:
            arguments(sp)
        return sp

    add("validate", "Check a plan and print its ranks, replicas and memory per stage.",
        cmd_validate, add_validate_arguments)
    add("schema", "Print (or write) the JSON Schema of plan files, generated from the "
                  "plan loader, for editors: docs/plan.md#editor-support.",
        cmd_schema, add_schema_arguments)
    add("trace", "Generate the trace of a plan and write it to a directory.", cmd_trace,
        add_trace_arguments)
    add("export", "Write the trace of a plan (or of a trace directory) in a peer "
                  "simulator's format: GOAL text for LogGOPSim/ATLAHS, or Chakra "
                  "execution traces (protobuf, one .et file per rank) for ASTRA-sim.",
        cmd_export, add_export_arguments)
    add("import", "Read a directory of Chakra execution traces (ASTRA-sim's workload input, one "
                  ".et file per rank) into a trace directory on a plan's cluster; run it with "
                  "`xsim run TRACE_DIR`.", cmd_import, add_import_arguments)
    add("run", "Run one backend on a plan or trace and write the timeline, per-rank "
               "metrics, summary and pictures.", cmd_run, add_run_arguments)
    add("compare", "Run several backends on the identical trace and topology and write "
                   "their metrics side by side.", cmd_compare, add_compare_arguments)

    from .sweep import add_sweep_arguments, cmd_sweep

    add("sweep", "Run every combination of plan overrides (--set or a sweep "
                 "file) on one backend and write one result row per "
                 "variant to OUT/sweep.csv and OUT/sweep.parquet.",
        cmd_sweep, add_sweep_arguments)

    from .search import add_search_arguments, cmd_search

    add("search", "Search the plans a spec allows for the fastest (or "
                  "cheapest) one on its cluster: branch and bound with "
                  "an analytical lower bound, simulated on the flow "
                  "backend; writes the best plans and every candidate.",
        cmd_search, add_search_arguments)
    add("calibrate", "Fit one compute constant of a device type (efficiency or "
                     "hbm_efficiency) to iteration times measured on your own cluster, "
                     "by bisection on the flow backend, and print the plan override.",
        cmd_calibrate, add_calibrate_arguments)

    from ..bench_collective import add_arguments, cmd_bench_collective

    def bench_arguments(sp: argparse.ArgumentParser) -> None:
        add_arguments(sp)
        common_args(sp, force=True, progress=False)  # -o DIR follows the output rule

    add("bench-collective", "Sweep one collective over a device group from 1 KiB to 8 "
                            "GiB as nccl-tests does (algbw and busbw columns, optional "
                            "CSV and plot).", cmd_bench_collective, bench_arguments)
    add("backends", "List every installed backend with its availability and, if it "
                    "cannot run here, the reason.", cmd_backends, add_backends_arguments)
    return p


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A PlanWarning as one ``xsim: warning:`` line; any other warning as Python shows it."""
    if issubclass(category, PlanWarning):
        print(f"xsim: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``xsim``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    from .._proc import Terminated, install_sigterm_handler

    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 prints, escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    install_sigterm_handler()  # SIGTERM cleans temporary files like Ctrl-C does
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
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

