"""Ring collectives: bytes per rank, step dependencies, chunked pieces, ring orders, channels."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gen import A100, H100, make_plan

from xsim_adapters.workload.comm.collectives import num_steps, ring_flows
from xsim_adapters.workload.comm.rings import (
    RankInfo,
    channel_orders,
    ring_bottleneck_GBps,
    ring_order,
    split_bytes,
)


def _one(n: int, size: int, kind: str, gran: str = "step", chunks: int = 4, channels: int = 1):
    perm = np.array(
        [[list(range(n)) if c % 2 == 0 else list(range(n))[::-1] for c in range(channels)]]
    )
    sizes = np.array([split_bytes(size, [1.0] * channels)])
    return ring_flows(np.arange(100, 100 + n)[None], perm, sizes, kind, gran, chunks)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("gran", ["step", "chunked"])
def test_all_reduce_each_rank_sends_2_n_minus_1_over_n_of_s(n: int, gran: str) -> None:
    size = 8 * 3 * 7 * 1024  # divisible by every n and chunk count used here
    rf = _one(n, size, "all_reduce", gran)
    sent = np.bincount(rf.src - 100, weights=rf.nbytes, minlength=n)
    recv = np.bincount(rf.dst - 100, weights=rf.nbytes, minlength=n)
    assert sent.tolist() == [2 * (n - 1) * size // n] * n
    assert recv.tolist() == sent.tolist()
    assert rf.size == num_steps("all_reduce", n, gran, 4) * n
    assert np.all(rf.dst - 100 == (rf.src - 100 + 1) % n)  # only to the ring successor


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_send_n_minus_1_over_n(kind: str) -> None:
    n, size = 4, 4096
    rf = _one(n, size, kind)
    assert rf.size == (n - 1) * n
    sent = np.bincount(rf.src - 100, weights=rf.nbytes, minlength=n)
    assert sent.tolist() == [(n - 1) * size // n] * n


def test_step_segments_follow_the_ring_algorithm_with_uneven_sizes() -> None:
    # S = 10 over n = 4: segments [2, 3, 2, 3]. In the reduce-scatter rank p sends every segment
    # but (p+1); in the all-gather every segment but (p+2).
    n, size = 4, 10
    rf = _one(n, size, "all_reduce")
    seg = np.diff([size * i // n for i in range(n + 1)])
    sent = np.bincount(rf.src - 100, weights=rf.nbytes, minlength=n)
    want = [2 * size - seg[(p + 1) % n] - seg[(p + 2) % n] for p in range(n)]
    assert sent.tolist() == want


def test_step_dependencies_are_predecessor_data_and_own_previous_send() -> None:
    n = 4
    rf = _one(n, 4096, "all_reduce")
    k_steps = 2 * (n - 1)
    ids = np.arange(rf.size).reshape(k_steps, n)
    preds: dict[int, set[int]] = {}
    for p_, s_ in zip(rf.pred, rf.succ, strict=True):
        preds.setdefault(int(s_), set()).add(int(p_))
    for k in range(1, k_steps):
        for p in range(n):
            assert preds[int(ids[k, p])] == {int(ids[k - 1, (p - 1) % n]), int(ids[k - 1, p])}
    assert all(int(i) not in preds for i in ids[0])
    # tails of member m: last flow into m and last flow out of m
    assert rf.tails[0, 0, 2].tolist() == [int(ids[-1, 1]), int(ids[-1, 2])]
    assert rf.start[0, 0].tolist() == ids[0].tolist()


def test_channels_split_bytes_and_reverse_the_ring() -> None:
    n, size = 4, 4000
    rf = _one(n, size, "all_reduce", channels=2)
    assert set(rf.channel.tolist()) == {0, 1}
    fwd, rev = rf.channel == 0, rf.channel == 1
    assert np.all(rf.dst[fwd] - 100 == (rf.src[fwd] - 100 + 1) % n)
    assert np.all(rf.dst[rev] - 100 == (rf.src[rev] - 100 - 1) % n)
    total = np.bincount(rf.src - 100, weights=rf.nbytes, minlength=n)
    assert total.tolist() == [2 * (n - 1) * size // n] * n


def test_single_rank_collective_has_no_flows() -> None:
    rf = _one(1, 4096, "all_reduce")
    assert rf.size == 0 and len(rf.pred) == 0


def test_hetero_aware_order_keeps_servers_contiguous_and_speed_classes_together() -> None:
    # Servers alternate A100 (200G NICs) and H100 (400G) groups: a100 on servers 0-1, h100 2-3.
    plan = make_plan(
        [[("h100", 0, 1, 0, 4)]],
        groups=[("a100", A100, 2, 2), ("h100", H100, 2, 2)],
    )
    info = RankInfo(plan)
    ranks = [6, 0, 4, 2, 7, 1, 5, 3]  # one rank per... all 8, scrambled
    order = ring_order(info, ranks, "hetero_aware")
    assert order == [0, 1, 2, 3, 4, 5, 6, 7]
    speeds = [info.nic_gbps[r] for r in order]
    crossings = sum(speeds[i] != speeds[(i + 1) % 8] for i in range(8))
    assert crossings == 2
    servers = [info.server[r] for r in order]
    assert sum(servers[i] != servers[(i + 1) % 8] for i in range(8)) == 4  # once per server
    assert ring_order(info, [3, 1, 2], "natural") == [1, 2, 3]
    # a mixed DP ring: one rank per server, interleaved speeds -> slow ones first, then fast
    mixed = ring_order(info, [4, 0, 6, 2], "hetero_aware")
    assert [info.nic_gbps[r] for r in mixed] == [200.0, 200.0, 400.0, 400.0]
    assert ring_bottleneck_GBps(info, mixed) == 25.0  # 200 Gb/s NIC = 25 GB/s
    assert ring_bottleneck_GBps(info, [0, 1]) == 300.0  # same server: A100 NVLink


def test_channel_orders_and_proportional_split() -> None:
    plan = make_plan([[("h100", 0, 1, 0, 4)]])
    info = RankInfo(plan)
    orders = channel_orders(info, list(range(16)), 3)
    # channel 0: server 0 as is, server 1 walked down from the rail it was left from (local 7)
    assert orders[0] == list(range(8)) + list(range(15, 7, -1))
    assert orders[1] == orders[0][::-1]
    assert orders[2][:2] == [1, 2]  # the next channel pair starts server 0 one GPU later


@pytest.mark.parametrize("servers", [2, 3, 4])
def test_channels_leave_every_server_through_every_nic_on_one_rail(servers: int) -> None:
    """16 channels over servers x 8 GPUs: each NIC sends for exactly two channels (one per
    direction); every hop between servers stays on one rail except at most the wrap-around."""
    plan = make_plan([[("h100", 0, 8, 0, 4)]], groups=[("h100", H100, servers, 8)])
    info = RankInfo(plan)
    n = 8 * servers
    orders = channel_orders(info, list(range(n)), 16)
    sends = np.zeros(n, dtype=int)
    off_rail = 0
    for o in orders:
        assert sorted(o) == list(range(n))
        hops = [(o[i], o[(i + 1) % n]) for i in range(n)]
        cross = [(a, b) for a, b in hops if info.server[a] != info.server[b]]
        assert len(cross) == servers  # the ring leaves each server once
        for a, b in cross:
            sends[a] += 1
            off_rail += info.local[a] != info.local[b]
    assert sends.tolist() == [2] * n
    # odd servers are walked downwards: an even server count closes the ring on a rail
    assert off_rail == (0 if servers % 2 == 0 else 16)


def test_single_channel_ring_uses_one_rail_between_servers() -> None:
    info = RankInfo(make_plan([[("h100", 0, 8, 0, 4)]]))
    (order,) = channel_orders(info, list(range(16)), 1)
    cross = [(order[i], order[(i + 1) % 16]) for i in range(16)
             if info.server[order[i]] != info.server[order[(i + 1) % 16]]]
    assert [(int(info.local[a]), int(info.local[b])) for a, b in cross] == [(7, 7), (0, 0)]
    assert split_bytes(10, [1.0, 3.0]) == [2, 8]
    assert sum(split_bytes(1001, [1.0, 1.0, 1.0])) == 1001


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [3, 5, 24])
def test_chunked_moves_every_byte_when_n_does_not_divide_s(kind: str, n: int) -> None:
    s = 1_000_003  # prime: no n > 1 divides it
    factor = 2 if kind == "all_reduce" else 1
    step = _one(n, s, kind, "step")
    chunked = _one(n, s, kind, "chunked", chunks=3)
    assert int(chunked.nbytes.sum()) == factor * (n - 1) * s
    # each rank sends exactly what it sends step by step
    per_rank = [np.bincount(rf.src - 100, weights=rf.nbytes, minlength=n) for rf in (step, chunked)]
    assert per_rank[0].tolist() == per_rank[1].tolist()
