"""Compare two runs of the same trace: metric table, per-rank and per-op differences.

Differences are always ``b - a`` and relative differences ``(b - a) / |a|`` (NaN when a is 0),
so with ``a`` the reference backend (e.g. ns3) a positive number means ``b`` is slower/larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..trace.schema import Trace
from ..trace.timeline import Timeline
from .bundle import Metrics, compute_metrics
from .ranks import SUMMABLE_COLUMNS

COMPARED_RANK_COLUMNS = ("iteration_time_ns", *SUMMABLE_COLUMNS, "bubble_fraction")


@dataclass
class Comparison:
    """``metrics``: columns metric, backend_a, value_a, backend_b, value_b, abs_diff, rel_diff.
    ``ranks``: per rank, ``<col>_a``, ``<col>_b``, ``<col>_diff`` for the time columns.
    ``ops``: per op, start/end in a and b and ``end_diff_ns``.
    """

    backend_a: str
    backend_b: str
    metrics: pd.DataFrame
    ranks: pd.DataFrame
    ops: pd.DataFrame


def _flat(summary: dict) -> dict[str, float]:
    """The numeric headline values of a summary as metric name -> value."""
    out: dict[str, float | None] = {}
    for k in ("iteration_time_ns", "tokens_per_s", "mfu"):
        out[k] = summary.get(k)
    for k, v in summary.get("rank_ns_sums", {}).items():
        out[f"rank_sum_{k}"] = v
    for k, v in summary.get("phases_rank_ns", {}).items():
        out[f"phase_{k}_ns"] = v
    for t, d in sorted(summary.get("device_types", {}).items()):
        out[f"mfu[{t}]"] = d.get("mfu")
        out[f"achieved_tflops_per_gpu[{t}]"] = d.get("achieved_tflops_per_gpu")
    return {k: (np.nan if v is None else float(v)) for k, v in out.items()}


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a != 0, (b - a) / np.abs(a), np.nan)


def compare_metrics(ma: Metrics, mb: Metrics) -> Comparison:
    """Compare two :class:`Metrics` of the same trace (same ops, same ranks)."""
    fa, fb = _flat(ma.summary), _flat(mb.summary)
    names = list(dict.fromkeys([*fa, *fb]))
    va = np.array([fa.get(k, np.nan) for k in names])
    vb = np.array([fb.get(k, np.nan) for k in names])
    table = pd.DataFrame({
        "metric": names, "backend_a": ma.backend, "value_a": va,
        "backend_b": mb.backend, "value_b": vb, "abs_diff": vb - va, "rel_diff": _rel(va, vb),
    })
    ra, rb = ma.ranks, mb.ranks
    ranks = ra[["rank", "group", "device_type", "replica", "stage"]].copy()
    for c in COMPARED_RANK_COLUMNS:
        a = ra[c].to_numpy(dtype=np.float64)
        b = rb[c].to_numpy(dtype=np.float64)
        ranks[f"{c}_a"] = a
        ranks[f"{c}_b"] = b
        ranks[f"{c}_diff"] = b - a
    ta, tb = ma.timeline, mb.timeline
    ops = pd.DataFrame({
        "op_id": ta["op_id"].to_numpy(),
        "kind": ta["kind_name"].to_numpy(),
        "phase": ta["phase_name"].to_numpy(),
        "start_a": ta["start_ns"].to_numpy(), "end_a": ta["end_ns"].to_numpy(),
        "start_b": tb["start_ns"].to_numpy(), "end_b": tb["end_ns"].to_numpy(),
    })
    ops["end_diff_ns"] = ops["end_b"] - ops["end_a"]
    ops["elapsed_diff_ns"] = (ops["end_b"] - ops["start_b"]) - (ops["end_a"] - ops["start_a"])
    return Comparison(ma.backend, mb.backend, table, ranks, ops)


def compare(trace: Trace, tl_a: Timeline, tl_b: Timeline) -> Comparison:
    """Compare two backends' timelines of ``trace`` (per-op join on op_id)."""
    from .._argcheck import check_arg

    check_arg("compare", "trace", trace, Trace, "a Trace (xs.generate(plan))")
    for name, tl in (("tl_a", tl_a), ("tl_b", tl_b)):
        check_arg("compare", name, tl, Timeline, "a Timeline (xs.run(...))")
    return compare_metrics(compute_metrics(trace, tl_a), compute_metrics(trace, tl_b))


#: Columns of :func:`run_info_frame`, in order.
RUN_INFO_COLUMNS = ("backend", "packet_flows", "fluid_flows", "packet_bytes", "fluid_bytes",
                    "fluid_bytes_pct", "startup_s", "replay_s", "wall_s", "off_route_flows")


def run_info_frame(timelines: dict[str, Timeline]) -> pd.DataFrame:
    """One row per backend: what it simulated as packets vs timed by a fluid model (flows and
    bytes, and the fluid share of the bytes in %) and its start-up time (import, network build,
    DAG load; s) apart from its replay time (s) and the whole run (``wall_s``); from each
    timeline's run info (the backend contract, :mod:`xsim_adapters.backends.base`); and
    ``off_route_flows``, the flows a backend carried on other links than
    ``Topology.ecmp_keys`` routes them (its optional ``off_route_flows`` stat, else 0: ns-3
    under ``network.ecmp: flow`` keeps a GPU pair on one path)."""
    rows = []
    for name, tl in timelines.items():
        st = tl.stats
        pb, fb = int(st["packet_bytes"]), int(st["fluid_bytes"])
        rows.append({
            "backend": name,
            "packet_flows": int(st["packet_flows"]), "fluid_flows": int(st["fluid_flows"]),
            "packet_bytes": pb, "fluid_bytes": fb,
            "fluid_bytes_pct": 100.0 * fb / (pb + fb) if pb + fb else float("nan"),
            "startup_s": float(st["startup_s"]), "replay_s": float(st["replay_s"]),
            "wall_s": float(st["wall_s"]), "off_route_flows": int(st.get("off_route_flows", 0)),
        })
    return pd.DataFrame(rows, columns=list(RUN_INFO_COLUMNS))
