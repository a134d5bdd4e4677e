"""What-if inputs of the ns-3 engine: interval compute slowdowns and rerouting (no ns-3 here).

Interval slowdowns (:mod:`xsim_adapters.trace.slowdowns`): ``slow_rank`` per op (the rank of a
compute op on a slowed rank, else -1; computed from the trace's own kinds, so a timed barrier,
which the engine runs as a timer, is never stretched) and the per-rank segments. The engine
computes a stretched kernel's end as ``stretched_end`` does, in double precision, and rounds it
to the ns (ns-3's clock).

Rerouting (:mod:`xsim_adapters.topology.reroute`). The engine routes per (source, destination)
pair: one connection, one /32 destination address and host routes along one path. A pair is
moved, not a flow: every epoch whose down links the pair's current path crosses moves it to its
detour (if any), from that epoch's start, for its flows in flight and its later ones. The move
is a list of host routes the engine installs at the epoch's time, after that instant's link
events: ``(cable, sending side, address)``, each replacing the node's route to that address.
The forward path's routes carry the pair's own address; the ACK path's carry the source's
interface address (shared by every pair into that source: the last move's hop wins, loop-free
since every route is a shortest path on the surviving links). Packets on the dead link are lost
(the link's receive error model drops them) and TCP retransmits them over the detour; nodes the
detour leaves behind keep their stale routes, used by no later packet. Fluid (intra-server)
pairs move the same way: from the epoch on, their flows use the detour's links and latency.

Both are pure functions of the trace and topology, computed once per run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xsim_adapters.backend_api import (
    Epochs,
    Topology,
    Trace,
    detours,
    slowdown_schedule,
    slowed_compute,
)


def slowdown_arrays(trace: Trace, num_ranks: int) -> dict[str, np.ndarray]:
    """The engine's slowdown inputs (all empty without interval slowdowns)."""
    sched = slowdown_schedule(trace.manifest, num_ranks)
    ops = trace.ops
    rank = slowed_compute(ops["kind"].to_numpy(), ops["rank"].to_numpy(), sched)
    if sched is None:
        return {"slow_rank": np.zeros(0, np.int64), "slow_offsets": np.zeros(0, np.int64),
                "slow_lo": np.zeros(0), "slow_hi": np.zeros(0), "slow_factor": np.zeros(0)}
    return {"slow_rank": rank.astype(np.int64), "slow_offsets": sched.offsets,
            "slow_lo": sched.lo_ns, "slow_hi": sched.hi_ns, "slow_factor": sched.factor}


def path_moves(topology: Topology, ep: Epochs, src: list[int], dst: list[int],
               keys: list[int], paths: list[np.ndarray]) -> list[tuple[int, int, np.ndarray]]:
    """``(epoch, item, new path)`` for every move of item ``i`` (a pair's path ``paths[i]``
    from rank ``src[i]`` to ``dst[i]``, routed with key ``keys[i]``): walking the epochs, it
    moves to its detour whenever its current path crosses a down link."""
    n = len(paths)
    if n == 0 or not ep.any_down:
        return []
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=off[1:])
    flat = np.concatenate(paths).astype(np.int64)
    det = detours(topology, np.asarray(src), np.asarray(dst), np.asarray(keys), off, flat, ep)
    cur = [np.asarray(p, dtype=np.int64) for p in paths]
    moves = []
    for j, k in enumerate(det.key.tolist()):  # keys rise: epoch by epoch, item by item
        e, i = divmod(k, n)
        if ep.down[e][cur[i]].any():
            cur[i] = det.path(j).astype(np.int64)
            moves.append((e, i, cur[i]))
    return moves


def reroute_arrays(moves_at: list[tuple[int, int, int, int]],
                   fluid_at: list[tuple[int, int, list[int], float]]) -> dict[str, Any]:
    """Arrays of the engine's reroute steps. ``moves_at``: ``(at_ns, cable, side, address)``
    host routes; ``fluid_at``: ``(at_ns, fluid pair, local fluid links, latency_ns)``."""
    rows = sorted(moves_at, key=lambda r: r[0])
    frows = sorted(fluid_at, key=lambda r: r[0])
    fptr = np.zeros(len(frows) + 1, np.int64)
    np.cumsum([len(r[2]) for r in frows], out=fptr[1:])
    return {
        "reroute_at_ns": np.array([r[0] for r in rows], np.int64),
        "reroute_cable": np.array([r[1] for r in rows], np.int64),
        "reroute_side": np.array([r[2] for r in rows], np.int64),
        "reroute_addr": np.array([r[3] for r in rows], np.int64),
        "freroute_at_ns": np.array([r[0] for r in frows], np.int64),
        "freroute_pair": np.array([r[1] for r in frows], np.int64),
        "freroute_ptr": fptr,
        "freroute_links": np.array([x for r in frows for x in r[2]], np.int64),
        "freroute_lat": np.array([r[3] for r in frows], np.float64),
    }
