"""The command-line pieces several ``xsim`` subcommands share, each defined once: the flags
(``-q``/``--quiet``, ``--progress``, ``--force``, ``--coarsen``, ``--job``/``--placement``,
``--backends``), the default output path and the check of a PLAN argument."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import XsimError

FORCE_HELP = ("Replace an earlier xsim output of another kind at the output path (never "
              "files xsim did not write; see docs/outputs.md).")

#: Outputs go to ``out/<input name>-<command>`` when ``-o`` is omitted (``/out/`` is git-ignored).
DEFAULT_OUT_ROOT = "out"
PLAN_SUFFIXES = (".yaml", ".yml")

COARSEN_HELP = (
    "Simulate one representative of each class of identical data-parallel replicas, with "
    "every DP ring flow kept, and only the first p + 8 micro-batches of a 1F1B pipeline of "
    "depth p, adding the left-out steady-state periods back in the metrics (docs/scale.md): "
    "auto (default) does each only for a plan whose trace would exceed 5 million ops (the "
    "replicas on a symmetric fabric, the micro-batches of one class of replicas), on "
    "wherever possible, off never. Ignored when PLAN is a trace directory."
)


def common_args(sp: argparse.ArgumentParser, *, force: bool, progress: bool) -> None:
    """The flags every subcommand shares, defined once: ``-q/--quiet`` (and ``--progress``
    where a progress bar is drawn; :func:`progress_args`), and ``--force`` where the command
    replaces an earlier xsim output (:data:`FORCE_HELP`)."""
    if progress:
        progress_args(sp)
    else:  # accepted everywhere, so one command line works for every subcommand
        sp.add_argument("-q", "--quiet", dest="progress", action="store_false", default=None,
                        help="Accepted for uniformity: this command draws no progress bar.")
    if force:
        sp.add_argument("--force", action="store_true", help=FORCE_HELP)


def progress_args(sp: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--quiet`` (one destination, ``progress``: True, False or None for
    "only when stderr is a terminal"), shared by every command that draws a progress bar."""
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="Draw the progress bar even when stderr is not a terminal.")
    g.add_argument("-q", "--quiet", dest="progress", action="store_false", default=None,
                   help="Draw no progress bar (by default it is drawn only when stderr is a "
                        "terminal).")


def coarsen_arg(sp: argparse.ArgumentParser) -> None:
    """The ``--coarsen`` option of every command that generates a trace."""
    sp.add_argument("--coarsen", choices=("auto", "on", "off"), default="auto",
                    help=COARSEN_HELP)


def job_args(sp: argparse.ArgumentParser, writes: str) -> None:
    """``--job`` and ``--placement`` (several jobs on one fabric, docs/whatif.md); ``writes``:
    what the command writes for them, said in the ``--job`` help."""
    sp.add_argument("--job", action="append", metavar="PLAN",
                    help="Another plan (job) or traffic file to run beside PLAN on PLAN's "
                         "network; repeat for more. Each job keeps its own device groups; "
                         f"{writes} (docs/whatif.md).")
    sp.add_argument("--placement", choices=("packed", "spread"), default="packed",
                    help="With --job: packed puts each job on consecutive servers; spread "
                         "deals servers round-robin so jobs share every leaf (default: "
                         "packed).")


def parse_backends(text: str) -> list[str]:
    """``--backends A,B``: the names, each once in the order given (a name given twice was run
    twice and then compared with itself: KeyError), at least two; XsimError otherwise."""
    names = list(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    if len(names) < 2:
        raise XsimError(f"--backends needs at least two different names (got {text[:200]!r})")
    return names


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
