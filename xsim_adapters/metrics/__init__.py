"""Metrics from a trace and a timeline (pandas). Definitions: ``docs/metrics.md``."""

from .bundle import Metrics, compute_metrics
from .compare import Comparison, compare, compare_metrics
from .intervals import union_blocks, union_length
from .ranks import BREAKDOWN_COLUMNS, RANK_COLUMNS, rank_metrics
from .straggler import straggler_by_rank, straggler_frame
from .summary import device_type_summary, replica_summary, summary
from .timeline import rank_table, timeline_frame

__all__ = [
    "BREAKDOWN_COLUMNS",
    "RANK_COLUMNS",
    "Comparison",
    "Metrics",
    "compare",
    "compare_metrics",
    "compute_metrics",
    "device_type_summary",
    "rank_metrics",
    "rank_table",
    "replica_summary",
    "straggler_by_rank",
    "straggler_frame",
    "summary",
    "timeline_frame",
    "union_blocks",
    "union_length",
]
