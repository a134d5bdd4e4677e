"""Moving an activation of S bytes from a TP group of ``a`` ranks to one of ``b`` ranks.

The tensor is sharded 1/a over the source ranks and 1/b over the destination ranks, both in
rank order. Every transfer is a contiguous byte range ``[offset, offset + bytes)`` of the
(possibly padded) tensor. Methods:

- ``lcm``: L = lcm(a, b) equal chunks of ceil(S / L) bytes (the tensor is padded to a multiple
  of L; the padding is ``L * ceil(S / L) - S`` bytes); source i owns chunks [i*L/a, (i+1)*L/a),
  destination j needs [j*L/b, (j+1)*L/b); chunks between the same pair go as one transfer.
- ``gather_p2p_scatter``: g = gcd(a, b); source group q (ranks q*a/g .. (q+1)*a/g - 1) and
  destination group q cover the same byte range [floor(S*q/g), floor(S*(q+1)/g)). Phase 0: the
  source leader (first rank of the group) gathers the group's shards; phase 1: it sends the
  group's range to the destination leader; phase 2: that leader scatters to its group. A piece a
  leader already holds is not sent (no flow to itself).
- ``direct``: shard boundaries are the exact integer cut points floor(S*i/a) and floor(S*j/b);
  every piece of their union goes straight from its owner to its consumer (no padding).

``a == b`` degenerates to rank k -> rank k with S/a for every method (a plain pipeline send).
"""

from __future__ import annotations

import math
from typing import NamedTuple

SOURCE = 0
DEST = 1
RESHARD_METHODS = ("lcm", "gather_p2p_scatter", "direct")


class Transfer(NamedTuple):
    """One point-to-point piece: ``src_idx`` on side ``src_side`` to ``dst_idx`` on ``dst_side``.

    Sides are SOURCE (0, the sending stage) and DEST (1, the receiving stage); indices are TP
    ranks within the stage. ``phase_step`` orders dependent phases (0, 1, 2).
    """

    src_idx: int
    dst_idx: int
    bytes: int
    phase_step: int
    offset: int
    src_side: int
    dst_side: int


def shard_bounds(total: int, parts: int) -> list[int]:
    """Integer cut points floor(total * i / parts) for i = 0..parts."""
    return [total * i // parts for i in range(parts + 1)]


def padded_size(a: int, b: int, nbytes: int) -> tuple[int, int]:
    """(L, padding bytes) of the ``lcm`` method for an activation of ``nbytes``."""
    big_l = math.lcm(a, b)
    return big_l, -(-nbytes // big_l) * big_l - nbytes


def _overlaps(src_cuts: list[int], dst_cuts: list[int]) -> list[Transfer]:
    out = []
    for i in range(len(src_cuts) - 1):
        for j in range(len(dst_cuts) - 1):
            lo = max(src_cuts[i], dst_cuts[j])
            hi = min(src_cuts[i + 1], dst_cuts[j + 1])
            if hi > lo:
                out.append(Transfer(i, j, hi - lo, 0, lo, SOURCE, DEST))
    return out


def reshard_transfers(a: int, b: int, nbytes: int, method: str) -> list[Transfer]:
    """The transfers moving an activation of ``nbytes`` from ``a`` source to ``b`` dest ranks."""
    if a < 1 or b < 1:
        raise ValueError(f"TP degrees must be >= 1 (got a={a}, b={b})")
    if a == b or method == "direct":
        return _overlaps(shard_bounds(nbytes, a), shard_bounds(nbytes, b))
    if method == "lcm":
        big_l, pad = padded_size(a, b, nbytes)
        chunk = (nbytes + pad) // big_l
        src = [i * (big_l // a) * chunk for i in range(a + 1)]
        dst = [j * (big_l // b) * chunk for j in range(b + 1)]
        return _overlaps(src, dst)
    if method == "gather_p2p_scatter":
        g = math.gcd(a, b)
        sa, sb = a // g, b // g
        src_cuts, dst_cuts = shard_bounds(nbytes, a), shard_bounds(nbytes, b)
        out: list[Transfer] = []
        for q in range(g):
            lead_s, lead_d = q * sa, q * sb
            for i in range(lead_s + 1, lead_s + sa):
                size = src_cuts[i + 1] - src_cuts[i]
                out.append(Transfer(i, lead_s, size, 0, src_cuts[i], SOURCE, SOURCE))
            lo, hi = nbytes * q // g, nbytes * (q + 1) // g
            out.append(Transfer(lead_s, lead_d, hi - lo, 1, lo, SOURCE, DEST))
            for j in range(lead_d + 1, lead_d + sb):
                size = dst_cuts[j + 1] - dst_cuts[j]
                out.append(Transfer(lead_d, j, size, 2, dst_cuts[j], DEST, DEST))
        return out
    raise ValueError(f"unknown resharding method {method!r} (expected one of {RESHARD_METHODS})")


def needed_range(b: int, j: int, nbytes: int, method: str, a: int) -> tuple[int, int]:
    """The byte range destination rank j of ``b`` must hold after the transfer."""
    if method == "lcm" and a != b:
        big_l, pad = padded_size(a, b, nbytes)
        chunk = (nbytes + pad) // big_l
        per = big_l // b
        return j * per * chunk, (j + 1) * per * chunk
    cuts = shard_bounds(nbytes, b)
    return cuts[j], cuts[j + 1]


def algorithm_label(a: int, b: int, nbytes: int, method: str) -> str:
    """How a transfer is recorded in the collectives frame (``algorithm`` column)."""
    if a == b:
        return "p2p"
    if method == "lcm":
        big_l, pad = padded_size(a, b, nbytes)
        return f"lcm(L={big_l},pad={pad})"
    if method == "gather_p2p_scatter":
        return f"gather_p2p_scatter(g={math.gcd(a, b)})"
    return "direct"
