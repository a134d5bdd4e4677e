"""Turn a Trace and a Topology into the flat arrays the C++ replay engine loads (no ns-3 here).

Routing choice: static host routes computed from ``Topology.path``, not ns-3's global routing.
Each (source GPU, destination GPU) pair with packet flows (each connection of it under
``network.ecmp: connection``) gets one persistent connection and a /32 destination address of
its own; host routes for it are installed hop by hop along
``Topology.path(src, dst, key)`` with ``key`` the ECMP key of the pair's first flow
(``Topology.ecmp_keys``). So data packets cross exactly the links the flow backend routes that
pair's first flow over, including the chosen parallel link of a multi-edge; ns-3's global
routing could not promise that (it picks its own equal-cost path and ignores multi-edge
identity). Under ``network.ecmp: flow`` later flows of a pair reuse the connection and its
path, where the flow backend draws a path per flow; under ``connection`` each NCCL connection
of a pair (phase, channel) is a connection of its own with its own address and path, so every
flow crosses the links it crosses in the other backends.
ACKs go back to the source's interface address along ``Topology.path(dst, src, key)``; where
two pairs disagree about a hop toward the same source, the first pair's route is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xsim_adapters.backend_api import (
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    BackendError,
    Topology,
    Trace,
    epochs,
    is_scale_up_path,
)

from ._options import Ns3Options
from ._whatif import path_moves, reroute_arrays, slowdown_arrays

PAIR_ADDRESS_BASE = 0x0B000000  # 11.0.0.0: per-pair destination addresses
CABLE_NET_BASE = 0x0A000000  # 10.0.0.0: one /30 per cable, .1 on end a, .2 on end b (engine.cpp)
FIRST_PORT = 1024


@dataclass
class ReplayInput:
    """Everything the worker needs; ``arrays`` go to an .npz file, ``meta`` to JSON."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _dag_arrays(trace: Trace) -> dict[str, np.ndarray]:
    ops = trace.ops
    n = len(ops)
    pred = trace.deps["pred"].to_numpy(np.int64)
    succ = trace.deps["succ"].to_numpy(np.int64)
    if len(pred) and (pred.min() < 0 or succ.min() < 0 or pred.max() >= n or succ.max() >= n):
        raise BackendError(f"ns3: trace deps reference op ids outside 0..{n - 1}")
    order = np.argsort(pred, kind="stable")
    sptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=sptr[1:])
    return {
        # a timed barrier (collective latency) runs as the engine's compute timer
        "kind": np.where((ops["kind"].to_numpy() == KIND_BARRIER)
                         & (ops["duration_ns"].to_numpy() > 0), KIND_COMPUTE,
                         ops["kind"].to_numpy()).astype(np.int64),
        "dur": ops["duration_ns"].to_numpy(np.int64),
        "bytes": ops["bytes"].to_numpy(np.int64),
        "sptr": sptr,
        "sidx": succ[order].astype(np.int64),
        "pending": np.bincount(succ, minlength=n).astype(np.int64),
    }


