"""The trace: schema (in memory) and its directory form on disk."""

from .builder import TraceBuilder
from .io import SUPPORTED_SCHEMA_VERSIONS, read_trace, write_trace
from .schema import (
    COLLECTIVE_COLUMNS,
    COMM_PHASES,
    COMPUTE_PHASES,
    DEP_COLUMNS,
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    KINDS,
    LAYER_EMBEDDING,
    OP_COLUMNS,
    PHASE_INDEX,
    PHASES,
    SCHEMA_VERSION,
    Trace,
    empty_ops,
)
from .timeline import Timeline

__all__ = [
    "COLLECTIVE_COLUMNS",
    "COMM_PHASES",
    "COMPUTE_PHASES",
    "DEP_COLUMNS",
    "KINDS",
    "KIND_BARRIER",
    "KIND_COMPUTE",
    "KIND_FLOW",
    "LAYER_EMBEDDING",
    "OP_COLUMNS",
    "PHASES",
    "PHASE_INDEX",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "Trace",
    "TraceBuilder",
    "Timeline",
    "empty_ops",
    "read_trace",
    "write_trace",
]
