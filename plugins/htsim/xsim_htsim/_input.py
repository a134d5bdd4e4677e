"""Writer of the driver's input: the trace's ops, dependency CSR and routed flows, and the links.

Format (text, one record per line, integers only, ``#`` lines ignored)::

    xsim-htsim 3
    nodes <N>
    links <L>
    <src_node> <dst_node> <bps> <latency_ps> <from_host 0|1>     L lines, link id = line order
    events <E>
    <at_ps> <link_id> <bps>                                       E lines in time order
    routes <R>
    <hops> <link_id> ...                                          R lines, route id = line order
    ops <N_ops>
    C <duration_ps>                                              compute
    F <bytes> <src_rank> <dst_rank> <route> <reverse_route> <su>  flow (-1 -1: a local flow)
    B                                                            barrier
    succ <E>
    <k> <succ_op> ...                                            N_ops lines: successors of op i
    [what-if sections, see below]
    end

``from_host`` is 1 for a link whose queue is a host's, not a switch port's: links leaving a GPU
or a NIC node, and PCIe links (lossless and credit-based: they back-pressure, never trim or
drop), so NDP/EQDS trim only at Ethernet switch ports. Routes are the topology's own ECMP
paths (``Topology.path(src, dst, op_id)`` forward and ``Topology.path(dst, src, op_id)`` for
ACKs), deduplicated in order of first use, so htsim routes every flow exactly as the flow
backend does. ``su`` is 1 when the flow's forward route stays inside a server
(``topology.model.is_scale_up_path`` over ``Topology.server_links()``, the definition ns-3 uses
too: an intra-server NVLink/NVSwitch/PCIe flow, which the driver times with its fluid model under
``--scale-up fluid``), else 0 (always 0 for a local flow). The flag depends only on the
topology, so the file is the same for either scale-up mode. ``events`` are the topology's timed
link events (``Topology.events``): from ``at_ps`` on, link ``link_id`` serves at ``bps``
(``round(gbps x factor x 1e9)``; 0 takes it down until a later event). The output is a pure
function of the trace and topology (byte-identical across runs) and is written atomically.

What-if sections (only when the run has them, so other inputs are unchanged; a driver older
than them stops at their first line with "expected 'end'")::

    slow <R> <S>                                   interval compute slowdowns: R ranks, S segments
    <k> (<lo_ps> <hi_ps> <factor>) x k             R lines (rank order); hi_ps -1: to the end
    slowops <K>
    <op> <rank>                                    K lines: compute ops stretched by their rank
    reroute <E>                                    detours, one line per link-event instant
    <at_ps> <k> (<op> <fwd_route> <rev_route>) x k E lines; a route -1: that direction stays

Slowdown segments are :func:`xsim_adapters.trace.slowdowns.schedule`'s, in ps (``lo``/``hi``
and ``factor`` written as exact decimal floats, the one place the format is not integers); the
driver stretches a compute op as ``stretched_end`` does and rounds its end to the ps. Detours
are :func:`xsim_adapters.topology.reroute.detours` of each flow's forward route and of its ACK
route (routes added to the ``routes`` section after the ones flows start on, so a run without
link failures numbers its routes as before); at an instant's start the driver moves a live
flow's direction whose route crosses a down link to its detour, and starts a flow whose route
is down on its detour (docs/htsim.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xsim_adapters.errors import BackendError
from xsim_adapters.topology.model import Topology, is_scale_up_path
from xsim_adapters.topology.reroute import detours, epochs
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, Trace
from xsim_adapters.trace.slowdowns import schedule, slowed_compute

FORMAT_VERSION = 3


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


def _route_ids(off: np.ndarray, ids: np.ndarray, table: dict[bytes, int]) -> list[int]:
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
    return out.tolist()


def _event_lines(topology: Topology, gbps: np.ndarray) -> list[str]:
    """The ``events`` section: one ``<at_ps> <link> <bps>`` line per timed link event."""
    ev = topology.events
    if ev is None or len(ev) == 0:
        return ["events 0"]
    order = np.argsort(ev["at_ns"].to_numpy(dtype=np.float64), kind="stable")
    at = np.rint(ev["at_ns"].to_numpy(dtype=np.float64)[order] * 1000.0).astype(np.int64)
    link = ev["link_id"].to_numpy(dtype=np.int64)[order]
    factor = ev["factor"].to_numpy(dtype=np.float64)[order]
    bps = np.rint(gbps[link] * factor * 1e9).astype(np.int64)
    return [f"events {len(ev)}"] + [
        f"{a} {b} {c}" for a, b, c in zip(at.tolist(), link.tolist(), bps.tolist(), strict=True)
    ]


def _whatif_sections(trace: Trace, topology: Topology, flow_idx: np.ndarray,
                     remote: np.ndarray, fsrc: np.ndarray, fdst: np.ndarray,
                     table: dict[bytes, int], paths: tuple | None) -> list[str]:
    """The ``slow``/``slowops`` and ``reroute`` sections (see the module docstring), adding
    the detours' routes to ``table``; [] when the run has neither."""
    out: list[str] = []
    sched = schedule(trace.manifest, topology.num_ranks)
    if sched is not None:
        out.append(f"slow {sched.num_ranks} {len(sched.lo_ns)}")
        for r in range(sched.num_ranks):
            a, b = int(sched.offsets[r]), int(sched.offsets[r + 1])
            segs = [f"{lo * 1000.0!r} {(hi * 1000.0 if np.isfinite(hi) else -1.0)!r} {f!r}"
                    for lo, hi, f in zip(sched.lo_ns[a:b].tolist(), sched.hi_ns[a:b].tolist(),
                                         sched.factor[a:b].tolist(), strict=True)]
            out.append(" ".join([str(b - a), *segs]))
        ops = trace.ops
        rank = slowed_compute(ops["kind"].to_numpy(), ops["rank"].to_numpy(), sched)
        sel = np.flatnonzero(rank >= 0)
        out.append(f"slowops {len(sel)}")
        out += [f"{o} {r}" for o, r in zip(sel.tolist(), rank[sel].tolist(), strict=True)]
    ep = epochs(topology)
    if paths is None or not ep.any_down:
        return out
    f_off, f_ids, b_off, b_ids = paths
    r_idx = np.flatnonzero(remote)
    keys = flow_idx[r_idx].astype(np.int64)
    src, dst = fsrc[r_idx], fdst[r_idx]
    fwd = detours(topology, src, dst, keys, f_off, f_ids, ep)
    rev = detours(topology, dst, src, keys, b_off, b_ids, ep)
    per_epoch: list[dict[int, list[int]]] = [{} for _ in ep.at_ns]
    for det, side in ((fwd, 0), (rev, 1)):
        for j, k in enumerate(det.key.tolist()):
            e, i = divmod(k, det.num_items)
            path = det.path(j).astype(np.int64)
            rid = table.setdefault(path.tobytes(), len(table))
            per_epoch[e].setdefault(int(keys[i]), [-1, -1])[side] = rid
    out.append(f"reroute {len(ep.at_ns)}")
    for at, entries in zip(ep.at_ns.tolist(), per_epoch, strict=True):
        items = [f"{op} {f} {b}" for op, (f, b) in sorted(entries.items())]
        out.append(" ".join([str(round(at * 1000.0)), str(len(items)), *items]))
    return out


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
    from_host = (host_node[lsrc] | (links["tier"].to_numpy() == "pcie")).astype(np.int8)
    ldst = links["dst"].to_numpy(dtype=np.int64)
    bps = np.rint(gbps * 1e9).astype(np.int64)
    lat = np.rint(links["latency_ns"].to_numpy(dtype=np.float64) * 1000.0).astype(np.int64)
    lines = [f"xsim-htsim {FORMAT_VERSION}", f"nodes {len(nodes)}", f"links {len(links)}"]
    lines += [
        f"{a} {b} {c} {d} {e}"
        for a, b, c, d, e in zip(
            lsrc.tolist(), ldst.tolist(), bps.tolist(), lat.tolist(),
            from_host.tolist(), strict=True,
        )
    ]
    lines += _event_lines(topology, gbps)

    kind = ops["kind"].to_numpy()
    flow_idx = np.flatnonzero(kind == KIND_FLOW)
    fsrc = ops["rank"].to_numpy()[flow_idx].astype(np.int64)
    fdst = ops["dst"].to_numpy()[flow_idx].astype(np.int64)
    remote = fsrc != fdst  # a flow to oneself is a local copy: no network route
    table: dict[bytes, int] = {}
    fwd = np.full(len(flow_idx), -1, dtype=np.int64)
    rev = np.full(len(flow_idx), -1, dtype=np.int64)
    if remote.any():
        r_idx = np.flatnonzero(remote)
        keys = flow_idx[r_idx].astype(np.int64)
        f_off, f_ids = _flow_paths(topology, fsrc[r_idx], fdst[r_idx], keys)
        b_off, b_ids = _flow_paths(topology, fdst[r_idx], fsrc[r_idx], keys)
        f_rid = _route_ids(f_off, f_ids, table)
        b_rid = _route_ids(b_off, b_ids, table)
        missing = [i for i, (a, b) in enumerate(zip(f_rid, b_rid, strict=True)) if a < 0 or b < 0]
        if missing:
            op = int(keys[missing[0]])
            raise BackendError(
                f"htsim: flow op {op} ({int(fsrc[r_idx][missing[0]])} -> "
                f"{int(fdst[r_idx][missing[0]])}) has no route in the topology"
            )
        fwd[r_idx] = f_rid
        rev[r_idx] = b_rid
    extra = _whatif_sections(trace, topology, flow_idx, remote, fsrc, fdst, table,
                             (f_off, f_ids, b_off, b_ids) if remote.any() else None)
    lines.append(f"routes {len(table)}")
    scale_up_link = topology.server_links()  # NVLink and PCIe: fluid-timed
    route_su = []
    for key in table:  # dicts keep insertion order: route id = position
        hops = np.frombuffer(key, dtype=np.int64)
        lines.append(f"{len(hops)} " + " ".join(map(str, hops.tolist())))
        route_su.append(int(is_scale_up_path(scale_up_link, hops)))
    su = [route_su[r] if r >= 0 else 0 for r in fwd.tolist()]

    lines.append(f"ops {n}")
    known = (kind == KIND_COMPUTE) | (kind == KIND_FLOW) | (kind == KIND_BARRIER)
    if not known.all():
        bad = int(np.flatnonzero(~known)[0])
        raise BackendError(f"htsim: op {bad} has unknown kind {int(kind[bad])}")
    # One line per op, formatted per kind in bulk (a per-op branch costs seconds at 10^6 ops).
    op_lines = np.full(n, "B", dtype=object)
    # a timed barrier (collective latency) is a timer like a compute op
    timed = (kind == KIND_BARRIER) & (ops["duration_ns"].to_numpy() > 0)
    comp_idx = np.flatnonzero((kind == KIND_COMPUTE) | timed)
    dur_ps = ops["duration_ns"].to_numpy(dtype=np.int64)[comp_idx] * 1000
    op_lines[comp_idx] = [f"C {d}" for d in dur_ps.tolist()]
    nbytes = ops["bytes"].to_numpy(dtype=np.int64)[flow_idx]
    op_lines[flow_idx] = [
        f"F {b} {s} {d} {f} {r} {u}"
        for b, s, d, f, r, u in zip(nbytes.tolist(), fsrc.tolist(), fdst.tolist(), fwd.tolist(),
                                    rev.tolist(), su, strict=True)
    ]
    lines.extend(op_lines.tolist())
    sent = (fwd >= 0) & (nbytes > 0)  # what the driver puts on the network (replay.cpp)
    su_arr = np.asarray(su, dtype=bool)

    pred = trace.deps["pred"].to_numpy(dtype=np.int64)
    succ = trace.deps["succ"].to_numpy(dtype=np.int64)
    order = np.lexsort((succ, pred))
    pred, succ = pred[order], succ[order]
    starts = np.searchsorted(pred, np.arange(n + 1))
    lines.append(f"succ {len(succ)}")
    # "<k> <s1> <s2>..." per op: count tokens start a line, successor tokens follow with a space.
    tokens = np.empty(n + len(succ), dtype=object)
    count_pos = starts[:-1] + np.arange(n)
    is_count = np.zeros(len(tokens), dtype=bool)
    is_count[count_pos] = True
    tokens[count_pos] = [f"\n{k}" for k in np.diff(starts).tolist()]
    tokens[~is_count] = [f" {x}" for x in succ.tolist()]
    if n:
        lines.append("".join(tokens.tolist())[1:])  # drop the first line's leading newline
    lines.extend(extra)
    lines.append("end")
    text = "\n".join(lines) + "\n"

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return InputInfo(
        links=len(links), routes=len(table), ops=n, flows=len(flow_idx), edges=len(succ),
        scale_up_flows=int(sum(su)), bytes_written=len(text),
        network_flows=int(sent.sum()), network_bytes=int(nbytes[sent].sum()),
        scale_up_net_flows=int((sent & su_arr).sum()),
        scale_up_net_bytes=int(nbytes[sent & su_arr].sum()),
    )
