"""The ``xsim`` command (console script ``xsim = "xsim_adapters.cli:main"``).

:mod:`.main` builds the parser and dispatches; each command family has its module
(:mod:`.plan`: validate, schema; :mod:`.trace`: trace, export; :mod:`.run`: run, compare,
backends; :mod:`.jobs`: run and compare with ``--job``; :mod:`.sweep`; :mod:`.search`;
:mod:`.calibrate`); the flags and checks several commands share are in :mod:`.args`, the
number formatting in :mod:`.fmt`. A new command adds its module and one ``add(...)`` line in
:func:`.main.build_parser`.
"""

from .args import FORCE_HELP, common_args, progress_args
from .main import build_parser, main

__all__ = ["FORCE_HELP", "build_parser", "common_args", "main", "progress_args"]
