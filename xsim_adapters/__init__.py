"""xsim-adapters: heterogeneity-aware simulation of distributed LLM training over pluggable
network simulators. The public API (see :mod:`xsim_adapters.api`)."""

from ._version import __version__
from .api import (
    BackendComparison,
    build_topology,
    compare_backends,
    generate,
    load_plan,
    metrics,
    read_trace,
    run,
    write_report,
    write_trace,
)
from .backends.registry import get_backend, list_backends
from .metrics.bundle import Metrics
from .metrics.compare import Comparison, compare
from .trace.timeline import Timeline

__all__ = [
    "BackendComparison",
    "Comparison",
    "Metrics",
    "Timeline",
    "__version__",
    "build_topology",
    "compare",
    "compare_backends",
    "generate",
    "get_backend",
    "list_backends",
    "load_plan",
    "metrics",
    "read_trace",
    "run",
    "write_report",
    "write_trace",
]
