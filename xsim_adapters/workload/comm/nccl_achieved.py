"""What NCCL's kernels achieve beyond the tuner's ``latency + bytes / bandwidth``: one home for
the constants of its kernel structure.

The tuner (:mod:`.nccl`) predicts a time per (algorithm, protocol) to *choose* one; the
kernel then runs with its own loop structure, which the tuner does not model. Where that
structure costs time the flows do not already pay, it is added to the collective's NCCL
delay here, from NCCL's own constants (no per-device or per-row constant):

**NVLS on one server: the pipeline fill of the chunk loop.** The NVLS all-reduce kernel
(``src/device/all_reduce.h``, ``RunWork...<ncclFuncAllReduce, NVLS, SIMPLE>``) splits each
channel's threads into three groups that form a pipeline over the channel's loop: *scatter*
(copy the user buffer into the NVLS buffers of every head), *reduce + multicast*
(``multimem.ld_reduce`` / ``multimem.st`` through the switch) and *gather* (copy the result
out). Each loop step moves ``nHeads x chunk`` bytes per channel; ``nChannels`` channels run in
parallel, so one step of the whole call moves ``nChannels x nHeads x chunk`` bytes. A pipeline of
D stages over L steps takes L + D - 1 step times, so beyond the bytes at the link rate (what the
flows take) it pays D - 1 step times, a step being the smaller of a full loop step and the whole
call. The chunk follows ``enqueue.cc`` (2.18.5, 2.20.5 and 2.30.7 alike): 128 KiB
(``nvlsChunkSize``), cut to 64 KiB below 64 x (channels x heads x chunk) bytes, to 32 KiB below
8 x and to 16 KiB below 2 x, so the fill is large exactly in the 1-128 MiB range where the
measured NVLS curves ramp slowly. Reduce-scatter and all-gather kernels have two groups
(``reduce_scatter.h``: scatter, reduce; ``all_gather.h``: gather, broadcast): D = 2.
NVLSTree (several servers) runs another kernel and chunk rule; it is not adjusted.
"""

from __future__ import annotations

from .nccl import NVLS_CHANNELS, AlgoCost, Fabric, arch, nvls_link_GBps

# enqueue.cc / nvls.cc: NVLS chunk (nvlsChunkSize) and its cuts by size: (bytes below
# factor x channels x heads x chunk -> chunk), applied in order. Bytes.
NVLS_CHUNK_BYTES = 131072
NVLS_CHUNK_CUTS = ((64, 65536), (8, 32768), (2, 16384))
# all_reduce.h / reduce_scatter.h / all_gather.h: thread groups pipelined over the NVLS loop
# on one server (scatter, reduce + multicast, gather; scatter, reduce; gather, broadcast).
NVLS_PIPELINE_STAGES = {"all_reduce": 3, "reduce_scatter": 2, "all_gather": 2}


def nvls_chunk_bytes(nbytes: int, channels: int, heads: int) -> int:
    """NCCL's NVLS chunk for a call of ``nbytes`` over ``channels`` x ``heads`` (enqueue.cc)."""
    chunk = NVLS_CHUNK_BYTES
    ops = channels * heads
    for factor, smaller in NVLS_CHUNK_CUTS:
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_fill_us(kind: str, nbytes: int, fab: Fabric) -> float:
    """The NVLS pipeline fill of ``kind`` of ``nbytes`` (the buffer per rank) on one server:
    (D - 1) step times at the rate the lowering's flows move the buffer, us (0 on several
    servers or for another kind)."""
    if fab.servers != 1 or kind not in NVLS_PIPELINE_STAGES or nbytes <= 0:
        return 0.0
    channels, heads = NVLS_CHANNELS[arch(fab.cc)], fab.ppn
    step = min(nbytes, channels * heads * nvls_chunk_bytes(nbytes, channels, heads))
    link = nvls_link_GBps(fab)
    # bytes of the buffer per unit time: an all-reduce puts S + S/m on each link (reduce then
    # multicast), a reduce-scatter or all-gather S (algorithms.py)
    rate = link * heads / (heads + 1) if kind == "all_reduce" else link
    return (NVLS_PIPELINE_STAGES[kind] - 1) * step / (rate * 1e3)


def extra_us(cost: AlgoCost, kind: str, nbytes: int, fab: Fabric) -> float:
    """Time the kernel of ``cost`` takes beyond its tuner latency and the flows, us."""
    if cost.algorithm == "nvls":
        return nvls_fill_us(kind, nbytes, fab)
    return 0.0
