"""NVLS reduce-scatter / all-gather, NCCL's graph channels and per-channel caps, and the NVLS
pipeline fill of the achieved cost (workload/comm/nccl_achieved.py)."""

from __future__ import annotations

import numpy as np
import pytest

from xsim_adapters.bench_collective import bench, bench_plan, lowered_trace
from xsim_adapters.trace.schema import KIND_FLOW
from xsim_adapters.workload.comm.algorithms import Layout, lower
from xsim_adapters.workload.comm.nccl import (
    PER_CH_MAX_RING_LL128_GBPS,
    Fabric,
    choose,
    graph,
    nvls_link_GBps,
    tuner_table,
)
from xsim_adapters.workload.comm.nccl_achieved import nvls_chunk_bytes, nvls_fill_us

INF = float("inf")
H100_1 = Fabric(8, 1, 8, 450.0, INF, "nvlink", 90, nvls=True)
# 450 GB/s x 20.6/25 (topo.h SM90) x 0.85 (nvlsEfficiency) x 15/16 (NVLS channels 16)
H100_NVLS_LINK = 450.0 * 20.6 / 25 * 0.85 * 15 / 16


def test_graph_channels_follow_the_search_speed_arrays_and_duplication():
    # A100: 12 NVLinks x 20 GB/s = 240: 6 rings at 40 GB/s, duplicated to 12 x 20
    assert graph(Fabric(8, 1, 8, 300.0, INF, "nvlink", 80)) == (12, 20.0)
    # H100: 370.8 GB/s: 6 x 60 (sm90 array), duplicated to 12 x 30
    assert graph(H100_1) == (12, 30.0)
    # 2 x 8 A100 with 8 HDR NICs (bus min(240, 8 x 25) = 200): 8 channels of 24 GB/s, no dup
    assert graph(Fabric(16, 2, 8, 300.0, 25.0, "nvlink", 80, nics=8)) == (8, 24.0)


def test_per_channel_ll128_cap_binds_on_two_a100_servers():
    fab = Fabric(16, 2, 8, 300.0, 25.0, "nvlink", 80, nics=8)
    ll128 = next(c for c in tuner_table("all_reduce", 1 << 26, fab)
                 if c.algorithm == "ring" and c.protocol == "LL128")
    # min(0.92 x 200, 8 channels x perChMaxRingLL128Bw 20) = 160; algbw = 160 x 16 / 30
    assert PER_CH_MAX_RING_LL128_GBPS[80][1] == 20.0
    assert ll128.algbw_GBps == pytest.approx(160.0 * 16 / 30)


@pytest.mark.parametrize(("size", "chunk"), [
    (8 << 30, 131072), (1 << 30, 131072), (512 << 20, 65536), (64 << 20, 65536),
    (32 << 20, 32768), (8 << 20, 32768), (4 << 20, 16384), (1 << 10, 16384)])
def test_nvls_chunk_follows_enqueue_cc(size: int, chunk: int):
    # 16 channels x 8 heads: 128 KiB, 64 KiB below 1 GiB, 32 KiB below 64 MiB, 16 KiB below 8 MiB
    assert nvls_chunk_bytes(size, 16, 8) == chunk


def test_nvls_fill_is_two_loop_steps_for_an_all_reduce_and_one_for_rs_ag():
    link = nvls_link_GBps(H100_1)
    assert link == pytest.approx(H100_NVLS_LINK)
    s = 16 << 20
    step = 16 * 8 * 32768  # channels x heads x chunk
    assert nvls_fill_us("all_reduce", s, H100_1) == pytest.approx(2 * step / (link * 8 / 9 * 1e3))
    assert nvls_fill_us("reduce_scatter", s, H100_1) == pytest.approx(step / (link * 1e3))
    # a call smaller than one loop step: the step is the whole call
    assert nvls_fill_us("all_reduce", 1 << 20, H100_1) == pytest.approx(
        2 * (1 << 20) / (link * 8 / 9 * 1e3))
    # NVLSTree (several servers) is another kernel: no fill
    two = Fabric(16, 2, 8, 450.0, 50.0, "nvlink", 90, nvls=True, nics=8)
    assert nvls_fill_us("all_reduce", s, two) == 0.0


def test_nvls_delay_is_latency_plus_link_ratio_plus_fill():
    plan = bench_plan("H100-80GB", 1, 8)
    s = 16 << 20
    trace, _, label = lowered_trace(plan, "all_reduce", s, algorithm="nvls")
    assert label == "nvls:Simple"
    # trace schema 2: the delay is the start latency (duration_ns) of each member's first flows
    delay = trace.ops[trace.ops["kind"] == KIND_FLOW]["duration_ns"].max()
    flow_ns = s * 9 / 8 / 450.0  # S + S/m per link at the nominal 450 GB/s
    fill_ns = nvls_fill_us("all_reduce", s, H100_1) * 1e3
    want = 25e3 + flow_ns * (450.0 / H100_NVLS_LINK - 1) + fill_ns
    assert delay == pytest.approx(want, abs=1.0)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_nvls_rs_ag_every_gpu_sends_and_receives_the_buffer_once(kind: str):
    m, s = 8, 8 * 7 * 1000
    t = lower("nvls", kind, Layout((tuple(range(m)),)), s, 2, 4)
    sent = np.bincount(t.src, weights=t.nbytes, minlength=m)
    recv = np.bincount(t.dst, weights=t.nbytes, minlength=m)
    assert sent.tolist() == [s] * m and recv.tolist() == [s] * m
    assert np.all(t.src != t.dst) and t.size == m * (m - 1) and t.pred.size == 0
    with pytest.raises(ValueError, match="one server"):
        lower("nvls", kind, Layout((tuple(range(4)), tuple(range(4, 8)))), s, 2, 4)


def test_nvls_rs_time_on_the_flow_backend_matches_its_closed_form():
    s = 1 << 30
    row = bench(bench_plan("H100-80GB", 1, 8), "reduce_scatter", [s], algorithm="nvls").iloc[0]
    assert row["algorithm"] == "nvls:Simple"
    # 25 us NVLS latency + S at the NVLS link rate + one loop step of fill (2 stages)
    want_us = 25.0 + s / (H100_NVLS_LINK * 1e3) + nvls_fill_us("reduce_scatter", s, H100_1)
    assert row["time_us"] == pytest.approx(want_us, rel=0.01)


def test_nvls_rs_ag_in_the_tuner_and_where_auto_leaves_them():
    nv = next(c for c in tuner_table("reduce_scatter", 1 << 20, H100_1) if c.algorithm == "nvls")
    # intraBw x (ppn-1)/ppn, no conversion to an algorithm bandwidth (tuning.cc 2.30.7)
    assert nv.algbw_GBps == pytest.approx(H100_NVLS_LINK * 7 / 8)
    assert nv.latency_us == 25.0
    # NCCL's constants make LL, LL128 or Simple rings faster at every size on 8 x H100
    for k in range(10, 34, 2):
        assert choose("reduce_scatter", 1 << k, H100_1).algorithm == "ring"
    # across servers NVLS RS / AG needs CollNet: not offered
    two = Fabric(16, 2, 8, 450.0, 50.0, "nvlink", 90, nvls=True, nics=8)
    assert all(c.algorithm != "nvls" for c in tuner_table("all_gather", 1 << 20, two))
    row = bench(bench_plan("H100-80GB", 2, 8), "all_gather", [1 << 20], algorithm="nvls")
    assert row["algorithm"].iloc[0].startswith("ring:")
