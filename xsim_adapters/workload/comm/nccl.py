"""NCCL's cost model of a collective beyond moving its bytes: one home for its constants.

The network simulators move a collective's bytes at the links' rates; what NCCL adds on top is
(a) latency: a base latency per call plus a latency per step or hop, by algorithm, protocol and
link type, and (b) bandwidth efficiency: LL carries 4 data bytes per 8 on the wire (flag words),
LL128 120 per 128, Simple the whole line; NVLink reaches NCCL's per-link rate, not the spec
rate; NVLS reaches ``nvlsEfficiency`` of it. NCCL's tuner predicts, per call, the time of every
(algorithm, protocol) pair (``ncclTopoGetAlgoTime``: ``t = latency + bytes / bandwidth``) and
runs the fastest; :func:`tuner_table` reproduces that table from the group's topology and
:func:`choose` picks from it (``collectives.algorithm: auto``).

The lowering turns the chosen pair into one timed delay per member before its first send
(``extra_ns``): the latency plus the time the protocol's and the link's lower bandwidth add to
the lowering's flows at nominal rates (:func:`algo_cost`). The flows still carry exactly the
collective's bytes, so a congested network slows them as before.

Sources: NVIDIA/nccl@5067397 (NCCL 2.30.7) ``src/graph/tuning.cc`` (``baseLatencies``,
``hwLatencies``, ``llMaxBws``, ``nvlsEfficiency``, the per-algorithm bandwidth refinements,
``treeCorrectionFactor``, ``getNetOverhead``, ``ncclTopoGetAlgoTime``), ``src/graph/topo.h``
(``SM80_NVLINK_BW`` ... per NVLink, ``PCI_BW``), ``src/transport/nvls.cc``
(``NVLS_NCHANNELS_SM90`` / ``SM100``); tabled in ``reference/gpu-calibration.md`` §6-7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("ring", "tree", "nvls", "hierarchical")

# tuning.cc baseLatencies (LL, LL128, Simple), microseconds per collective call.
BASE_LATENCY_US = {
    "ring": (6.6, 14.0, 8.4),
    "tree": (6.8, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),  # NVLS and NVLSTree
}
# tuning.cc hwLatencies[hw][algorithm] (LL, LL128, Simple), microseconds per step (ring) or
# per hop (tree); NVLS: per call over NVLink / per network hop (NVLSTree's row on the network).
HW_LATENCY_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0), "nvls": (0.0, 0.0, 25.0)},
    "pci": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0), "nvls": (0.0, 0.0, 0.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0), "nvls": (0.0, 0.0, 20.9)},
}
# Backwards-compatible names of the ring rows.
RING_BASE_LATENCY_US = BASE_LATENCY_US["ring"]
RING_STEP_LATENCY_US = {hw: HW_LATENCY_US[hw]["ring"] for hw in HW_LATENCY_US}
# tuning.cc getNetOverhead: host post overhead per inter-node ring step, us (x86 Intel / other
# 1.0; AMD 2.0; we assume Intel), x3 for Simple; it floors the intra-node step latency.
NET_OVERHEAD_US = 1.0
NET_OVERHEAD_SIMPLE_FACTOR = 3.0
# tuning.cc: Ring LL bus bandwidth = 0.5 x busBw (half of every LL line is flags); Ring LL128
# = 0.92 x busBw; Simple = busBw. Dimensionless.
PROTOCOL_BW_FACTOR = (0.5, 0.92, 1.0)
# tuning.cc, Tree all-reduce: busBw x 0.92; Tree LL: busBw / 3.8; Tree LL128: x 7/9 on one
# node, x 120/128 across nodes. Dimensionless.
TREE_BW_FACTOR = 0.92
TREE_LL_BW_FACTOR = 1.0 / 3.8
TREE_LL128_BW_FACTOR_1NODE = 7.0 / 9.0
TREE_LL128_BW_FACTOR_NET = 120.0 / 128.0
# tuning.cc llMaxBws, GB/s: one node by architecture (Volta, Ampere, Hopper, Blackwell); several
# nodes by CPU (row 0, Intel: 2 nodes, >= 4 nodes). Caps the LL protocol's bandwidth.
LL_MAX_BW_1NODE_GBPS = {70: 39.0, 80: 87.7, 90: 141.0, 100: 282.0}
LL_MAX_BW_NET_GBPS = (39.0, 20.4)  # (2 nodes, more)
# tuning.cc treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B .. 256 MB (Tree all-reduce).
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)
# tuning.cc per-channel caps, GB/s per channel of the algorithm's graph, by architecture and
# node count (1 node, 2 nodes, >= 4 nodes): perChMaxRingLL128Bws, perChMaxTreeBws,
# perChMaxTreeLL128Bws, perChMaxNVLSTreeBws (Volta, Ampere, Hopper, Blackwell).
PER_CH_MAX_RING_LL128_GBPS = {70: (20.0, 20.0, 20.0), 80: (20.0, 20.0, 20.0),
                              90: (36.7, 36.7, 36.7), 100: (40.0, 40.0, 40.0)}
PER_CH_MAX_TREE_GBPS = {70: (26.5, 18.5, 10.0), 80: (24.0, 23.6, 17.8),
                        90: (38.7, 41.4, 36.0), 100: (70.0, 42.8, 24.0)}
PER_CH_MAX_TREE_LL128_GBPS = {70: (20.0, 20.0, 20.0), 80: (20.0, 20.0, 20.0),
                              90: (36.7, 36.7, 29.0), 100: (55.6, 31.67, 20.0)}
PER_CH_MAX_NVLS_TREE_GBPS = {70: (26.5, 18.5, 10.0), 80: (24.0, 23.6, 17.8),
                             90: (0.0, 57.7, 45.5), 100: (0.0, 96.0, 80.0)}
# search.cc speed arrays, GB/s per channel, that the topology search tries from the top
# (speedArrayIntra / sm90SpeedArrayIntra; Inter for graphs across nodes), and its channel cap
# (MAXCHANNELS / 2): the graph's nChannels and per-channel bandwidth the caps above multiply.
SPEEDS_INTRA_GBPS = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEEDS_INTRA_SM90_GBPS = (60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
SPEEDS_INTER_GBPS = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
                     4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
SPEEDS_INTER_SM90_GBPS = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                          2.4, 1.2, 0.24, 0.12)
GRAPH_MAX_CHANNELS = 16
# search.cc: a graph is duplicated (channels x2, bandwidth /2) when its per-channel bandwidth
# is >= 25 GB/s, except on SM90+ below 50 GB/s with more than 4 channels. GB/s.
GRAPH_DUP_MIN_GBPS = 25.0
GRAPH_DUP_SM90_MIN_GBPS = 50.0
# tuning.cc nvlsEfficiency by architecture (Hopper 0.85, Blackwell 0.74). Dimensionless.
NVLS_EFFICIENCY = {90: 0.85, 100: 0.74}
# nvls.cc NVLS_NCHANNELS_SM90 = 16, NVLS_NCHANNELS_SM100 = 32 (24 on one NVL domain); tuning.cc
# scales NVLS bandwidth by (nChannels - 1) / nChannels.
NVLS_CHANNELS = {90: 16, 100: 24}
# NVLS needs > 2 GPUs per server: NCCL's symmetric kernels use multimem (NVLS) only for teams of
# more than 2 ranks (src/sym_kernels.cc ``hasLsaMultimem = nvlsSupport && nRanks > 2``); with 2,
# NVLS moves S + S/2 over each link where a ring moves S (docs/collectives.md). Ranks.
NVLS_MIN_RANKS_PER_SERVER = 3
# tuning.cc ring all-reduce across nodes with >= 64 bytes per rank and channel: latency x1.4 on
# >= SM80 (x1.9 before). Dimensionless.
NET_SIMPLE_LATENCY_FACTOR = 1.4
# topo.h per-NVLink bandwidth NCCL's topology search assumes, over the spec rate of one NVLink
# per direction (NVLink2/3/4 25 GB/s, NVLink5 50 GB/s; Ampere/Hopper blogs, gpu-calibration.md):
# SM70 20/25, SM80 20/25, SM90 20.6/25, SM100 40.1/50. Dimensionless.
NVLINK_BW_EFFICIENCY_BY_CC = {70: 20.0 / 25.0, 80: 20.0 / 25.0, 90: 20.6 / 25.0,
                              100: 40.1 / 50.0}
NVLINK_BW_EFFICIENCY = NVLINK_BW_EFFICIENCY_BY_CC[80]
# topo.h PCI_BW = 12 GB/s for a PCIe Gen3 x16 link of 15.75 GB/s per direction. Dimensionless.
PCI_BW_EFFICIENCY = 12.0 / 15.75


def arch(cc: int) -> int:
    """NCCL's architecture class of a compute capability x 10: 70, 80, 90 or 100 (0 -> 80)."""
    if cc >= 100:
        return 100
    if cc >= 90:
        return 90
    if cc >= 80 or cc == 0:
        return 80
    return 70


