"""Achieved rates of one kernel on one device: a roofline with a shape-dependent GEMM rate.

A kernel's time is ``max(FLOPs / achieved FLOP/s, bytes / achieved HBM B/s)`` (the roofline;
docs/compute.md). For a GEMM the achieved FLOP/s follows from how cuBLAS-like kernels run
(NVIDIA Matrix Multiplication Background guide, DU-09799-001, "MMGUIDE"):

- the output M x N is cut into tiles of Tm x Tn; each thread block computes one tile over the
  whole K, one tile per SM at a time (§2.3, §3.2);
- *tile quantization*: a dimension not divisible by the tile still pays a whole tile (§3.1);
- *wave quantization*: tiles run in waves of ``sm_count``; a partial last wave costs a whole
  wave (§3.2; MLE training/performance/README.md: ``W = ceil(C / S)``, time ~ W);
- the largest tiles (256x128, 128x256) reach the best rate, smaller ones less (§2.3): a
  128x128 tile loads (Tm + Tn) / (Tm * Tn) operand bytes per FLOP, 4/3 of a 256x128 tile, so if
  the 256x128 tile is just compute-bound the 128x128 tile reaches 3/4 of its rate;
- when there are fewer tiles than SMs, K is split over up to ``sm_count / tiles`` blocks
  (split-K), each writing an fp32 partial output that a reduction reads back.

The library picks the tile and split that minimize time; so does this model. The best-shaped
GEMM reaches ``efficiency x peak`` (the device's measured maximum achievable matmul), so
``efficiency`` is the asymptote, and quantization only ever lowers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

# (Tm, Tn, relative rate): MMGUIDE §2.3's most efficient tiles and the next size down; the
# 128x128 rate is the operand-reuse ratio derived in the module docstring.
GEMM_TILES: tuple[tuple[int, int, float], ...] = (
    (256, 128, 1.0),
    (128, 256, 1.0),
    (128, 128, 0.75),
)
# Split-K keeps at least this many K elements per block (four 64-deep main-loop steps; MMGUIDE
# §2.3 tiles use 32-64 deep K steps); an assumption that only bounds the split.
SPLIT_K_MIN_K = 256
FP32_PARTIAL_BYTES = 4  # split-K partial outputs are fp32 (cuBLAS accumulates in fp32)


@dataclass(frozen=True)
class Rates:
    """What one device achieves for one training precision (all in SI units per second)."""

    gemm_flops: float  # FLOP/s of the best-shaped GEMM: peak x efficiency
    hbm_Bps: float  # bytes/s: hbm_GBps x hbm_efficiency
    sm_count: int  # 0: no tile/wave model (quantization factor 1)


def _options(m: int, n: int, k: int, batch: int, sm_count: int) -> list[tuple[float, int]]:
    """(fraction of the best rate, split-K factor) of every tile and split the model allows."""
    if sm_count <= 0:
        return [(1.0, 1)]
    out = []
    for tm, tn, rate in GEMM_TILES:
        tiles = batch * ceil(m / tm) * ceil(n / tn)
        max_split = max(1, min(sm_count // tiles, k // SPLIT_K_MIN_K)) if tiles < sm_count else 1
        for split in sorted({1, max_split}):
            waves = ceil(tiles * split / sm_count)
            # each block does 1/split of the K loop, so a wave is 1/split as long
            frac = batch * m * n / (waves / split * sm_count * tm * tn) * rate
            out.append((min(frac, 1.0), split))
    return out


def gemm_quantization(m: int, n: int, k: int, batch: int, sm_count: int) -> tuple[float, int]:
    """(fraction of the best rate reached, split-K factor) for ``batch`` GEMMs of M x N x K.

    The fraction is ``useful tile area / (waves x sm_count x tile area) x tile rate``, maximized
    over the tiles of :data:`GEMM_TILES` and split-K factors (1 when ``sm_count`` is 0).
    """
    return max(_options(m, n, k, batch, sm_count), key=lambda o: (o[0], -o[1]))


def gemm_seconds(m: int, n: int, k: int, batch: int, elem_bytes: float, rates: Rates,
                 extra_bytes: float = 0.0) -> float:
    """Roofline time (s) of ``batch`` GEMMs C[M,N] = A[M,K] @ B[K,N], without launch overhead.

    FLOPs ``2*M*N*K*batch`` at the shape's achieved rate; bytes: each operand read once and C
    written once, ``elem_bytes`` each, plus ``extra_bytes`` (e.g. an accumulated C read back),
    plus fp32 split-K partials written and read back. The tile and split with the least time
    win (as a GEMM library's heuristic would choose).
    """
    flops = 2.0 * m * n * k * batch
    nbytes = elem_bytes * batch * (m * k + k * n + m * n) + extra_bytes
    best = float("inf")
    for q, split in _options(m, n, k, batch, rates.sm_count):
        extra = 2 * FP32_PARTIAL_BYTES * batch * m * n * split if split > 1 else 0
        best = min(best, max(flops / (rates.gemm_flops * q), (nbytes + extra) / rates.hbm_Bps))
    return best


def tiled_quantization(blocks: int, sm_count: int) -> float:
    """Wave quantization of a kernel of ``blocks`` equal thread blocks: blocks / (waves * SMs)."""
    if sm_count <= 0 or blocks <= 0:
        return 1.0
    return blocks / (ceil(blocks / sm_count) * sm_count)


__all__ = [
    "FP32_PARTIAL_BYTES",
    "GEMM_TILES",
    "SPLIT_K_MIN_K",
    "Rates",
    "gemm_quantization",
    "gemm_seconds",
    "tiled_quantization",
]
