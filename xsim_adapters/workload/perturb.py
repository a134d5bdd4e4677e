"""Apply a plan's ``perturb:`` section to a trace's compute kernels (what-if runs).

The generator models every kernel's duration from the device and the model; a perturbation then
scales the durations of compute ops on chosen ranks (``slow``) and multiplies each compute op by
a seeded, mean-one log-normal factor (``jitter``). Only ``duration_ns`` of compute ops changes:
bytes, dependencies and the FLOPs a kernel performs stay, so MFU falls as it would on a slow
GPU. See :mod:`xsim_adapters.plan.perturb` for the section and docs/whatif.md for the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..plan.perturb import PerturbSpec, slowdown_to_dict
from ..trace.schema import KIND_COMPUTE

# Second word of the jitter stream's seed, so jitter draws never coincide with another consumer
# of the plan seed (a fixed, arbitrary constant: changing it changes every jittered run).
JITTER_STREAM_ID = 0x6A17


def rank_factors(spec: PerturbSpec, num_ranks: int) -> np.ndarray:
    """float64 per global rank: the product of the whole-iteration ``slow`` factors that name
    it (1 if none; interval entries are the backends', see :func:`interval_slowdowns`)."""
    out = np.ones(num_ranks, dtype=np.float64)
    for s in spec.whole:
        out[np.asarray(s.ranks, dtype=np.int64)] *= s.factor
    return out


def jitter_factors(sigma: float, count: int, seed: int) -> np.ndarray:
    """``count`` mean-one log-normal factors ``exp(sigma z - sigma^2/2)``, z ~ N(0, 1) seeded."""
    if sigma <= 0:
        return np.ones(count, dtype=np.float64)
    z = np.random.default_rng([seed, JITTER_STREAM_ID]).standard_normal(count)
    return np.exp(sigma * z - 0.5 * sigma * sigma)


def apply_perturbations(ops: pd.DataFrame, spec: PerturbSpec, num_ranks: int, seed: int) -> dict:
    """Scale ``ops.duration_ns`` of compute ops in place; return what changed (for the manifest).

    Durations round to the nearest ns. The returned dict has ``extra_compute_ns`` per rank
    (perturbed minus modelled compute time, a list of ints) and the spec's parameters.
    """
    if not spec.active:
        return {}
    kind = ops["kind"].to_numpy()
    comp = np.flatnonzero(kind == KIND_COMPUTE)
    rank = ops["rank"].to_numpy()[comp]
    before = ops["duration_ns"].to_numpy()[comp].astype(np.int64)
    factor = rank_factors(spec, num_ranks)[rank] * jitter_factors(
        spec.jitter_sigma, len(comp), seed
    )
    after = np.rint(before * factor).astype(np.int64)
    dur = ops["duration_ns"].to_numpy().copy()
    dur[comp] = after
    ops["duration_ns"] = dur
    extra = np.bincount(rank, weights=(after - before).astype(np.float64), minlength=num_ranks)
    return {
        "slow": [slowdown_to_dict(s) for s in spec.slow],
        "jitter_sigma": spec.jitter_sigma,
        "extra_compute_ns": [int(round(x)) for x in extra],
    }


def interval_slowdowns(spec: PerturbSpec) -> list[dict]:
    """The manifest's ``compute_slowdowns`` (:mod:`xsim_adapters.trace.slowdowns`): one record
    per interval entry, ``{ranks, factor, from_ns, until_ns}`` (``until_ns`` None: to the end
    of the run). Empty when the plan has none (the manifest then has no such key)."""
    return [
        {"ranks": list(s.ranks), "factor": s.factor,
         "from_ns": (s.from_us or 0.0) * 1e3,
         "until_ns": None if s.until_us is None else s.until_us * 1e3}
        for s in spec.intervals
    ]
