"""Writer of the driver's input: the trace's ops, dependency CSR and routed flows, and the links.

Binary, little-endian, written straight from the trace's columns (format version 5; 4 had no
what-if sections, 3 was a text format). Layout, in order (``u8``/``u32``/``i32``/``u64``:
integer widths, ``f64`` a double; ``[n]``: an array of n values)::

    magic       8 bytes  b"XSIMHTS" + NUL
    version     u32      5
    flags       u32      0 (reserved)
    counts      u64[12]  nodes N_n, links L, events E, routes R, route links H, ops N, edges M,
                         slowed ranks SR, slowdown segments S, slowed ops K, reroute epochs P,
                         detours D
    links       src u32[L], dst u32[L], bps u64[L], latency_ps u64[L], from_host u8[L]
    events      at_ps u64[E] (time order), link u32[E], bps u64[E]
    routes      offsets u64[R + 1] (CSR into the next array), links u32[H]
    ops         kind u8[N], value u64[N], latency_ps u64[N], src i32[N], dst i32[N],
                route i32[N], reverse_route i32[N], scale_up u8[N]
    successors  offsets u64[N + 1] (CSR into the next array), succ u32[M]
    slowdowns   offsets u64[SR + 1] (absent when SR = 0; CSR of each rank's segments),
                lo_ps f64[S], hi_ps f64[S] (-1: to the end of the run), factor f64[S];
                op u32[K], rank i32[K] (the compute ops a rank's segments stretch)
    reroutes    at_ps u64[P] (rising), offsets u64[P + 1] (absent when P = 0; CSR of each
                epoch's detours), op u32[D] (rising within an epoch), fwd i32[D], rev i32[D]
    end         8 bytes  b"XSIMEND" + NUL

Op kinds: 0 a timer of ``value`` ps (a compute op, or a barrier with a delay), 1 a flow of
``value`` bytes from rank ``src`` to ``dst`` over route ``route`` (ACKs over
``reverse_route``; both -1 for a local flow) whose first byte leaves ``latency_ps`` after it
starts (its start latency, trace schema 2), 2 a join (a barrier without delay). For non-flows
``latency_ps`` is 0 and ``src``, ``dst``, ``route``, ``reverse_route`` are -1. The driver checks
the magic, the version (it reads version 5 only, and says so), the file size against the
counts (a truncated file is refused) and every id against its range.

``from_host`` is 1 for a link whose queue is a host's, not a switch port's: links leaving a GPU or
a NIC node, and PCIe links (lossless and credit-based: they back-pressure, never trim or drop), so
NDP/EQDS trim only at Ethernet switch ports. Routes are the topology's own ECMP paths
(``Topology.path(src, dst, key)`` forward and ``Topology.path(dst, src, key)`` for ACKs, ``key``
the flow's ``Topology.ecmp_keys``), deduplicated in order of first use, so htsim routes every flow
exactly as the flow backend does. ``scale_up`` is 1 when the flow's forward route stays inside a
server (``topology.model.is_scale_up_path`` over ``Topology.server_links()``, the definition ns-3
uses too: an intra-server NVLink/NVSwitch/PCIe flow, which the driver times with its fluid model
under ``--scale-up fluid``), else 0 (always 0 for a local flow). The flag depends only on the
topology, so the file is the same for either scale-up mode. ``events`` are the topology's timed
link events (``Topology.events``): from ``at_ps`` on, link ``link`` serves at ``bps`` (``round(gbps
x factor x 1e9)``; 0 takes it down until a later event). Times go out in picoseconds (``ns x
1000``), capacities in bits per second. The output is a pure function of the trace and topology
(byte-identical across runs) and is written atomically.

What-if sections (SR = K = P = D = 0 when the run has none): slowdown segments are
:func:`xsim_adapters.trace.slowdowns.schedule`'s, in ps; the driver stretches a compute op as
``stretched_end`` does and rounds its end to the ps. Detours are
:func:`xsim_adapters.topology.reroute.detours` of each flow's forward route and of its ACK route
(routes added after the ones flows start on, so a run without link failures numbers its routes
as before; a route -1: that direction keeps its route); at an epoch's start the driver moves a
live flow's direction whose route crosses a down link to its detour, and starts a flow whose
route is down on its detour (docs/htsim.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xsim_adapters.backend_api import (
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    BackendError,
    Topology,
    Trace,
    detours,
    epochs,
    is_scale_up_path,
    slowdown_schedule,
    slowed_compute,
)

FORMAT_VERSION = 5
NUM_COUNTS = 12
HEADER_BYTES = 8 + 4 + 4 + 8 * NUM_COUNTS
MAGIC = b"XSIMHTS\0"
END_MAGIC = b"XSIMEND\0"
# Op kinds of the binary format (the driver's OpKind).
OP_TIMER, OP_FLOW, OP_JOIN = 0, 1, 2


@dataclass(frozen=True)
class InputInfo:
    """What was written: counts, for stats and tests."""

    links: int
    routes: int
    ops: int
    flows: int
    edges: int
    scale_up_flows: int  # flows flagged su=1 (remote, every forward link tier scale_up)
    bytes_written: int
    # Flows that cross the network with bytes to send (the driver starts a transport or fluid
    # flow for each), split by whether their path is scale-up only (``su``): the backend
    # counts them as packets or fluid according to its scale_up option.
    network_flows: int = 0
    network_bytes: int = 0
    scale_up_net_flows: int = 0
    scale_up_net_bytes: int = 0


def _flow_paths(topology: Topology, src: np.ndarray, dst: np.ndarray, keys: np.ndarray):
    """Paths as CSR (offsets, link ids) for flows src[i] -> dst[i] keyed by keys[i]."""
    router = topology._router
    nodes_src = topology.rank_node[src]
    nodes_dst = topology.rank_node[dst]
    bulk = getattr(router, "paths_for", None)
    if bulk is not None:  # the topology's vectorized router: same paths, one call
        off, ids = bulk(nodes_src, nodes_dst, keys)
        return np.asarray(off, dtype=np.int64), np.asarray(ids, dtype=np.int64)
    paths = [topology.path(int(s), int(d), int(k)) for s, d, k in zip(src, dst, keys, strict=True)]
    off = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=off[1:])
    ids = np.concatenate(paths).astype(np.int64) if paths else np.zeros(0, dtype=np.int64)
    return off, ids


def _route_ids(off: np.ndarray, ids: np.ndarray, table: dict[bytes, int]) -> np.ndarray:
    """Route id of each CSR path, adding new paths to ``table`` in order of first use.

    Vectorized: paths of one length are deduplicated as rows of a 2-D array, then the distinct
    paths are numbered in order of their first occurrence (as a sequential scan would).
    """
    n = len(off) - 1
    lens = np.diff(off)
    out = np.full(n, -1, dtype=np.int64)
    firsts: list[tuple[int, bytes, np.ndarray, np.ndarray, int]] = []
    for length in np.unique(lens[lens > 0]).tolist():
        sel = np.flatnonzero(lens == length)
        rows = ids[off[sel][:, None] + np.arange(length)]
        base = int(ids.max()) + 1
        if base**length < 2**62:
            # One integer per path (base-`base` digits): a 1-D unique is ~20x faster than rows.
            code = rows @ (base ** np.arange(length, dtype=np.int64))
            _, first, inv = np.unique(code, return_index=True, return_inverse=True)
            uniq = rows[first]
        else:
            uniq, first, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        for u in range(len(uniq)):
            firsts.append((int(sel[first[u]]), uniq[u].tobytes(), sel, inv, u))
    firsts.sort(key=lambda c: c[0])
    rid_of: dict[tuple[int, int], int] = {}
    for _, key, sel, _, u in firsts:
        rid = table.get(key)
        if rid is None:
            rid = table[key] = len(table)
        rid_of[(id(sel), u)] = rid
    for _, _, sel, inv, _ in firsts:
        if out[sel[0]] >= 0:
            continue  # this length group is already filled in
        lut = np.array([rid_of[(id(sel), u)] for u in range(int(inv.max()) + 1)], dtype=np.int64)
        out[sel] = lut[inv]
    return out


def _events(topology: Topology, gbps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The timed link events in time order: (at_ps u64, link u32, bps u64)."""
    ev = topology.events
    if ev is None or len(ev) == 0:
        return (np.zeros(0, "<u8"), np.zeros(0, "<u4"), np.zeros(0, "<u8"))
    order = np.argsort(ev["at_ns"].to_numpy(dtype=np.float64), kind="stable")
    at = np.rint(ev["at_ns"].to_numpy(dtype=np.float64)[order] * 1000.0).astype("<u8")
    link = ev["link_id"].to_numpy(dtype=np.int64)[order]
    factor = ev["factor"].to_numpy(dtype=np.float64)[order]
    bps = np.rint(gbps[link] * factor * 1e9).astype("<u8")
    return at, link.astype("<u4"), bps


