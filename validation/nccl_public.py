"""Public nccl-tests figures beyond the Azure curves: single points with known hardware.

``validation/data/nccl_public_points.csv``: one row per published figure (collective, device
preset, servers x GPUs, the algorithm the figure was taken with, size, busbw in GB/s) and its
provenance (an NCCL maintainer's statement or a reported nccl-tests run). Several figures are
approximate ("about 370 GB/s"); they are compared as stated. Predicted by ``xsim
bench-collective`` on the flow backend with the row's algorithm (``auto``: the tuner's choice,
as an unforced nccl-tests run), nothing fitted.

Also a source of the validation suite (``python -m validation``: SOURCE ``nccl-public``).
"""

from __future__ import annotations

import functools

import pandas as pd

from xsim_adapters.bench_collective import bench, bench_plan

try:  # as part of the validation package (python -m validation) or as a script
    from validation.framework import DATA, Case
except ImportError:  # pragma: no cover - run as a plain script from validation/
    from framework import DATA, Case  # type: ignore[no-redef]

SOURCE = "nccl-public"
POINTS = DATA / "nccl_public_points.csv"


def predict(kind: str, device: str, servers: int, gpus: int, algorithm: str,
            size: int) -> float:
    """Simulated busbw (GB/s) of one point."""
    plan = bench_plan(device, servers, gpus)
    return float(bench(plan, kind, [size], algorithm=algorithm)["busbw"].iloc[0])


def cases() -> list[Case]:
    """One case per published point (busbw, GB/s); the single-server ones are fast."""
    out = []
    for r in pd.read_csv(POINTS).itertuples():
        out.append(Case(
            source=SOURCE, label=str(r.label), metric="busbw_GBps",
            measured=float(r.busbw_GBps),
            predict=functools.partial(predict, str(r.kind), str(r.device), int(r.servers),
                                      int(r.gpus_per_server), str(r.algorithm),
                                      int(r.size_bytes)),
            fast=False, notes=f"{r.algorithm}; {r.provenance}",
        ))
    return out
