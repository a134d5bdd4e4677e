"""Reports of a run: timeline picture, Perfetto JSON, comparison picture, progress bar."""

from .._atomic import write_atomic, write_text_atomic
from .perfetto import perfetto_trace, write_perfetto
from .plot import plot_compare, plot_timeline, timeline_rows
from .progress import ProgressBar, progress_enabled

__all__ = [
    "ProgressBar",
    "perfetto_trace",
    "plot_compare",
    "plot_timeline",
    "progress_enabled",
    "timeline_rows",
    "write_atomic",
    "write_perfetto",
    "write_text_atomic",
]