def _whatif_sections(trace: Trace, topology: Topology, flow_idx: np.ndarray,
                     remote: np.ndarray, fsrc: np.ndarray, fdst: np.ndarray,
                     table: dict[bytes, int], paths: tuple | None
                     ) -> tuple[list[int], list[np.ndarray]]:
    """The counts (SR, S, K, P, D) and arrays of the slowdown and reroute sections (see the
    module docstring), adding the detours' routes to ``table``."""
    parts: list[np.ndarray] = []
    sr = s = k = p = d = 0
    sched = slowdown_schedule(trace.manifest, topology.num_ranks)
    if sched is not None:
        sr, s = sched.num_ranks, len(sched.lo_ns)
        hi = np.where(np.isfinite(sched.hi_ns), sched.hi_ns * 1000.0, -1.0)
        ops = trace.ops
        rank = slowed_compute(ops["kind"].to_numpy(), ops["rank"].to_numpy(), sched)
        sel = np.flatnonzero(rank >= 0)
        k = len(sel)
        parts += [np.asarray(sched.offsets, dtype="<u8"),
                  (np.asarray(sched.lo_ns, dtype=np.float64) * 1000.0).astype("<f8"),
                  hi.astype("<f8"), np.asarray(sched.factor, dtype="<f8"),
                  sel.astype("<u4"), rank[sel].astype("<i4")]
    ep = epochs(topology)
    if paths is not None and ep.any_down:
        f_off, f_ids, b_off, b_ids = paths
        r_idx = np.flatnonzero(remote)
        op_of = flow_idx[r_idx].astype(np.int64)
        keys = topology.ecmp_keys(trace.ops, op_of)
        src, dst = fsrc[r_idx], fdst[r_idx]
        fwd = detours(topology, src, dst, keys, f_off, f_ids, ep)
        rev = detours(topology, dst, src, keys, b_off, b_ids, ep)
        per_epoch: list[dict[int, list[int]]] = [{} for _ in ep.at_ns]
        for det, side in ((fwd, 0), (rev, 1)):
            for j, key in enumerate(det.key.tolist()):
                e, i = divmod(key, det.num_items)
                path = det.path(j).astype(np.int64)
                rid = table.setdefault(path.tobytes(), len(table))
                per_epoch[e].setdefault(int(op_of[i]), [-1, -1])[side] = rid
        p = len(ep.at_ns)
        items = [sorted(entries.items()) for entries in per_epoch]
        d_off = np.zeros(p + 1, dtype="<u8")
        np.cumsum([len(x) for x in items], out=d_off[1:])
        d = int(d_off[-1])
        flat = [(op, f, b) for x in items for op, (f, b) in x]
        arr = np.array(flat, dtype=np.int64).reshape(-1, 3)
        parts += [np.rint(np.asarray(ep.at_ns, dtype=np.float64) * 1000.0).astype("<u8"),
                  d_off, arr[:, 0].astype("<u4"), arr[:, 1].astype("<i4"),
                  arr[:, 2].astype("<i4")]
    return [sr, s, k, p, d], parts


