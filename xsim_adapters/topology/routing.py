"""Deterministic ECMP routing over a :class:`~xsim_adapters.topology.model.Topology` graph.

Rules (the same for every backend, so "the same plan" means the same paths everywhere):

- GPUs do not forward, with one exception: on NVLink (``scale_up`` links only) a path may cross
  one intermediate GPU, as NCCL's P2P does between GPUs of an NVLink mesh without a direct link
  (NVIDIA/nccl ``src/graph/paths.cc``: NVLink paths through one intermediate GPU).
- Two GPUs of the same NVLink domain (a server, or the trays of an NVL rack: the nodes'
  ``domain``) talk over NVLink (``scale_up`` links: GPU -> NVSwitch -> GPU, or a mesh) if they
  can, else over the server's NVLink and PCIe links; GPUs of different domains over every
  link but NVLink (PCIe, NICs, fabric, measured and explicit links). If a
  plane has no route, the whole graph is tried before giving up.
- Among equal-cost (fewest hops) paths, each hop picks one of its candidate next links (sorted by
  link id) by a stable hash of the flow key and the hop index. The key is first reduced to one
  of ``BUCKETS`` buckets, so paths are cached per (source node, destination node, bucket) and
  millions of flows between a few thousand GPU pairs are routed from a small cache.
- What the key is (``network.ecmp``, :data:`ECMP_MODES`): ``flow``, the flow's op id, so every
  flow draws its own path (a message-granular spread, as adaptive routing or a per-message
  source port gives); ``connection``, a hash of (source rank, destination rank, phase,
  channel), NCCL's connection: RoCE switches hash the UDP source port of the queue pair, fixed
  for the queue pair's life (one per peer per channel of a communicator, NCCL_IB_QPS_PER_CONNECTION
  = 1), so every flow of a connection takes one path for the whole run and collisions persist.

Python's ``hash()`` of strings is salted per process, so only integer mixing (splitmix64) is used.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..errors import PlanError

BUCKETS = 256  # ECMP buckets per (src, dst) pair; more than any fabric here has equal paths

_M64 = (1 << 64) - 1

#: ``network.ecmp``: what keys a flow's ECMP path (module doc).
ECMP_MODES = ("flow", "connection")


def stable_hash(x: int) -> int:
    """splitmix64 of a non-negative integer: a stable, well-mixed 64-bit hash."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def stable_hash_array(x: np.ndarray) -> np.ndarray:
    """Vectorized :func:`stable_hash` (uint64 in, uint64 out; arithmetic wraps mod 2**64)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def connection_keys(src: np.ndarray, dst: np.ndarray, phase: np.ndarray, channel: np.ndarray
                    ) -> np.ndarray:
    """ECMP key (int64 >= 0) of each flow's NCCL connection: a hash of its source rank,
    destination rank, phase (tp, dp, pp, ...: one communicator kind each) and channel (-1:
    none). Flows that share all four share the key, whatever their op ids; the key does not
    depend on how ops are numbered."""
    z = stable_hash_array(np.asarray(src, dtype=np.int64).astype(np.uint64))
    z = stable_hash_array(z ^ np.asarray(dst, dtype=np.int64).astype(np.uint64))
    tag = ((np.asarray(phase, dtype=np.int64) & 0xFF) << 16) | (
        np.asarray(channel, dtype=np.int64) & 0xFFFF)
    z = stable_hash_array(z ^ tag.astype(np.uint64))
    return (z >> np.uint64(1)).astype(np.int64)


def bucket_of(keys: np.ndarray) -> np.ndarray:
    """ECMP bucket (int64 in [0, BUCKETS)) of each flow key."""
    return (stable_hash_array(np.asarray(keys, dtype=np.int64)) % np.uint64(BUCKETS)).astype(
        np.int64
    )


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, order): positions of ``keys`` grouped by key value 0..n-1, stable."""
    order = np.argsort(keys, kind="stable")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=offsets[1:])
    return offsets, order


