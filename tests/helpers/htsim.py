"""Hand-built traces and topologies for the htsim backend tests (no generator needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from xsim_adapters.testing import handmade
from xsim_adapters.topology import Router, Topology
from xsim_adapters.trace.schema import Trace

from . import REPO

DRIVER_SRC = REPO / "plugins" / "htsim" / "driver"
DATA = REPO / "tests" / "data" / "htsim"


class TraceBuilder(handmade.TraceBuilder):
    """The htsim tests' call style: flows default to phase dp, edges added with ``dep``."""

    def compute(self, rank: int, duration_ns: int) -> int:  # type: ignore[override]
        return super().compute(rank, duration_ns)

    def flow(self, src: int, dst: int, nbytes: int, **kw: int) -> int:  # type: ignore[override]
        return super().flow(src, dst, nbytes, **kw)

    def barrier(self) -> int:  # type: ignore[override]
        return super().barrier()


def ring_allreduce(tb: TraceBuilder, ranks: list[int], size_bytes: int) -> tuple[int, int]:
    """The generator's ring all-reduce DAG between two barriers: (start, end) barrier ids."""
    start, end = tb.barrier(), tb.barrier()
    tb.dep(handmade.ring_all_reduce(tb, ranks, size_bytes, ready=start, collective=0), end)
    return start, end


def times_bytes(start_ps: np.ndarray, end_ps: np.ndarray) -> bytes:
    """A driver times file (binary, version 1: see xsim_htsim._output.read_times)."""
    return (b"XSIMHTO\0" + np.array([1, 0], "<u4").tobytes()
            + np.array([len(start_ps)], "<u8").tobytes()
            + np.asarray(start_ps).astype("<u8").tobytes()
            + np.asarray(end_ps).astype("<u8").tobytes())


def times_arrays(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(start_ps, end_ps) int64 of a driver times file."""
    n = int(np.frombuffer(data, "<u8", 1, 16)[0])
    return (np.frombuffer(data, "<u8", n, 24).astype(np.int64),
            np.frombuffer(data, "<u8", n, 24 + 8 * n).astype(np.int64))


def star(n: int, gbps: float | list[float], latency_ns: float = 500.0,
         tier: str | list[str] = "scale_up") -> Topology:
    """``n`` GPUs on one switch; GPU i's cable runs at gbps[i] both ways, tier tier[i]."""
    speeds = [float(gbps)] * n if np.isscalar(gbps) else [float(g) for g in gbps]
    tiers = [tier] * n if isinstance(tier, str) else list(tier)
    nodes = pd.DataFrame({
        "node_id": np.arange(n + 1, dtype=np.int32),
        "kind": ["gpu"] * n + ["nvswitch"],
        "name": [f"gpu{i}" for i in range(n)] + ["nvs0"],
        "rank": np.array(list(range(n)) + [-1], dtype=np.int32),
        "server": np.array([0] * (n + 1), dtype=np.int32),
    })
    src, dst, bw, tr = [], [], [], []
    for i in range(n):
        src += [i, n]
        dst += [n, i]
        bw += [speeds[i], speeds[i]]
        tr += [tiers[i], tiers[i]]
    links = pd.DataFrame({
        "link_id": np.arange(2 * n, dtype=np.int32),
        "src": np.array(src, dtype=np.int32),
        "dst": np.array(dst, dtype=np.int32),
        "gbps": np.array(bw, dtype=np.float64),
        "latency_ns": np.full(2 * n, latency_ns),
        "tier": tr,
    })
    topo = Topology(nodes=nodes, links=links, rank_node=np.arange(n, dtype=np.int32))
    topo._router = Router(nodes, links)
    return topo


def driver_path(tmp_factory) -> Path:
    """The driver to test: $XSIM_HTSIM_DRIVER, else built from our source against $HTSIM_DIR.

    Skips the test (saying how to enable it) when neither is available.
    """
    env = os.environ.get("XSIM_HTSIM_DRIVER")
    if env:
        return Path(env)
    htsim_dir = os.environ.get("HTSIM_DIR")
    if not htsim_dir:
        pytest.skip("needs htsim: set HTSIM_DIR to an htsim build holding sim/libhtsim.a and "
                    "the headers of sim/ (the test builds the driver), or set XSIM_HTSIM_DRIVER "
                    "to a built driver")
    out = tmp_factory.mktemp("htsim-driver")
    proc = subprocess.run(
        ["make", "-s", "-C", str(DRIVER_SRC), f"HTSIM_DIR={htsim_dir}", f"OUT={out}"],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the htsim driver failed:\n{proc.stdout}\n{proc.stderr}")
    return out / "xsim-htsim"


def golden_case() -> tuple[Trace, Topology]:
    """The small case behind the golden files: heterogeneous NICs, compute, a ring, odd flows.

    Rank 0 computes 10 us, then a 1 MiB ring all-reduce over ranks 0-3 (NICs 400, 400, 200,
    100 Gb/s), then every rank computes 5 us; a local flow (rank 1 to itself) and an empty flow
    hang off the end barrier. Ranks 0 and 1 hang on the switch by scale-up links, ranks 2 and 3
    by NICs, so the ring's 0 -> 1 flows are scale-up (fluid by default) and the rest packets.
    """
    tb = TraceBuilder(4)
    c0 = tb.compute(0, 10_000)
    start, end = ring_allreduce(tb, [0, 1, 2, 3], 1 << 20)
    tb.dep(c0, start)
    for r in range(4):
        tb.dep(end, tb.compute(r, 5_000))
    local = tb.flow(1, 1, 4096)
    empty = tb.flow(2, 3, 0)
    tb.dep(end, local)
    tb.dep(end, empty)
    return tb.build(), star(4, [400.0, 400.0, 200.0, 100.0], latency_ns=500.0,
                            tier=["scale_up", "scale_up", "nic", "nic"])
