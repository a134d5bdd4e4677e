"""The htsim backend: replays a trace with a project-owned C++ driver linked against htsim."""

from ._backend import HtsimBackend
from ._driver import find_driver
from ._input import InputInfo, write_input
from ._output import read_summary, read_times

__all__ = [
    "HtsimBackend",
    "InputInfo",
    "find_driver",
    "read_summary",
    "read_times",
    "write_input",
]
