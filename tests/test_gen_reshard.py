"""Resharding between TP groups: every byte moves from an owner to every rank that needs it."""

from __future__ import annotations

import pytest

from xsim_adapters.workload.comm.reshard import (
    DEST,
    SOURCE,
    algorithm_label,
    needed_range,
    padded_size,
    reshard_transfers,
    shard_bounds,
)

PAIRS = [(8, 4), (6, 4), (4, 6), (3, 2), (2, 2)]
METHODS = ["lcm", "gather_p2p_scatter", "direct"]


def _covered(intervals: list[tuple[int, int]], lo: int, hi: int) -> bool:
    pos = lo
    for a, b in sorted(intervals):
        if a > pos:
            break
        pos = max(pos, b)
    return pos >= hi


def _simulate(a: int, b: int, size: int, method: str) -> dict[tuple[int, int], list]:
    """Replay the transfers phase by phase over byte ranges; every piece must come from a
    rank that holds it at that time."""
    trs = reshard_transfers(a, b, size, method)
    total = size + (padded_size(a, b, size)[1] if method == "lcm" and a != b else 0)
    if method == "lcm" and a != b:
        big_l = padded_size(a, b, size)[0]
        cuts = [i * (big_l // a) * (total // big_l) for i in range(a + 1)]
    else:
        cuts = shard_bounds(size, a)
    held = {(SOURCE, i): [(cuts[i], cuts[i + 1])] for i in range(a)}
    held.update({(DEST, j): [] for j in range(b)})
    for phase in sorted({t.phase_step for t in trs}):
        arriving = []
        for t in trs:
            if t.phase_step != phase:
                continue
            assert t.bytes > 0
            assert (t.src_side, t.src_idx) != (t.dst_side, t.dst_idx), "flow to itself"
            rng = (t.offset, t.offset + t.bytes)
            assert _covered(held[(t.src_side, t.src_idx)], *rng), (t, held)
            arriving.append(((t.dst_side, t.dst_idx), rng))
        for key, rng in arriving:
            held[key].append(rng)
    return held


@pytest.mark.parametrize("a,b", PAIRS)
@pytest.mark.parametrize("method", METHODS)
def test_every_byte_reaches_every_rank_that_needs_it(a: int, b: int, method: str) -> None:
    for size in (12 * 4096, 12 * 4096 + 5):  # divisible by every L here, and not
        held = _simulate(a, b, size, method)
        for j in range(b):
            lo, hi = needed_range(b, j, size, method, a)
            assert hi - lo > 0
            assert _covered(held[(DEST, j)], lo, hi), (method, a, b, j, held[(DEST, j)])
        # the destination stage as a whole ends up with the whole activation
        assert _covered([r for j in range(b) for r in held[(DEST, j)]], 0, size)


@pytest.mark.parametrize("a,b", PAIRS)
def test_lcm_and_direct_move_exactly_the_activation_once(a: int, b: int) -> None:
    size = 12 * 4096
    for method in ("lcm", "direct"):
        trs = reshard_transfers(a, b, size, method)
        assert sum(t.bytes for t in trs) == size
        pairs = [(t.src_idx, t.dst_idx) for t in trs]
        assert len(pairs) == len(set(pairs))  # chunks between one pair are batched
        assert all(t.phase_step == 0 and t.src_side == SOURCE and t.dst_side == DEST for t in trs)


def test_lcm_chunks_and_padding() -> None:
    # (6, 4): L = 12 chunks; source i owns chunks [2i, 2i+2), destination j needs [3j, 3j+3).
    trs = reshard_transfers(6, 4, 1200, "lcm")
    assert [(t.src_idx, t.dst_idx, t.bytes) for t in trs] == [
        (0, 0, 200),
        (1, 0, 100),
        (1, 1, 100),
        (2, 1, 200),
        (3, 2, 200),
        (4, 2, 100),
        (4, 3, 100),
        (5, 3, 200),
    ]
    assert padded_size(6, 4, 1201) == (12, 11)
    assert algorithm_label(6, 4, 1201, "lcm") == "lcm(L=12,pad=11)"
    assert sum(t.bytes for t in reshard_transfers(6, 4, 1201, "lcm")) == 1212


def test_direct_uses_exact_cut_points_without_padding() -> None:
    trs = reshard_transfers(3, 2, 10, "direct")
    # sources [0,3) [3,6) [6,10); destinations [0,5) [5,10)
    assert [(t.src_idx, t.dst_idx, t.offset, t.bytes) for t in trs] == [
        (0, 0, 0, 3),
        (1, 0, 3, 2),
        (1, 1, 5, 1),
        (2, 1, 6, 4),
    ]


def test_gather_p2p_scatter_phases() -> None:
    # (8, 4): g = 4 leaders; each gathers 1 shard, sends S/4, and the destination keeps it all.
    trs = reshard_transfers(8, 4, 800, "gather_p2p_scatter")
    assert sorted({t.phase_step for t in trs}) == [0, 1]
    gathers = [t for t in trs if t.phase_step == 0]
    assert [(t.src_idx, t.dst_idx, t.bytes) for t in gathers] == [
        (1, 0, 100),
        (3, 2, 100),
        (5, 4, 100),
        (7, 6, 100),
    ]
    p2p = [t for t in trs if t.phase_step == 1]
    assert [(t.src_idx, t.dst_idx, t.bytes) for t in p2p] == [
        (0, 0, 200),
        (2, 1, 200),
        (4, 2, 200),
        (6, 3, 200),
    ]
    # (3, 2): g = 1: rank 0 gathers 2 shards, sends all, destination 0 scatters one half.
    trs = reshard_transfers(3, 2, 600, "gather_p2p_scatter")
    assert [(t.phase_step, t.src_side, t.src_idx, t.dst_side, t.dst_idx, t.bytes) for t in trs] == [
        (0, SOURCE, 1, SOURCE, 0, 200),
        (0, SOURCE, 2, SOURCE, 0, 200),
        (1, SOURCE, 0, DEST, 0, 600),
        (2, DEST, 0, DEST, 1, 300),
    ]


def test_equal_tp_is_rank_to_rank_for_every_method() -> None:
    for method in METHODS:
        trs = reshard_transfers(4, 4, 1000, method)
        assert [(t.src_idx, t.dst_idx, t.bytes) for t in trs] == [(k, k, 250) for k in range(4)]
    assert algorithm_label(4, 4, 1000, "lcm") == "p2p"


def test_unknown_method_is_named() -> None:
    with pytest.raises(ValueError, match="unknown resharding method 'zigzag'"):
        reshard_transfers(4, 2, 100, "zigzag")
