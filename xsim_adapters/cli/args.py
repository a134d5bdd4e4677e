"""The command-line flags every ``xsim`` subcommand shares, defined once (``-q``/``--quiet``,
``--progress``, ``--force``); :mod:`.cli`, :mod:`.sweep.cli` and :mod:`.search.cli` add them
through :func:`common_args` rather than each spelling them out."""

from __future__ import annotations

import argparse

FORCE_HELP = ("Replace an earlier xsim output of another kind at the output path (never "
              "files xsim did not write; see docs/outputs.md).")


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