def write_input(trace: Trace, topology: Topology, path: str | os.PathLike) -> InputInfo:
    """Write the driver input for ``trace`` on ``topology`` to ``path`` (atomically).

    Times go out in picoseconds (``duration_ns * 1000``), capacities in bits per second
    (``round(gbps * 1e9)``), latencies in picoseconds (``round(latency_ns * 1000)``).
    Raises BackendError if the topology cannot be expressed (a link of zero capacity) or a
    flow has no route between distinct GPUs.
    """
    ops = trace.ops
    n = len(ops)
    links = topology.links
    nodes = topology.nodes
    gbps = links["gbps"].to_numpy(dtype=np.float64)
    if len(links) and not (gbps > 0).all():
        bad = int(np.flatnonzero(~(gbps > 0))[0])
        raise BackendError(
            f"htsim: link {bad} has capacity {gbps[bad]} Gb/s; htsim needs every link to have"
            " a positive capacity (a failed link must be removed from the topology)"
        )
    host_node = np.isin(nodes["kind"].to_numpy(), ("gpu", "nic"))
    lsrc = links["src"].to_numpy(dtype=np.int64)
    from_host = host_node[lsrc] | (links["tier"].to_numpy() == "pcie")
    ldst = links["dst"].to_numpy(dtype=np.int64)
    bps = np.rint(gbps * 1e9).astype("<u8")
    lat = np.rint(links["latency_ns"].to_numpy(dtype=np.float64) * 1000.0).astype("<u8")

    kind = ops["kind"].to_numpy()
    known = (kind == KIND_COMPUTE) | (kind == KIND_FLOW) | (kind == KIND_BARRIER)
    if not known.all():
        bad = int(np.flatnonzero(~known)[0])
        raise BackendError(f"htsim: op {bad} has unknown kind {int(kind[bad])}")
    flow_idx = np.flatnonzero(kind == KIND_FLOW)
    fsrc = ops["rank"].to_numpy()[flow_idx].astype(np.int64)
    fdst = ops["dst"].to_numpy()[flow_idx].astype(np.int64)
    remote = fsrc != fdst  # a flow to oneself is a local copy: no network route
    table: dict[bytes, int] = {}
    fwd = np.full(len(flow_idx), -1, dtype=np.int64)
    rev = np.full(len(flow_idx), -1, dtype=np.int64)
    if remote.any():
        r_idx = np.flatnonzero(remote)
        op_of = flow_idx[r_idx].astype(np.int64)
        keys = topology.ecmp_keys(ops, op_of)
        f_off, f_ids = _flow_paths(topology, fsrc[r_idx], fdst[r_idx], keys)
        b_off, b_ids = _flow_paths(topology, fdst[r_idx], fsrc[r_idx], keys)
        f_rid = _route_ids(f_off, f_ids, table)
        b_rid = _route_ids(b_off, b_ids, table)
        missing = np.flatnonzero((f_rid < 0) | (b_rid < 0))
        if len(missing):
            i = int(missing[0])
            raise BackendError(
                f"htsim: flow op {int(op_of[i])} ({int(fsrc[r_idx][i])} -> "
                f"{int(fdst[r_idx][i])}) has no route in the topology"
            )
        fwd[r_idx] = f_rid
        rev[r_idx] = b_rid
    whatif_counts, whatif_parts = _whatif_sections(
        trace, topology, flow_idx, remote, fsrc, fdst, table,
        (f_off, f_ids, b_off, b_ids) if remote.any() else None)
    route_hops = [np.frombuffer(key, dtype=np.int64) for key in table]  # id = position
    r_off = np.zeros(len(route_hops) + 1, dtype="<u8")
    np.cumsum([len(h) for h in route_hops], out=r_off[1:])
    r_links = (np.concatenate(route_hops) if route_hops else np.zeros(0, np.int64)).astype("<u4")
    scale_up_link = topology.server_links()  # NVLink and PCIe: fluid-timed
    route_su = np.array([is_scale_up_path(scale_up_link, h) for h in route_hops], dtype=bool)
    su = np.where(fwd >= 0, route_su[np.maximum(fwd, 0)] if len(route_su) else False, False)

    dur = ops["duration_ns"].to_numpy(dtype=np.int64)
    op_kind = np.where(kind == KIND_FLOW, OP_FLOW,
                       np.where((kind == KIND_BARRIER) & (dur <= 0), OP_JOIN, OP_TIMER))
    nbytes = ops["bytes"].to_numpy(dtype=np.int64)[flow_idx]
    value = np.where(op_kind == OP_TIMER, dur * 1000, 0).astype("<u8")
    value[flow_idx] = nbytes
    latency = np.zeros(n, dtype="<u8")
    latency[flow_idx] = dur[flow_idx] * 1000  # a flow's start latency (trace schema 2)
    per_flow = {"src": fsrc, "dst": fdst, "route": fwd, "reverse": rev}
    cols = {}
    for name, v in per_flow.items():
        col = np.full(n, -1, dtype="<i4")
        col[flow_idx] = v
        cols[name] = col
    scale_up = np.zeros(n, dtype="u1")
    scale_up[flow_idx] = su

    pred = trace.deps["pred"].to_numpy(dtype=np.int64)
    succ = trace.deps["succ"].to_numpy(dtype=np.int64)
    order = np.lexsort((succ, pred))
    s_off = np.zeros(n + 1, dtype="<u8")
    np.cumsum(np.bincount(pred, minlength=n), out=s_off[1:])
    succ_sorted = succ[order].astype("<u4")

    ev_at, ev_link, ev_bps = _events(topology, gbps)
    counts = np.array([len(nodes), len(links), len(ev_at), len(route_hops), len(r_links), n,
                       len(succ), *whatif_counts], dtype="<u8")
    parts = [
        MAGIC, np.array([FORMAT_VERSION, 0], dtype="<u4"), counts,
        lsrc.astype("<u4"), ldst.astype("<u4"), bps, lat, from_host.astype("u1"),
        ev_at, ev_link, ev_bps,
        r_off, r_links,
        op_kind.astype("u1"), value, latency, cols["src"], cols["dst"], cols["route"],
        cols["reverse"], scale_up,
        s_off, succ_sorted,
        *whatif_parts,
        END_MAGIC,
    ]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    size = 0
    with open(tmp, "wb") as f:
        for part in parts:
            buf = part if isinstance(part, bytes) else np.ascontiguousarray(part).data
            f.write(buf)
            size += len(part) if isinstance(part, bytes) else part.nbytes
    os.replace(tmp, path)
    sent = (fwd >= 0) & (nbytes > 0)  # what the driver puts on the network (replay.cpp)
    return InputInfo(
        links=len(links), routes=len(route_hops), ops=n, flows=len(flow_idx), edges=len(succ),
        scale_up_flows=int(su.sum()), bytes_written=size,
        network_flows=int(sent.sum()), network_bytes=int(nbytes[sent].sum()),
        scale_up_net_flows=int((sent & su).sum()),
        scale_up_net_bytes=int(nbytes[sent & su].sum()),
    )