def link_efficiency(link: str, cc: int) -> float:
    """NCCL's reachable fraction of a link's nominal rate (``nvlink``, ``pci``; ``net`` 1)."""
    if link == "nvlink":
        return NVLINK_BW_EFFICIENCY_BY_CC[arch(cc)]
    if link == "pci":
        return PCI_BW_EFFICIENCY
    return 1.0


@dataclass(frozen=True)
class Fabric:
    """What NCCL's tuner sees of a group of ranks (rates nominal, GB/s, one direction)."""

    n: int  # ranks
    servers: int
    ppn: int  # ranks on the fullest server
    intra_GBps: float  # slowest scale-up rate of a member (inf with one rank per server)
    nic_GBps: float  # slowest member NIC (inf on one server)
    intra_link: str = "nvlink"  # "nvlink" or "pci"
    cc: int = 80  # smallest compute capability x 10 among the members
    nvls: bool = False  # every member's server does NVLink SHARP
    channels: int = 1  # ring channels the lowering opens (one per NIC across servers)
    nics: int = 1  # distinct NICs the members of the fullest server use (several servers)

    @property
    def bus_nominal_GBps(self) -> float:
        """Per-rank bus bandwidth at nominal rates: the scale-up rate, or on several servers
        the smaller of it and the server's aggregate NIC rate (rail-aligned channels)."""
        if self.servers < 2:
            return self.intra_GBps
        return min(self.intra_GBps, self.ppn * self.nic_GBps)

    @property
    def bus_GBps(self) -> float:
        """NCCL's busBw (nChannels x per-channel graph bandwidth): nominal x link efficiency."""
        intra = self.intra_GBps * link_efficiency(self.intra_link, self.cc)
        if self.servers < 2:
            return intra
        return min(intra, self.ppn * self.nic_GBps)


