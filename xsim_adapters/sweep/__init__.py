"""Sweeps: many variants of one plan, run locally or on Ray, one pandas frame back.

>>> from xsim_adapters.sweep import sweep
>>> df = sweep("workloads/homogeneous-h100.yaml",
...            {"training.micro_batch": [1, 2], "collectives.resharding": ["lcm", "direct"]},
...            jobs=2)
>>> df[["training.micro_batch", "collectives.resharding", "iteration_time_ns", "error"]]

Reference: ``docs/sweep.md``.
"""

from __future__ import annotations

from .api import run_spec, spec_for, sweep
from .expand import OverrideError, Variant, apply_override, expand, product
from .results import (
    ROWS_FILE,
    TIMING_COLUMNS,
    RowLog,
    build_frame,
    read_rows,
    variant_digest,
    write_sweep,
)
from .runner import (
    Executor,
    LocalExecutor,
    RayExecutor,
    make_executor,
    run_variant,
    summary_row,
)
from .spec import (
    SweepError,
    SweepSpec,
    format_path,
    load_sweep_file,
    parse_path,
    parse_set,
    parse_values,
    read_plan_data,
)

__all__ = [
    "TIMING_COLUMNS",
    "Executor",
    "LocalExecutor",
    "ROWS_FILE",
    "OverrideError",
    "RowLog",
    "RayExecutor",
    "SweepError",
    "SweepSpec",
    "Variant",
    "apply_override",
    "build_frame",
    "expand",
    "format_path",
    "load_sweep_file",
    "make_executor",
    "parse_path",
    "parse_set",
    "parse_values",
    "product",
    "read_plan_data",
    "read_rows",
    "run_spec",
    "run_variant",
    "spec_for",
    "summary_row",
    "sweep",
    "variant_digest",
    "write_sweep",
]