def _gather_ranges(offsets: np.ndarray, starts_of: np.ndarray) -> np.ndarray:
    """Concatenated index ranges [offsets[i], offsets[i+1]) for every i in ``starts_of``."""
    starts = offsets[starts_of]
    lens = offsets[starts_of + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    return shift + np.arange(total, dtype=np.int64)


class _Plane:
    """A subset of the links with CSR adjacency, and BFS distances cached per destination."""

    def __init__(
        self, mask: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int,
        gpu_relay: bool = False,
    ) -> None:
        ids = np.flatnonzero(mask).astype(np.int64)
        self.n = n
        self.gpu_relay = gpu_relay  # a GPU one hop from the target may forward
        in_off, in_order = _csr(dst[ids], n)
        self.in_off = in_off
        self.in_src = src[ids][in_order]
        out_off, out_order = _csr(src[ids], n)
        out_ids = ids[out_order]  # sorted by src, then by link id (ids ascending, stable sort)
        self.out_links: list[list[int]] = []
        self.out_dsts: list[list[int]] = []
        out_dst = dst[out_ids]
        for u in range(n):
            a, b = int(out_off[u]), int(out_off[u + 1])
            self.out_links.append(out_ids[a:b].tolist())
            self.out_dsts.append(out_dst[a:b].tolist())
        self._switch_dist: dict[int, np.ndarray] = {}  # switch -> int32 hop distances
        self._last: tuple[int, list[int]] | None = None  # the last GPU target's distances

    def dist(self, target: int, is_gpu: np.ndarray) -> list[int]:
        """Hop distance of every node to ``target`` (-1: unreachable); GPUs are not expanded.

        A switch's distances are a BFS, cached. On a plane without GPU relays (every plane but
        NVLink) a GPU never forwards, so a path into GPU
        ``t`` ends with a hop from a switch ``w`` (or starts at ``t``'s neighbour): d_t(u) is
        1 + min over t's switch in-neighbours w of d_w(u), or 1 for a GPU linked straight to
        ``t``; computed from the switches' cache, with only the last GPU target kept (16,384
        GPU targets x every node would not fit in memory).
        """
        if self._last is not None and self._last[0] == target:
            return self._last[1]
        if not is_gpu[target]:
            return self._bfs(target, is_gpu).tolist()
        if self.gpu_relay:
            # a GPU next to the target may relay (NVLink mesh): the switch-derived distances
            # below assume GPUs never forward, so search from the target itself (the plane is
            # one server's NVLink, a few nodes deep); only the last target is kept
            out = self._bfs(target, is_gpu, cache=False).tolist()
            self._last = (target, out)
            return out
        big = np.iinfo(np.int32).max
        acc = np.full(self.n, big, dtype=np.int32)
        for w in self.in_src[self.in_off[target]:self.in_off[target + 1]].tolist():
            if is_gpu[w]:
                acc[w] = 1
            else:
                dw = self._bfs(w, is_gpu)
                np.minimum(acc, np.where(dw >= 0, dw + 1, big), out=acc)
        acc[target] = 0
        acc[acc == big] = -1
        out = acc.tolist()
        self._last = (target, out)
        return out

    def _bfs(self, target: int, is_gpu: np.ndarray, cache: bool = True) -> np.ndarray:
        got = self._switch_dist.get(target) if cache else None
        if got is not None:
            return got
        dist = np.full(self.n, -1, dtype=np.int32)
        dist[target] = 0
        frontier = np.array([target], dtype=np.int64)
        d = 0
        while frontier.size:
            srcs = self.in_src[_gather_ranges(self.in_off, frontier)]
            srcs = np.unique(srcs[dist[srcs] < 0])
            d += 1
            dist[srcs] = d
            # a GPU may start a path but forwards none (on NVLink: only as the last relay)
            frontier = srcs if (self.gpu_relay and d == 1) else srcs[~is_gpu[srcs]]
        if cache:
            self._switch_dist[target] = dist
        return dist


class Router:
    """ECMP router built from a topology's ``nodes`` and ``links`` frames alone."""

    def __init__(self, nodes: pd.DataFrame, links: pd.DataFrame,
                 exclude: np.ndarray | None = None) -> None:
        """``exclude``: bool per link id, links no path may use (failed links: rerouting,
        :mod:`.reroute`); link ids stay those of ``links``."""
        n = len(nodes)
        self.num_nodes = n
        self.names = nodes["name"].astype(str).tolist()
        self.is_gpu = (nodes["kind"].astype(str) == "gpu").to_numpy()
        self.server = nodes["server"].to_numpy(dtype=np.int64)
        # NVLink domain (a server, or the trays of an NVL rack); frames without the column
        # (hand-made topologies) have one domain per server
        self.domain = (nodes["domain"].to_numpy(dtype=np.int64) if "domain" in nodes.columns
                       else self.server)
        src = links["src"].to_numpy(dtype=np.int64)
        dst = links["dst"].to_numpy(dtype=np.int64)
        tier = links["tier"].astype(str)
        scale_up = (tier == "scale_up").to_numpy()
        server = scale_up | (tier == "pcie").to_numpy()
        everything = np.ones(len(links), dtype=bool)
        if exclude is not None:
            keep = ~np.asarray(exclude, dtype=bool)
            scale_up, server, everything = scale_up & keep, server & keep, keep
        not_up = ~(tier == "scale_up").to_numpy() & everything
        self._planes = {
            "scale_up": _Plane(scale_up, src, dst, n, gpu_relay=True),
            "server": _Plane(server, src, dst, n),
            "scale_out": _Plane(not_up, src, dst, n),
            "all": _Plane(everything, src, dst, n),
        }
        self._cache: dict[int, np.ndarray] = {}  # (pair, bucket) -> path, branching pairs
        self._single: dict[int, np.ndarray] = {}  # pair -> its only shortest path
        # path ids (path_ids): cache key (-1 - pair for single paths) -> index in _table
        self._ids: dict[int, int] = {}
        self._table: list[np.ndarray] = []
        self._table_csr: tuple[np.ndarray, np.ndarray] | None = None

    # -- one path -------------------------------------------------------------------------
    def path(self, src_node: int, dst_node: int, key: int) -> np.ndarray:
        """Link ids (int32, in order) from node ``src_node`` to ``dst_node`` for flow ``key``."""
        bucket = stable_hash(int(key) & _M64) % BUCKETS
        return self._path_bucket(int(src_node), int(dst_node), int(bucket))

    def _path_bucket(self, s: int, t: int, bucket: int) -> np.ndarray:
        pair = s * self.num_nodes + t
        single = self._single.get(pair)
        if single is not None:
            return single
        ck = pair * BUCKETS + bucket
        got = self._cache.get(ck)
        if got is not None:
            return got
        out, branching = self._route(s, t, bucket)
        if branching:
            self._cache[ck] = out
        else:  # one shortest path only: every bucket gets it, no per-bucket cache entries
            self._single[pair] = out
        return out

    def _route(self, s: int, t: int, bucket: int) -> tuple[np.ndarray, bool]:
        """(path, whether any hop had a choice) from node s to node t."""
        if s == t:
            return np.zeros(0, dtype=np.int32), False
        same_domain = self.domain[s] >= 0 and self.domain[s] == self.domain[t]
        order = ("scale_up", "server", "all") if same_domain else ("scale_out", "all")
        out = None
        for name in order:
            out = self._walk(self._planes[name], s, t, bucket)
            if out is not None:
                break
        if out is None:
            raise PlanError(
                "network", f"no route from {self.names[s]} to {self.names[t]} in the topology"
            )
        return out

    def _walk(
        self, plane: _Plane, s: int, t: int, bucket: int
    ) -> tuple[np.ndarray, bool] | None:
        dist = plane.dist(t, self.is_gpu)
        if dist[s] < 0:
            return None
        is_gpu = self.is_gpu
        u = s
        hop = 0
        branching = False
        out: list[int] = []
        while u != t:
            want = dist[u] - 1
            cands = [
                (link, v)
                for link, v in zip(plane.out_links[u], plane.out_dsts[u], strict=True)
                if dist[v] == want
                and (v == t or not is_gpu[v] or (plane.gpu_relay and want == 1))
            ]
            if len(cands) == 1:
                link, u = cands[0]
            else:
                branching = True
                link, u = cands[stable_hash(bucket * 1_000_003 + hop) % len(cands)]
            out.append(link)
            hop += 1
        return np.asarray(out, dtype=np.int32), branching

    def single_path(self, src_node: int, dst_node: int) -> bool:
        """Whether ``src_node`` reaches ``dst_node`` by one shortest path only (no hop has an
        equal-cost choice), so every flow key gets the same path."""
        s, t = int(src_node), int(dst_node)
        self._path_bucket(s, t, 0)
        return (s * self.num_nodes + t) in self._single

    # -- many paths -----------------------------------------------------------------------
    def path_ids(
        self, src_nodes: np.ndarray, dst_nodes: np.ndarray, keys: np.ndarray
    ) -> np.ndarray:
        """Path id (int32, into :meth:`path_table`) of each flow ``src_nodes[i] ->
        dst_nodes[i]`` keyed by ``keys[i]``: the path of :meth:`path`.

        Ids are assigned in order of first routing and stay valid for the router's lifetime;
        call it on slices of a large trace (:func:`route_rows` does) to bound the temporaries.
        """
        s = np.asarray(src_nodes, dtype=np.int64)
        t = np.asarray(dst_nodes, dtype=np.int64)
        nn = self.num_nodes
        pair = s * nn + t
        # pairs with a single shortest path need no per-bucket work (all of NVSwitch traffic)
        upair, pinv = np.unique(pair, return_inverse=True)
        pair_id = np.full(len(upair), -1, dtype=np.int64)
        # by destination, so each destination's distances are computed once (Plane.dist)
        for j in np.lexsort((upair // nn, upair % nn)).tolist():
            pk = int(upair[j])
            u, v = divmod(pk, nn)
            self._path_bucket(u, v, 0)
            if pk in self._single:
                pair_id[j] = self._table_id(-1 - pk, self._single[pk])
        out = pair_id[pinv]
        del pinv
        need = np.flatnonzero(out < 0)
        if len(need):
            triple = pair[need] * BUCKETS + bucket_of(np.asarray(keys, dtype=np.int64)[need])
            utriple, tinv = np.unique(triple, return_inverse=True)
            ids = np.zeros(len(utriple), dtype=np.int64)
            upk = utriple // BUCKETS
            for j in np.lexsort((upk // nn, upk % nn)).tolist():
                ck = int(utriple[j])
                pk, bucket = divmod(ck, BUCKETS)
                u, v = divmod(pk, nn)
                ids[j] = self._table_id(ck, self._path_bucket(u, v, bucket))
            out[need] = ids[tinv]
        return out.astype(np.int32)

    def _table_id(self, key: int, path: np.ndarray) -> int:
        """The id of ``path`` in the path table (``key``: the cache key, negative for a
        single-path pair), numbering it on first use."""
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._table)
            self._table.append(path)
            self._table_csr = None
        return got

    def path_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Every path :meth:`path_ids` numbered, as CSR ``(offsets int64, link ids int32)``."""
        if self._table_csr is None:
            lens = np.fromiter((len(p) for p in self._table), dtype=np.int64,
                               count=len(self._table))
            off = np.zeros(len(self._table) + 1, dtype=np.int64)
            np.cumsum(lens, out=off[1:])
            flat = (np.concatenate(self._table).astype(np.int32, copy=False) if self._table
                    else np.zeros(0, dtype=np.int32))
            self._table_csr = (off, flat)
        return self._table_csr

    def paths_for(
        self, src_nodes: np.ndarray, dst_nodes: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Paths of many flows as CSR: (offsets int64 of length n+1, link ids int32).

        Flow ``i`` crosses ``link_ids[offsets[i]:offsets[i+1]]``, identical to
        ``path(src_nodes[i], dst_nodes[i], keys[i])``.
        """
        n = len(src_nodes)
        return route_rows(self, np.arange(n, dtype=np.int64), n, lambda lo, hi: (
            np.asarray(src_nodes[lo:hi], dtype=np.int64),
            np.asarray(dst_nodes[lo:hi], dtype=np.int64),
            np.asarray(keys[lo:hi], dtype=np.int64)))


#: Flows routed per slice by :func:`route_rows`: bounds its temporaries (about 100 bytes per
#: flow of the slice: ~25 MB) whatever the trace's size.
ROUTE_SLICE_FLOWS = 1 << 18


def route_rows(router: Router, rows: np.ndarray, num_rows: int,
               endpoints: Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Paths of the flows at ``rows`` (ascending) of a table of ``num_rows`` rows, as CSR over
    all rows: ``(offsets int64[num_rows + 1], link ids int32)``, other rows with no links.

    ``endpoints(lo, hi)`` gives (source node, destination node, ECMP key) of ``rows[lo:hi]``.
    Flows are routed ``ROUTE_SLICE_FLOWS`` at a time into path ids (4 bytes per flow), then
    expanded: beyond the result, memory is that int32 id per flow and a slice's temporaries.
    """
    step = ROUTE_SLICE_FLOWS
    pid = np.empty(len(rows), dtype=np.int32)
    for lo in range(0, len(rows), step):
        hi = min(lo + step, len(rows))
        pid[lo:hi] = router.path_ids(*endpoints(lo, hi))
    toff, tlinks = router.path_table()
    tlen = np.diff(toff)
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    tail = offsets[1:]
    for lo in range(0, len(rows), step):
        hi = min(lo + step, len(rows))
        tail[rows[lo:hi]] = tlen[pid[lo:hi]]
    np.cumsum(offsets, out=offsets)
    links = np.empty(int(offsets[-1]), dtype=np.int32)
    for lo in range(0, len(rows), step):
        hi = min(lo + step, len(rows))
        r, p = rows[lo:hi], pid[lo:hi]
        a, b = int(offsets[r[0]]), int(offsets[r[-1] + 1])
        if b > a:  # rows ascending, other rows empty: the slice's links are contiguous
            links[a:b] = tlinks[np.repeat(toff[p] - offsets[r], tlen[p])
                                + np.arange(a, b, dtype=np.int64)]
    return offsets, links