def graph(fab: Fabric) -> tuple[int, float]:
    """(nChannels, GB/s per channel) of NCCL's ring / tree graph for ``fab`` (search.cc): the
    fastest speed of the search's array a member's scale-up rate (one server) or its server's
    NICs (one channel per NIC, several servers) can carry, as many channels as fit, then the
    duplication rule. The per-channel caps of the tuner multiply these channels."""
    sm90 = arch(fab.cc) >= 90
    speeds: tuple[float, ...]
    if fab.servers < 2:
        total = fab.intra_GBps * link_efficiency(fab.intra_link, fab.cc)
        speeds = SPEEDS_INTRA_SM90_GBPS if sm90 else SPEEDS_INTRA_GBPS
        speed = next((x for x in speeds if x <= total), speeds[-1])
        nch = max(1, min(GRAPH_MAX_CHANNELS, int(total // speed)))
    else:
        speeds = SPEEDS_INTER_SM90_GBPS if sm90 else SPEEDS_INTER_GBPS
        nch = max(1, min(GRAPH_MAX_CHANNELS, fab.nics))
        speed = next((x for x in speeds if x <= fab.bus_GBps / nch), speeds[-1])
    if speed >= GRAPH_DUP_MIN_GBPS and not (sm90 and speed < GRAPH_DUP_SM90_MIN_GBPS
                                            and nch > 4):
        dup = min(2 * nch, GRAPH_MAX_CHANNELS)
        speed /= -(-dup // nch)
        nch = dup
    return nch, speed


def _node_index(fab: Fabric) -> int:
    return 0 if fab.servers == 1 else 1 if fab.servers == 2 else 2


@dataclass(frozen=True)
class AlgoCost:
    """NCCL's predicted cost of one (algorithm, protocol) for one call."""

    algorithm: str
    protocol: str
    latency_us: float
    algbw_GBps: float  # NCCL's algorithm bandwidth (bytes per rank / time)
    bw_ratio: float  # nominal bus bandwidth / the protocol's bus bandwidth (>= 1 slows flows)

    def time_us(self, nbytes: int) -> float:
        """``ncclTopoGetAlgoTime``: latency + bytes / (1000 x algbw)."""
        return self.latency_us + nbytes / (1000.0 * self.algbw_GBps)


def ring_steps(kind: str, n: int) -> int:
    """Ring steps of a collective over ``n`` ranks (all-reduce 2(n-1), otherwise n-1)."""
    if n < 2:
        return 0
    return 2 * (n - 1) if kind == "all_reduce" else n - 1


def available(kind: str, fab: Fabric) -> tuple[str, ...]:
    """Algorithms NCCL's tuner considers for ``kind`` on ``fab`` (``auto`` picks among them):
    ring always; tree for all-reduce; NVLS (NVLSTree across servers) for all-reduce where every
    server has NVLink SHARP and holds >= 3 members, and for reduce-scatter / all-gather on one
    such server (tuning.cc 2.30.7). Hierarchical is not an NCCL algorithm."""
    if fab.n < 2:
        return ("ring",)
    out = ["ring"]
    nvls = (fab.nvls and fab.ppn >= NVLS_MIN_RANKS_PER_SERVER
            and arch(fab.cc) in NVLS_EFFICIENCY)
    if kind == "all_reduce":
        out.append("tree")
        if nvls:
            out.append("nvls")
    elif nvls and fab.servers == 1:  # NVLS RS / AG across nodes needs CollNet (enqueue.cc)
        out.append("nvls")
    return tuple(out)


def _ll_max(fab: Fabric) -> float:
    if fab.servers == 1:
        return LL_MAX_BW_1NODE_GBPS[arch(fab.cc)]
    return LL_MAX_BW_NET_GBPS[0 if fab.servers <= 2 else 1]


def _ll128_enabled(fab: Fabric) -> bool:
    # tuning.cc: LL128 on by default for NVLink (or PCIe-bridge) paths on SM70/80/90/100.
    return fab.intra_link == "nvlink" and fab.cc in (0, 70, 80, 90, 100)


def tuner_table(kind: str, nbytes: int, fab: Fabric) -> list[AlgoCost]:
    """Every (algorithm, protocol) NCCL's tuner would consider for ``kind`` of ``nbytes`` per
    rank on ``fab``, with its latency and bandwidth (tuning.cc ``ncclTopoTuneModel``)."""
    n, nodes = fab.n, fab.servers
    bus = fab.bus_GBps
    nominal = fab.bus_nominal_GBps
    steps = ring_steps(kind, n)
    intra_hw = fab.intra_link
    nch, _ = graph(fab)
    a, ni = arch(fab.cc), _node_index(fab)
    out: list[AlgoCost] = []
    for algo in available(kind, fab):
        for p, proto in enumerate(PROTOCOLS):
            if algo == "nvls" and proto != "Simple":
                continue
            if proto == "LL128" and not _ll128_enabled(fab):
                continue
            lat = _latency_us(algo, kind, p, fab, steps, intra_hw, nbytes)
            if algo == "ring":
                bw = bus * PROTOCOL_BW_FACTOR[p]
                if proto == "LL":
                    bw = min(_ll_max(fab), bw)
                elif proto == "LL128":
                    bw = min(bw, nch * PER_CH_MAX_RING_LL128_GBPS[a][ni])
                algbw = bw * n / steps
            elif algo == "tree":
                bw = min(bus * TREE_BW_FACTOR, nch * PER_CH_MAX_TREE_GBPS[a][ni])
                if proto == "LL":
                    bw = min(bw * TREE_LL_BW_FACTOR, _ll_max(fab))
                elif proto == "LL128":
                    bw = min(bw * (TREE_LL128_BW_FACTOR_1NODE if nodes == 1
                                   else TREE_LL128_BW_FACTOR_NET),
                             nch * PER_CH_MAX_TREE_LL128_GBPS[a][ni])
                log = int(math.log2(max(nbytes >> 6, 1)))
                corr = TREE_CORRECTION[p][log] if 0 <= log < 23 else 1.0
                bw *= corr
                algbw = bw * 0.5
            else:  # nvls (one server) / NVLSTree (several)
                link = nvls_link_GBps(fab)
                if kind != "all_reduce":
                    # RS / AG: intraBw x (ppn-1)/ppn, left as NCCL's bandwidth (tuning.cc
                    # converts no busBw of a non-ring RS / AG to an algorithm bandwidth)
                    out.append(AlgoCost(algo, proto, lat, link * (fab.ppn - 1) / fab.ppn,
                                        fab.intra_GBps / link))
                    continue
                # The switch link's reachable rate; NCCL counts it twice for an all-reduce
                # (reduce and broadcast pipelined), an accounting of its own busBw: the
                # lowering's flows carry the bytes each link really moves (algorithms.py), so
                # their slowdown is the link rate ratio alone.
                bw = link * 2.0
                if nodes > 1:
                    bw = min(bw, fab.ppn * fab.nic_GBps * (2.0 if nodes <= 2 else 1.0),
                             NVLS_CHANNELS[a] * PER_CH_MAX_NVLS_TREE_GBPS[a][ni])
                algbw = bw * n / ring_steps("all_reduce", n)
                out.append(AlgoCost(algo, proto, lat, algbw, fab.intra_GBps / link))
                continue
            out.append(AlgoCost(algo, proto, lat, algbw, nominal / bw if bw > 0 else 1.0))
    return out


def nvls_link_GBps(fab: Fabric) -> float:
    """The rate NVLS moves data over a GPU's switch link: scale-up rate x NCCL's link
    efficiency x nvlsEfficiency x (nChannels - 1) / nChannels (tuning.cc), GB/s."""
    a = arch(fab.cc)
    ch = NVLS_CHANNELS[a]
    return (fab.intra_GBps * link_efficiency(fab.intra_link, fab.cc) * NVLS_EFFICIENCY[a]
            * (ch - 1) / ch)


def _latency_us(algo: str, kind: str, p: int, fab: Fabric, steps: int, intra_hw: str,
                nbytes: int) -> float:
    nodes = fab.servers
    if algo == "ring":
        intra = HW_LATENCY_US[intra_hw]["ring"][p]
        inter_row = "tree" if fab.ppn == 1 else "ring"  # ppn = 1: fully exposed (tuning.cc)
        inter = HW_LATENCY_US["net"][inter_row][p]
        if nodes > 1:
            ovh = NET_OVERHEAD_US * (NET_OVERHEAD_SIMPLE_FACTOR if p == 2 else 1.0)
            intra = max(intra, ovh)
        n_inter = 0 if nodes < 2 else (2 if kind == "all_reduce" else 1) * (nodes - 1)
        lat = BASE_LATENCY_US["ring"][p] + (steps - n_inter) * intra + n_inter * inter
        if (p == 2 and nodes > 1 and kind == "all_reduce"
                and nbytes / (max(1, fab.channels) * fab.n) >= 64):
            lat *= NET_SIMPLE_LATENCY_FACTOR
        return lat
    if algo == "tree":
        intra = HW_LATENCY_US[intra_hw]["tree"][p]
        inter = HW_LATENCY_US["net"]["tree"][p]
        return BASE_LATENCY_US["tree"][p] + 2 * ((fab.ppn - 1) * intra
                                                 + int(math.log2(nodes)) * inter)
    # NVLS on one server: the NVLink hop only; NVLSTree: + 2 log2(nodes) network hops.
    lat = HW_LATENCY_US["nvlink"]["nvls"][p]
    if nodes > 1:
        lat += 2 * int(math.log2(nodes)) * HW_LATENCY_US["net"]["nvls"][p]
    return lat


def choose(kind: str, nbytes: int, fab: Fabric, algorithm: str = "auto") -> AlgoCost:
    """The (algorithm, protocol) NCCL would run: the least predicted time among
    :func:`tuner_table`, restricted to ``algorithm`` unless ``auto``. ``hierarchical`` (not an
    NCCL algorithm) is costed as its three ring phases (:func:`hierarchical_cost`)."""
    if algorithm == "hierarchical":
        return hierarchical_cost(kind, nbytes, fab)
    table = tuner_table(kind, nbytes, fab)
    if algorithm != "auto":
        table = [c for c in table if c.algorithm == algorithm] or [
            c for c in table if c.algorithm == "ring"]
    return min(table, key=lambda c: c.time_us(nbytes))


def hierarchical_cost(kind: str, nbytes: int, fab: Fabric) -> AlgoCost:
    """Intra-server ring reduce-scatter, inter-server ring all-reduce per rail, intra-server
    ring all-gather (all-reduce; other kinds are one intra and one inter ring): NCCL's ring
    latencies per step of each phase, its protocol picked as for a ring over all ranks."""
    ring = choose(kind, nbytes, fab, "ring")
    p = PROTOCOLS.index(ring.protocol)
    m, nodes = fab.ppn, fab.servers
    intra = HW_LATENCY_US[fab.intra_link]["ring"][p]
    inter = HW_LATENCY_US["net"]["ring"][p]
    intra_steps = ring_steps(kind, m)
    inter_steps = ring_steps(kind, nodes)
    lat = BASE_LATENCY_US["ring"][p] + intra_steps * intra + inter_steps * inter
    return AlgoCost("hierarchical", ring.protocol, lat, ring.algbw_GBps, ring.bw_ratio)


@dataclass(frozen=True)
class RingCost:
    """NCCL's cost of one ring collective beyond the network time at nominal link rates."""

    protocol: str
    latency_ns: float  # base + per-step latency
    bandwidth_ns: float  # extra time from protocol and link efficiency at the nominal rate

    @property
    def total_ns(self) -> float:
        return self.latency_ns + self.bandwidth_ns

    @property
    def extra_ns(self) -> int:
        """The delay the lowering adds before each member's first send, ns."""
        return int(round(self.latency_ns + self.bandwidth_ns))


def delay_ns(cost: AlgoCost, flow_ns: float) -> int:
    """The timed delay standing for ``cost`` in front of a lowering whose flows take
    ``flow_ns`` at nominal rates: latency + flow_ns x (bw_ratio - 1), ns."""
    return int(round(cost.latency_us * 1e3 + max(0.0, flow_ns * (cost.bw_ratio - 1.0))))


def ring_cost(kind: str, n: int, nbytes: int, servers: int, bottleneck_GBps: float,
              bottleneck_link: str, channels: int = 1, cc: int = 80,
              nics: int = 1) -> RingCost:
    """NCCL's protocol choice and extra cost for a ring ``kind`` of ``nbytes`` (per rank) over
    ``n`` ranks on ``servers`` servers, whose slowest hop runs at ``bottleneck_GBps`` (nominal)
    over a link of type ``bottleneck_link`` (``nvlink``, ``pci`` or ``net``), its server
    contributing ``nics`` NICs (NCCL's graph channels across servers).

    Latency (tuning.cc): ``base + (steps - inter)·intra + inter·net`` with ``inter`` =
    2(servers-1) for an all-reduce and servers-1 otherwise (steps that cross servers).
    Bandwidth: each rank sends ``steps/n·S`` bytes at ``bottleneck x efficiency x factor``.
    """
    steps = ring_steps(kind, n)
    if steps == 0 or nbytes <= 0:
        return RingCost("Simple", 0.0, 0.0)
    intra_link = "nvlink" if bottleneck_link == "net" else bottleneck_link
    ppn = max(1, -(-n // servers))
    inf = float("inf")
    if bottleneck_link == "net":
        fab = Fabric(n, servers, ppn, inf, bottleneck_GBps / ppn, intra_link, cc,
                     channels=channels, nics=nics)
    else:
        fab = Fabric(n, servers, ppn, bottleneck_GBps, inf, intra_link, cc, channels=channels,
                     nics=nics)
    cost = choose(kind, nbytes, fab, "ring")
    nominal_ns = steps / n * nbytes / bottleneck_GBps  # bytes / (GB/s) = ns
    return RingCost(cost.protocol, cost.latency_us * 1e3,
                    max(0.0, nominal_ns * (cost.bw_ratio - 1.0)))
