"""The compiled engine of the flow backend: :mod:`xsim_flowcore` (C++17 through nanobind).

It runs the same model as :mod:`.executor` (the reference) with the same floating-point
operations, so the two produce the same timeline; tests/test_flow_native.py checks that on
random DAGs and on every shipped plan. The package is a separate distribution
(``plugins/flowcore``) so the core stays pure Python; when it is missing, the backend falls
back to the Python executor, and ``engine: native`` is an error that says how to install it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backend_api import BackendError
from .executor import FlowProblem, FlowResult, Progress, check_deps, stuck_message

#: The ``xsim_flowcore.INTERFACE_VERSION`` this adapter speaks.
#: 2: a flow's duration_ns is its start latency (trace schema 2), or slowdowns and reroutes;
#: 3: both.
INTERFACE_VERSION = 3
INSTALL_HINT = "python -m pip install ./plugins/flowcore (from the xsim-adapters checkout)"


def native_status() -> tuple[bool, str]:
    """(True, version) if the compiled core can be used here, else (False, why not)."""
    try:
        import xsim_flowcore
    except ImportError as e:
        return False, f"the compiled flow core xsim_flowcore is not installed ({e}): {INSTALL_HINT}"
    got = getattr(xsim_flowcore, "INTERFACE_VERSION", None)
    if got != INTERFACE_VERSION:
        return False, (f"xsim_flowcore speaks interface {got}, this xsim-adapters needs"
                       f" {INTERFACE_VERSION}: reinstall it with {INSTALL_HINT}")
    return True, str(getattr(xsim_flowcore, "__version__", "unknown"))


def run_flows_native(problem: FlowProblem, progress: Progress | None = None) -> FlowResult:
    """Execute the DAG in the compiled core; same result and errors as :func:`run_flows`.

    Raises BackendError if the core is missing (with the install command) or ops get stuck.
    """
    ok, why = native_status()
    if not ok:
        raise BackendError(f"flow: engine native: {why}")
    import xsim_flowcore

    check_deps(problem)
    p = problem
    pred, succ = p.pred, p.succ
    if not (pred.dtype == succ.dtype and pred.dtype in (np.int32, np.int64)):
        pred, succ = pred.astype(np.int64), succ.astype(np.int64)
    try:
        out: dict[str, Any] = xsim_flowcore.run(
            _c(p.kind, np.int8), _c(p.duration_ns, np.int64), _c(p.nbytes, np.int64),
            np.ascontiguousarray(pred), np.ascontiguousarray(succ),
            _c(p.path_offsets, np.int64), _c(p.path_links, np.int32),
            _c(p.link_gbps, np.float64), _c(p.link_latency_ns, np.float64),
            _c(p.events_at_ns, np.float64), _c(p.events_link, np.int64),
            _c(p.events_factor, np.float64), progress,
            **_whatif_arrays(p),
        )
    except ValueError as e:  # malformed input, in the core's own words
        raise BackendError(str(e)) from None
    n = len(p.kind)
    done = int(out["done"])
    if progress is not None:
        progress(done, n)
    if done < n:
        active = out["active_ops"].tolist()
        det = out["active_detours"].tolist()
        ro = p.reroute_offsets
        flow_links = {
            f: (p.path_links[p.path_offsets[f]:p.path_offsets[f + 1]] if d < 0
                else p.reroute_links[ro[d]:ro[d + 1]]).tolist()
            for f, d in zip(active, det, strict=True)
        }
        rate = dict(zip(active, out["active_rates"].tolist(), strict=True))
        raise BackendError(
            stuck_message(p, out["end_ns"], flow_links, rate, out["capacity"].tolist(), done)
        )
    wall = float(out["wall_s"])
    events = int(out["events"])
    return FlowResult(
        start_ns=out["start_ns"],
        end_ns=out["end_ns"],
        stats={
            "wall_s": wall,
            "cpu_s": float(out["cpu_s"]),
            "events": events,
            "events_per_s": events / wall if wall > 0 else 0.0,
            "max_active_flows": int(out["max_active_flows"]),
            "rate_recomputations": int(out["rate_recomputations"]),
            "reroutes": int(out["reroutes"]),
        },
    )


def _whatif_arrays(p: FlowProblem) -> dict[str, np.ndarray]:
    """The optional what-if arguments of ``xsim_flowcore.run``: interval slowdowns (with the
    per-op rank they need) and detours, only when the problem has them."""
    out: dict[str, np.ndarray] = {}
    if len(p.slow_offsets) > 1:
        out.update(rank=_c(p.rank, np.int32), slow_offsets=_c(p.slow_offsets, np.int64),
                   slow_lo_ns=_c(p.slow_lo_ns, np.float64),
                   slow_hi_ns=_c(p.slow_hi_ns, np.float64),
                   slow_factor=_c(p.slow_factor, np.float64))
    if len(p.reroute_key):
        out.update(reroute_key=_c(p.reroute_key, np.int64),
                   reroute_offsets=_c(p.reroute_offsets, np.int64),
                   reroute_links=_c(p.reroute_links, np.int32))
    return out


def _c(a: np.ndarray, dtype: type) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=dtype)