def _cables(links: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair directed links into cables: link -> (cable, side); cable -> (link a->b, link b->a|-1).

    Within one node pair, the k-th a->b link (by id) pairs with the k-th b->a link, so
    multi-edges stay distinct cables.
    """
    src = links["src"].to_numpy(np.int64)
    dst = links["dst"].to_numpy(np.int64)
    cable_of = np.full(len(src), -1, np.int64)
    side_of = np.zeros(len(src), np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for lid in range(len(src)):
        groups.setdefault((int(src[lid]), int(dst[lid])), []).append(lid)
    fwd: list[int] = []
    rev: list[int] = []
    for (a, b), ids in sorted(groups.items()):
        if cable_of[ids[0]] >= 0:
            continue
        back = groups.get((b, a), []) if a != b else []
        for k, lid in enumerate(ids):
            cable_of[lid], side_of[lid] = len(fwd), 0
            other = back[k] if k < len(back) else -1
            if other >= 0:
                cable_of[other], side_of[other] = len(fwd), 1
            fwd.append(lid)
            rev.append(other)
        for lid in back[len(ids):]:
            cable_of[lid], side_of[lid] = len(fwd), 0
            fwd.append(lid)
            rev.append(-1)
    return cable_of, side_of, np.array([fwd, rev], np.int64).reshape(2, -1)


def _link_events(
    topology: Topology,
    fluid_local: dict[int, int],
    cable_of: np.ndarray,
    side_of: np.ndarray,
    cmap: dict[int, int],
    gbps: np.ndarray,
) -> dict[str, np.ndarray]:
    """Timed link events on built links: the new capacity (factor x the link's Gb/s).

    Events on links no flow crosses change nothing and are dropped. Times round to the ns.
    """
    rows: list[tuple[int, int, int, int, float]] = []
    ev = topology.events
    if ev is not None and len(ev):
        for at, lid, factor in zip(ev["at_ns"], ev["link_id"], ev["factor"], strict=True):
            lid = int(lid)
            cap = float(gbps[lid]) * float(factor)
            if lid in fluid_local:
                rows.append((round(float(at)), 1, fluid_local[lid], 0, cap / 8.0))
            elif int(cable_of[lid]) in cmap:
                rows.append((round(float(at)), 0, cmap[int(cable_of[lid])], int(side_of[lid]),
                             cap * 1e9))
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    return {
        "event_at_ns": np.array(cols[0], np.int64),
        "event_fluid": np.array(cols[1], np.int64),
        "event_index": np.array(cols[2], np.int64),
        "event_side": np.array(cols[3], np.int64),
        "event_value": np.array(cols[4], np.float64),
    }


def prepare(trace: Trace, topology: Topology, opts: Ns3Options) -> ReplayInput:
    """Flatten ``trace`` and ``topology`` for the worker; see the module docstring for routing."""
    out = ReplayInput()
    a = _dag_arrays(trace)
    n = len(a["kind"])
    ops = trace.ops
    links = topology.links
    gbps = links["gbps"].to_numpy(np.float64)
    lat = links["latency_ns"].to_numpy(np.float64)
    scale_up_link = topology.server_links()  # NVLink and PCIe: fluid-timed
    lsrc = links["src"].to_numpy(np.int64)
    ldst = links["dst"].to_numpy(np.int64)
    num_nodes = len(topology.nodes)
    is_gpu = (topology.nodes["kind"].astype(str) == "gpu").to_numpy()

    flow_ids = np.flatnonzero((a["kind"] == KIND_FLOW) & (a["bytes"] > 0))
    fsrc = ops["rank"].to_numpy(np.int64)[flow_ids]
    fdst = ops["dst"].to_numpy(np.int64)[flow_ids]
    nr = topology.num_ranks
    bad = (fsrc < 0) | (fsrc >= nr) | (fdst < 0) | (fdst >= nr) | (fsrc == fdst)
    if bad.any():
        i = int(flow_ids[np.flatnonzero(bad)[0]])
        raise BackendError(
            f"ns3: flow op {i} goes from rank {int(ops['rank'].iat[i])} to rank"
            f" {int(ops['dst'].iat[i])}; the topology has ranks 0..{nr - 1} and a flow needs two"
        )
    # One connection per (src, dst) pair, routed by its first flow's ECMP key (np.unique keeps
    # the first); under network.ecmp: connection one per (src, dst, connection key), so each
    # NCCL connection gets its own address and path, as in the other backends.
    pair_key = fsrc * nr + fdst
    if topology.ecmp == "connection":
        group = np.stack([pair_key, topology.ecmp_keys(ops, flow_ids)], axis=1)
        _, first, pair_of_flow = np.unique(group, axis=0, return_index=True,
                                           return_inverse=True)
    else:
        _, first, pair_of_flow = np.unique(pair_key, return_index=True, return_inverse=True)
    pair_of_flow = pair_of_flow.reshape(-1)
    g_src, g_dst = fsrc[first], fdst[first]
    conn = np.full(n, -1, np.int64)
    fluid_lat = np.zeros(n, np.float64)
    fluid_paths: dict[int, np.ndarray] = {}
    pairs: list[dict[str, Any]] = []
    used_links: set[int] = set()
    pair_is_fluid = np.zeros(len(first), bool)
    pair_slot = np.full(len(first), -1, np.int64)
    pair_ecmp = topology.ecmp_keys(ops, flow_ids[first])  # the pair's first flow's ECMP key
    for p in range(len(first)):
        s, d = int(g_src[p]), int(g_dst[p])
        op0 = int(flow_ids[first[p]])
        ek = int(pair_ecmp[p])
        path = np.asarray(topology.path(s, d, ek), np.int64)
        if len(path) == 0:
            raise BackendError(
                f"ns3: the topology has no path from rank {s} to rank {d} (op {op0})"
            )
        if opts.scale_up == "fluid" and is_scale_up_path(scale_up_link, path):
            pair_is_fluid[p] = True
            fluid_paths[p] = path
            continue
        back = np.asarray(topology.path(d, s, ek), np.int64)
        if len(back) == 0:
            raise BackendError(f"ns3: the topology has no path from rank {d} back to rank {s}")
        used_links.update(path.tolist())
        used_links.update(back.tolist())
        pair_slot[p] = len(pairs)
        pairs.append({"src": s, "dst": d, "path": path, "back": back, "key": ek})

    off_route = _off_route_flows(topology, ops, flow_ids, fsrc, fdst, first, pair_of_flow,
                                 pair_slot >= 0)

    # Rerouting (_whatif.py): where each pair's paths move when links are down.
    ep = epochs(topology)
    fwd_moves = path_moves(topology, ep, [q["src"] for q in pairs], [q["dst"] for q in pairs],
                           [q["key"] for q in pairs], [q["path"] for q in pairs])
    back_moves = path_moves(topology, ep, [q["dst"] for q in pairs], [q["src"] for q in pairs],
                            [q["key"] for q in pairs], [q["back"] for q in pairs])
    fluid_ids = sorted(fluid_paths)
    fluid_moves = [(e, fluid_ids[i], pth) for e, i, pth in path_moves(
        topology, ep, [int(g_src[q]) for q in fluid_ids], [int(g_dst[q]) for q in fluid_ids],
        [int(pair_ecmp[q]) for q in fluid_ids], [fluid_paths[q] for q in fluid_ids])]
    for _, _, pth in fwd_moves + back_moves:
        used_links.update(pth.tolist())

    # Fluid flows: local link ids, capacity in bytes/ns, path latency per op.
    fluid_link_ids = sorted({int(x) for pth in fluid_paths.values() for x in pth}
                            | {int(x) for _, _, pth in fluid_moves for x in pth})
    local = {lid: i for i, lid in enumerate(fluid_link_ids)}
    fptr = np.zeros(n + 1, np.int64)
    counts = np.zeros(n, np.int64)
    fluid_pair = np.full(n, -1, np.int64)  # per op: its fluid pair (what a reroute moves)
    for j, op in enumerate(flow_ids):
        p = int(pair_of_flow[j])
        if pair_is_fluid[p]:
            fluid_pair[op] = p
            counts[op] = len(fluid_paths[p])
            fluid_lat[op] = float(lat[fluid_paths[p]].sum())
        else:
            conn[op] = pair_slot[p]
    np.cumsum(counts, out=fptr[1:])
    flink = np.zeros(int(fptr[-1]), np.int64)
    for j, op in enumerate(flow_ids):
        p = int(pair_of_flow[j])
        if pair_is_fluid[p]:
            flink[fptr[op]:fptr[op + 1]] = [local[int(x)] for x in fluid_paths[p]]

    cable_of, side_of, cable_links = _cables(links)
    used_cables = sorted({int(cable_of[lid]) for lid in used_links})
    cmap = {c: i for i, c in enumerate(used_cables)}
    used_idx = np.array(used_cables, dtype=np.int64)
    cab_fwd = cable_links[0, used_idx]
    cab_rev = cable_links[1, used_idx]
    rev_or_fwd = np.where(cab_rev >= 0, cab_rev, cab_fwd)
    cable_mtu = np.where(scale_up_link[cab_fwd], opts.scale_up_mtu, opts.mtu).astype(np.int64)

    # Endpoint addresses and hop-by-hop host routes.
    r_cable: list[int] = []
    r_side: list[int] = []
    r_addr: list[int] = []
    addr_cable, addr_side, addr_value = [], [], []
    c_src, c_dst, c_daddr, c_port, c_mtu, c_pace = [], [], [], [], [], []
    next_port: dict[int, int] = {}
    max_bdp = 0.0
    reverse_routed: set[tuple[int, int]] = set()  # (sending node, address)
    src_addr: list[int] = []  # per pair: the source interface address its ACKs go to
    for i, pr in enumerate(pairs):
        daddr = PAIR_ADDRESS_BASE + i
        for lid in pr["path"]:
            r_cable.append(cmap[int(cable_of[lid])])
            r_side.append(int(side_of[lid]))
            r_addr.append(daddr)
        # ACKs go to the source's egress-interface address (TCP picks it from the route): the
        # first pair to need a hop wins. Loop-free, as every path is a shortest path to that
        # address, so any node's next hop is one hop closer.
        egress = int(pr["path"][0])
        saddr = CABLE_NET_BASE + 4 * cmap[int(cable_of[egress])] + 1 + int(side_of[egress])
        src_addr.append(saddr)
        for lid in pr["back"]:
            key = (int(lsrc[lid]), saddr)
            if key in reverse_routed:
                continue
            reverse_routed.add(key)
            r_cable.append(cmap[int(cable_of[lid])])
            r_side.append(int(side_of[lid]))
            r_addr.append(saddr)
        # The pair's destination address lives on the interface the destination replies from.
        lid = int(pr["back"][0])
        addr_cable.append(cmap[int(cable_of[lid])])
        addr_side.append(int(side_of[lid]))
        addr_value.append(daddr)
        sn = int(lsrc[pr["path"][0]])
        dn = int(ldst[pr["path"][-1]])
        port = next_port.get(dn, FIRST_PORT)
        if port > 65535:
            raise BackendError(f"ns3: node {dn} receives from more than 64k sources")
        next_port[dn] = port + 1
        bottleneck = float(gbps[pr["path"]].min()) * 1e9
        path_mtu = int(cable_mtu[[cmap[int(cable_of[x])] for x in pr["path"]]].min())
        c_src.append(sn)
        c_dst.append(dn)
        c_daddr.append(daddr)
        c_port.append(port)
        c_mtu.append(path_mtu)
        c_pace.append(bottleneck)
        rtt_ns = float(lat[pr["path"]].sum() + lat[pr["back"]].sum())
        max_bdp = max(max_bdp, bottleneck / 8.0 * rtt_ns * 1e-9)

    # 1 MiB floor (measured): ACKs queue behind data on shared NIC links, inflating the RTT.
    sock_buf = opts.socket_buffer_bytes or int(max(1 << 20, 2 * max_bdp))
    out.arrays.update(_link_events(topology, local, cable_of, side_of, cmap, gbps))
    at = [round(float(x)) for x in ep.at_ns]
    hops = [(at[e], cmap[int(cable_of[lid])], int(side_of[lid]), PAIR_ADDRESS_BASE + i)
            for e, i, pth in fwd_moves for lid in pth.tolist()]
    hops += [(at[e], cmap[int(cable_of[lid])], int(side_of[lid]), src_addr[i])
             for e, i, pth in back_moves for lid in pth.tolist()]
    out.arrays.update(reroute_arrays(hops, [
        (at[e], q, [local[int(x)] for x in pth], float(lat[pth].sum()))
        for e, q, pth in fluid_moves]))
    out.arrays.update(slowdown_arrays(trace, nr))
    out.arrays["fluid_pair"] = fluid_pair
    out.arrays.update(a)
    out.arrays.update(
        conn=conn,
        fluid_cap=np.array([gbps[x] / 8.0 for x in fluid_link_ids], np.float64),
        fluid_ptr=fptr,
        fluid_links=flink,
        fluid_lat=fluid_lat,
        cable_link_ab=cab_fwd.astype(np.int64),  # directed link of each cable end (-1: none)
        cable_link_ba=cab_rev.astype(np.int64),
        cable_a=lsrc[cab_fwd],
        cable_b=ldst[cab_fwd],
        cable_bps_ab=gbps[cab_fwd] * 1e9,
        cable_bps_ba=gbps[rev_or_fwd] * 1e9,
        cable_delay_ns=np.rint(lat[cab_fwd]).astype(np.int64),
        cable_mtu=cable_mtu,
        cable_host_a=is_gpu[lsrc[cab_fwd]].astype(np.int64),
        cable_host_b=is_gpu[ldst[cab_fwd]].astype(np.int64),
        route_cable=np.array(r_cable, np.int64),
        route_side=np.array(r_side, np.int64),
        route_addr=np.array(r_addr, np.int64),
        addr_cable=np.array(addr_cable, np.int64),
        addr_side=np.array(addr_side, np.int64),
        addr_value=np.array(addr_value, np.int64),
        conn_src=np.array(c_src, np.int64),
        conn_dst=np.array(c_dst, np.int64),
        conn_daddr=np.array(c_daddr, np.int64),
        conn_port=np.array(c_port, np.int64),
        conn_mtu=np.array(c_mtu, np.int64),
        conn_pace_bps=np.array(c_pace, np.float64),
    )
    out.meta = {
        "options": opts.to_dict(),
        "num_nodes": num_nodes,
        "socket_buffer_bytes": sock_buf,
        "packet_pairs": len(pairs),
        "fluid_pairs": int(pair_is_fluid.sum()),
        "packet_flows": int((conn >= 0).sum()),
        "fluid_flows": int(len(flow_ids) - (conn >= 0).sum()),
        "packet_bytes": int(a["bytes"][conn >= 0].sum()),
        "fluid_bytes": int(a["bytes"][flow_ids].sum() - a["bytes"][conn >= 0].sum()),
        "cables": len(used_cables),
        "pair_reroutes": len(fwd_moves) + len(back_moves) + len(fluid_moves),
        "off_route_flows": off_route,
    }
    return out


def _off_route_flows(topology: Topology, ops: Any, flow_ids: np.ndarray, fsrc: np.ndarray,
                     fdst: np.ndarray, first: np.ndarray, group_of_flow: np.ndarray,
                     packet_group: np.ndarray) -> int:
    """Packet flows this replay carries on other links than their own ECMP key gives (the
    links the flow backend and htsim put them on): a later flow of a pair, under
    ``network.ecmp: flow``, whose own path differs from its connection's (its pair's first
    flow's). 0 under ``connection``, where every flow of a connection shares its key."""
    pk = packet_group[group_of_flow]
    if not pk.any():
        return 0
    node = topology.rank_node
    router = topology.router
    ids = router.path_ids(node[fsrc], node[fdst], topology.ecmp_keys(ops, flow_ids))
    # path ids number (pair, ECMP bucket) entries: map each to the first id of its link list
    toff, tlinks = router.path_table()
    canon: dict[bytes, int] = {}
    lut = np.zeros(len(toff) - 1, dtype=np.int64)
    for i in np.unique(ids).tolist():
        lut[i] = canon.setdefault(tlinks[toff[i]:toff[i + 1]].tobytes(), i)
    own = lut[ids]
    return int(((own != own[first][group_of_flow]) & pk).sum())