def read_input(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an input file written by :func:`write_input`, by their layout names
    (``links_src`` ... ``succ``), plus ``version`` and ``counts``: for tests and inspection.
    Raises BackendError on a file of another magic, version or size (as the driver does)."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise BackendError(f"htsim: {path}: not an xsim-htsim input (bad magic)")
    version = int(np.frombuffer(data, "<u4", 1, 8)[0])
    if version != FORMAT_VERSION:
        raise BackendError(f"htsim: {path}: input format version {version} (this reads"
                           f" {FORMAT_VERSION})")
    c = np.frombuffer(data, "<u8", NUM_COUNTS, 16).astype(np.int64)
    nn, L, E, R, H, N, M, SR, S, K, P, D = (int(x) for x in c)
    layout = [("links_src", "<u4", L), ("links_dst", "<u4", L), ("links_bps", "<u8", L),
              ("links_latency_ps", "<u8", L), ("links_from_host", "u1", L),
              ("events_at_ps", "<u8", E), ("events_link", "<u4", E), ("events_bps", "<u8", E),
              ("routes_offsets", "<u8", R + 1), ("routes_links", "<u4", H),
              ("kind", "u1", N), ("value", "<u8", N), ("latency_ps", "<u8", N),
              ("src", "<i4", N), ("dst", "<i4", N), ("route", "<i4", N),
              ("reverse_route", "<i4", N), ("scale_up", "u1", N),
              ("succ_offsets", "<u8", N + 1), ("succ", "<u4", M),
              ("slow_offsets", "<u8", SR + 1 if SR else 0), ("slow_lo_ps", "<f8", S),
              ("slow_hi_ps", "<f8", S), ("slow_factor", "<f8", S), ("slow_op", "<u4", K),
              ("slow_rank", "<i4", K), ("reroute_at_ps", "<u8", P),
              ("reroute_offsets", "<u8", P + 1 if P else 0), ("detour_op", "<u4", D),
              ("detour_fwd", "<i4", D), ("detour_rev", "<i4", D)]
    out: dict[str, np.ndarray] = {"version": np.array(version), "counts": c}
    want = (HEADER_BYTES + sum(np.dtype(dt).itemsize * count for _, dt, count in layout)
            + len(END_MAGIC))
    if len(data) != want:
        raise BackendError(f"htsim: {path}: {len(data)} bytes, but its counts need {want} (a"
                           " truncated or damaged file; size does not match its counts)")
    pos = HEADER_BYTES
    for name, dt, count in layout:
        width = np.dtype(dt).itemsize
        out[name] = np.frombuffer(data, dt, count, pos)
        pos += width * count
    if data[pos:] != END_MAGIC:
        raise BackendError(f"htsim: {path}: no end marker after the sections (damaged)")
    return out
