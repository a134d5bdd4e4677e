// xsim replay engine for ns-3, compiled at run time by cppyy (see xsim_ns3/_sim.py).
//
// One Engine holds the whole DAG (CSR successor arrays, dependency counters), starts each op when
// its counter reaches zero, times compute as scheduled events, pushes flows as byte counts onto a
// persistent connection per (src, dst) node pair, and (optionally) times scale-up flows as a fluid
// max-min fair share over their links. No Python runs per packet or per flow.
//
// Units: times in ns (ns-3 resolution), rates in bit/s for ns-3 and bytes/ns for the fluid model.

#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"

#include "engine_whatif.h"
#include "xsim/maxmin.hpp"  // the shared max-min solver and fluid completion rule

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace xsim {

using namespace ns3;

enum OpKind { COMPUTE = 0, FLOW = 1, BARRIER = 2 };
enum Transport { DCTCP = 0, TCP = 1, UDP = 2 };

class Engine;

// A persistent connection between two nodes: flows are FIFO byte ranges of one stream.
class Conn {
  public:
    Engine* eng = nullptr;
    int transport = DCTCP;
    Ptr<Node> srcNode, dstNode;
    Ipv4Address dstAddr;
    uint16_t port = 0;
    uint32_t mtu = 0;         // smallest MTU on the pair's path (bytes)
    uint32_t chunk = 0;       // bytes per Send (TCP) or per datagram (UDP)
    double paceBps = 0;       // UDP only
    Ptr<Socket> tx, rx;
    bool connected = false;
    uint64_t enq = 0, sent = 0, recvd = 0;
    uint64_t packetsRx = 0;
    uint64_t timeouts = 0;  // retransmission timeouts (entries into CA_LOSS)
    std::deque<std::pair<int64_t, uint64_t>> flows;  // (op id, cumulative end offset)
    double paceNextNs = 0;
    bool paceScheduled = false;

    void Open();
    void Enqueue(int64_t op, uint64_t bytes);
    void Push();
    void OnConnect(Ptr<Socket> s) { connected = true; Push(); }
    void OnConnectFail(Ptr<Socket> s);
    void OnSend(Ptr<Socket> s, uint32_t avail) { Push(); }
    bool OnAcceptRequest(Ptr<Socket> s, const Address& a) { return true; }
    void OnAccept(Ptr<Socket> s, const Address& a) {
        rx = s;
        s->SetRecvCallback(MakeCallback(&Conn::OnRecv, this));
    }
    void OnRecv(Ptr<Socket> s);
    void PaceTick();
    void OnCongState(TcpSocketState::TcpCongState_t from, TcpSocketState::TcpCongState_t to) {
        if (to == TcpSocketState::CA_LOSS) ++timeouts;
    }
};

class Engine {
  public:
    // --- DAG ---
    int64_t n = 0;
    std::vector<int64_t> kind, dur, bytes, conn, sptr, sidx, pending;
    std::vector<double> t0, t1;
    int64_t done = 0;
    std::deque<int64_t> ready;
    bool draining = false;
    // --- network ---
    std::vector<Conn*> conns;
    std::vector<NetDeviceContainer> cables;  // device 0 at end a, device 1 at end b
    std::vector<Ipv4InterfaceContainer> ifaces;
    // --- fluid scale-up ---
    std::vector<int64_t> fptr, flink;  // per op: local fluid link ids [fptr[op], fptr[op+1])
    std::vector<double> fcap;          // bytes/ns per fluid link
    std::vector<double> flat;          // per op: path latency (ns) added after the last byte
    std::vector<int64_t> active;
    std::vector<double> rem, rate;
    MaxMinSolver fsolver;        // over the fluid links
    std::vector<double> frate;   // its output, per position in `active`
    double lastNs = 0;
    EventId fluidEv;
    uint64_t fluidRecomputes = 0;
    uint64_t queueDrops = 0;  // packets dropped by queue discs (overflow or RED forced drop)
    std::string error;
    // --- progress: "progress <done> <n> <sim ns>" lines on a pipe to the parent process ---
    int progressFd = -1;
    double progressIntervalS = 0.1;
    std::chrono::steady_clock::time_point progressLast;

    void OnQueueDrop(Ptr<const QueueDiscItem> item) { ++queueDrops; }

    void SetProgress(int fd, double intervalS) {
        progressFd = fd;
        progressIntervalS = intervalS;
    }

    // Report how far the replay is: always when `force`, else at most every progressIntervalS
    // of wall time (the clock is read only every 64 completions: cheap next to a packet).
    void Report(bool force) {
        if (progressFd < 0) return;
        auto now = std::chrono::steady_clock::now();
        if (!force && std::chrono::duration<double>(now - progressLast).count() < progressIntervalS)
            return;
        progressLast = now;
        char buf[96];
        int k = std::snprintf(buf, sizeof buf, "progress %lld %lld %lld\n", (long long)done,
                              (long long)n, (long long)Simulator::Now().GetNanoSeconds());
        if (k > 0 && ::write(progressFd, buf, size_t(k)) < 0) progressFd = -1;  // parent gone
    }

    // ---------- set-up ----------
    void LoadDag(int64_t nops, const int64_t* k, const int64_t* d, const int64_t* b,
                 const int64_t* c, int64_t nedges, const int64_t* ptr, const int64_t* idx,
                 const int64_t* pend) {
        n = nops;
        kind.assign(k, k + n);
        dur.assign(d, d + n);
        bytes.assign(b, b + n);
        conn.assign(c, c + n);
        sptr.assign(ptr, ptr + n + 1);
        sidx.assign(idx, idx + nedges);
        pending.assign(pend, pend + n);
        t0.assign(n, NAN);
        t1.assign(n, NAN);
        rem.assign(n, 0.0);
        rate.assign(n, 0.0);
    }

    void LoadFluid(int64_t nlinks, const double* capBytesPerNs, int64_t nentries,
                   const int64_t* ptr, const int64_t* links, const double* latNs) {
        fcap.assign(capBytesPerNs, capBytesPerNs + nlinks);
        fsolver.resize(size_t(nlinks));
        fptr.assign(ptr, ptr + n + 1);
        flink.assign(links, links + nentries);
        flat.assign(latNs, latNs + n);
    }

    // One point-to-point cable between nodes a and b: rates per direction, symmetric delay.
    void AddCable(uint32_t a, uint32_t b, double bpsAB, double bpsBA, int64_t delayNs,
                  uint32_t mtu, uint32_t devQueuePkts, int qdisc, uint32_t queuePkts,
                  double ecnK, int hostA, int hostB, int hostFq) {
        PointToPointHelper p2p;
        p2p.SetDeviceAttribute("Mtu", UintegerValue(mtu));
        p2p.SetChannelAttribute("Delay", TimeValue(NanoSeconds(delayNs)));
        p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize",
                     QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, devQueuePkts)));
        NetDeviceContainer devs = p2p.Install(NodeList::GetNode(a), NodeList::GetNode(b));
        devs.Get(0)->SetAttribute("DataRate", DataRateValue(DataRate(uint64_t(bpsAB))));
        devs.Get(1)->SetAttribute("DataRate", DataRateValue(DataRate(uint64_t(bpsBA))));
        // A queue disc must be installed before addresses are assigned, else FqCoDel is.
        for (int side = 0; side < 2; ++side) {
            TrafficControlHelper tch;
            double bps = side == 0 ? bpsAB : bpsBA;
            // ECN marking belongs to switch egress queues; a GPU's own NIC queue is a FIFO.
            bool host = side == 0 ? hostA : hostB;
            if (qdisc == DCTCP && !host) {
                // Step marking at K packets on the instantaneous queue (QW = 1), as DCTCP wants.
                tch.SetRootQueueDisc(
                    "ns3::RedQueueDisc", "UseEcn", BooleanValue(true), "UseHardDrop",
                    BooleanValue(false), "Gentle", BooleanValue(false), "QW", DoubleValue(1.0),
                    "MinTh", DoubleValue(ecnK), "MaxTh", DoubleValue(ecnK + 1), "LInterm",
                    DoubleValue(1.0), "MeanPktSize", UintegerValue(mtu), "MaxSize",
                    QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, queuePkts)),
                    "LinkBandwidth", DataRateValue(DataRate(uint64_t(bps))), "LinkDelay",
                    TimeValue(NanoSeconds(delayNs)));
            } else if (host && hostFq) {
                // A GPU's NIC under TCP: per-flow fair queuing (DRR, a new or sparse flow such
                // as a pure-ACK stream is served first). With one FIFO here the ACKs of a
                // connection into this GPU waited behind the whole windows of its outgoing
                // connections (nothing marks or drops at a sender's own NIC, so those windows
                // grow to the socket buffer): on uneven-layers (an A100 in two DP rings at once)
                // that inflated the incoming flows' RTT ~20x and cost DCTCP +5% per iteration.
                // CoDel is kept out of the way (targets far above any sojourn here): this is
                // fair queuing, not AQM.
                tch.SetRootQueueDisc(
                    "ns3::FqCoDelQueueDisc", "Target", StringValue("1s"), "Interval",
                    StringValue("10s"), "UseEcn", BooleanValue(false), "MaxSize",
                    QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, queuePkts)));
            } else {
                tch.SetRootQueueDisc(
                    "ns3::FifoQueueDisc", "MaxSize",
                    QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, queuePkts)));
            }
            QueueDiscContainer qd = tch.Install(devs.Get(side));
            qd.Get(0)->TraceConnectWithoutContext("Drop",
                                                  MakeCallback(&Engine::OnQueueDrop, this));
            WatchQueue(qd.Get(0));
        }
        Ipv4AddressHelper addr;
        uint32_t net = 0x0A000000u + uint32_t(cables.size()) * 4u;  // 10.0.0.0 + /30 per cable
        addr.SetBase(Ipv4Address(net), Ipv4Mask("255.255.255.252"));
        ifaces.push_back(addr.Assign(devs));
        cables.push_back(devs);
    }

    // A /32 address on node's interface of the cable end (used as a per-pair endpoint).
    void AddPairAddress(uint32_t cable, int side, uint32_t address) {
        Ptr<NetDevice> dev = cables[cable].Get(side);
        Ptr<Ipv4> ip = dev->GetNode()->GetObject<Ipv4>();
        int32_t iface = ip->GetInterfaceForDevice(dev);
        ip->AddAddress(iface, Ipv4InterfaceAddress(Ipv4Address(address), Ipv4Mask("255.255.255.255")));
    }

    // Host routes: at the sending end of each cable hop, `address` leaves through that cable.
    void AddRoutes(int64_t count, const int64_t* cable, const int64_t* side,
                   const int64_t* address) {
        Ipv4StaticRoutingHelper helper;
        for (int64_t i = 0; i < count; ++i) {
            int s = int(side[i]);
            Ptr<NetDevice> dev = cables[cable[i]].Get(s);
            Ptr<Ipv4> ip = dev->GetNode()->GetObject<Ipv4>();
            Ptr<Ipv4StaticRouting> rt = helper.GetStaticRouting(ip);
            Ipv4Address nextHop = ifaces[cable[i]].GetAddress(1 - s);
            rt->AddHostRouteTo(Ipv4Address(uint32_t(address[i])), nextHop,
                               uint32_t(ip->GetInterfaceForDevice(dev)));
        }
    }

    int64_t AddConn(uint32_t srcNode, uint32_t dstNode, uint32_t dstAddr,
                    uint16_t port, int transport, uint32_t mtu, double paceBps) {
        Conn* c = new Conn();
        c->eng = this;
        c->transport = transport;
        c->srcNode = NodeList::GetNode(srcNode);
        c->dstNode = NodeList::GetNode(dstNode);
        c->dstAddr = Ipv4Address(dstAddr);
        c->port = port;
        c->mtu = mtu;
        c->chunk = transport == UDP ? mtu - 28 : 65536;  // UDP: one datagram fills the MTU
        c->paceBps = paceBps;
        conns.push_back(c);
        return int64_t(conns.size()) - 1;
    }

    // ---------- run ----------
    void Start() {
        // Sockets must connect from inside Simulator::Run: a TCP Connect before Run segfaults
        // in this wheel (measured).
        for (Conn* c : conns) Simulator::ScheduleNow(&Conn::Open, c);
        for (int64_t i = 0; i < n; ++i)
            if (pending[i] == 0) ready.push_back(i);
        Simulator::ScheduleNow(&Engine::Drain, this);
        for (size_t i = 0; i < linkEvents.size(); ++i)
            Simulator::Schedule(NanoSeconds(linkEvents[i].atNs), &Engine::ApplyLinkEvent, this,
                                int64_t(i));
        ScheduleReroutes();  // after the link events: same-time events run in schedule order
    }

    void Drain() {
        if (draining) return;
        draining = true;
        while (!ready.empty()) {
            int64_t op = ready.front();
            ready.pop_front();
            StartOp(op);
        }
        draining = false;
    }

    void StartOp(int64_t op) {
        t0[op] = double(Simulator::Now().GetNanoSeconds());
        if (kind[op] == COMPUTE && dur[op] > 0) {
            Simulator::Schedule(NanoSeconds(ComputeDelayNs(op)), &Engine::Finish, this, op);
        } else if (kind[op] == FLOW && dur[op] > 0) {
            // trace schema 2: a flow's duration is its start latency (NCCL's per-call cost)
            Simulator::Schedule(NanoSeconds(dur[op]), &Engine::BeginFlow, this, op);
        } else if (kind[op] == FLOW) {
            BeginFlow(op);
        } else {
            Finish(op);  // barriers and zero-length computes take no time
        }
    }

    // A flow's first byte: onto its connection, or into the fluid scale-up model.
    void BeginFlow(int64_t op) {
        if (bytes[op] <= 0) {
            Finish(op);  // an empty flow takes no time
        } else if (conn[op] >= 0) {
            conns[conn[op]]->Enqueue(op, uint64_t(bytes[op]));
        } else {
            FluidAdd(op);
        }
    }

    void Finish(int64_t op) {
        t1[op] = double(Simulator::Now().GetNanoSeconds());
        ++done;
        for (int64_t e = sptr[op]; e < sptr[op + 1]; ++e)
            if (--pending[sidx[e]] == 0) ready.push_back(sidx[e]);
        Drain();
        if (done == n) {
            Report(true);
            Simulator::Stop();
        } else if ((done & 63) == 0) {
            Report(false);
        }
    }

    // ---------- fluid scale-up model: max-min fair share of each link's capacity ----------
    void FluidAdd(int64_t op) {
        FluidAdvance();
        rem[op] = double(bytes[op]);
        active.push_back(op);
        FluidResolve();
    }

    void FluidAdvance() {
        double now = double(Simulator::Now().GetNanoSeconds());
        double dt = now - lastNs;
        if (dt > 0)
            for (int64_t op : active) rem[op] -= rate[op] * dt;
        lastNs = now;
    }

    void FluidTick() {
        FluidAdvance();
        std::vector<int64_t> still;
        for (int64_t op : active) {
            // Done if it would finish within half a nanosecond (ns-3's clock tick).
            if (fluid_done(rem[op], rate[op])) {
                int64_t lat = int64_t(std::llround(FLat(op)));
                Simulator::Schedule(NanoSeconds(lat), &Engine::Finish, this, op);
            } else {
                still.push_back(op);
            }
        }
        active.swap(still);
        FluidResolve();
    }

    void FluidResolve() {
        ++fluidRecomputes;
        if (fluidEv.IsPending()) fluidEv.Cancel();
        if (active.empty()) return;
        // Progressive filling over the links the active flows use: the one solver every
        // compiled engine shares (xsim/maxmin.hpp, from the core package's include directory).
        frate.resize(active.size());
        fsolver.solve(
            active.size(),
            [this](std::size_t i) { return LinkSpan<int64_t>{FB(active[i]), FE(active[i])}; },
            fcap.data(), frate.data());
        for (size_t i = 0; i < active.size(); ++i) rate[active[i]] = frate[i];
        double next = INFINITY;
        for (int64_t op : active)
            if (rate[op] > 0) next = std::min(next, std::max(0.0, rem[op]) / rate[op]);
        if (std::isfinite(next))
            fluidEv = Simulator::Schedule(NanoSeconds(fluid_wait_ticks(next)), &Engine::FluidTick,
                                          this);
    }

    // ---------- timed link events (degrade / fail / restore) ----------
    struct LinkEvent { int64_t atNs; int fluid; int64_t index; int side; double value; };
    std::vector<LinkEvent> linkEvents;
    std::vector<Ptr<RateErrorModel>> downModels;  // per cable end, created on first failure

    // fluid: index = local fluid link, value = bytes/ns; packet: index = cable, side = sending
    // end, value = bit/s (0: the link drops every packet until restored).
    void AddLinkEvent(int64_t atNs, int fluid, int64_t index, int side, double value) {
        linkEvents.push_back({atNs, fluid, index, side, value});
    }

    void ApplyLinkEvent(int64_t i) {
        const LinkEvent& e = linkEvents[i];
        if (e.fluid) {
            FluidAdvance();
            fcap[e.index] = e.value;
            FluidResolve();
            return;
        }
        Ptr<NetDevice> tx = cables[e.index].Get(e.side);
        Ptr<NetDevice> rx = cables[e.index].Get(1 - e.side);
        if (downModels.size() < 2 * cables.size()) downModels.resize(2 * cables.size());
        Ptr<RateErrorModel>& em = downModels[2 * e.index + e.side];
        if (e.value <= 0) {
            if (!em) {
                em = CreateObject<RateErrorModel>();
                em->SetUnit(RateErrorModel::ERROR_UNIT_PACKET);
                em->SetRate(1.0);
                rx->SetAttribute("ReceiveErrorModel", PointerValue(em));
            }
            em->Enable();
        } else {
            if (em) em->Disable();
            tx->SetAttribute("DataRate", DataRateValue(DataRate(uint64_t(e.value))));
        }
    }

    // ---------- what-if (engine_whatif.h): slowdowns, reroutes, queue telemetry ----------
    Slowdowns slow;
    Reroutes reroute;
    QueueTelemetry queues;

    int64_t ComputeDelayNs(int64_t op) const {
        return slow.DelayNs(op, dur[op], Simulator::Now().GetNanoSeconds());
    }
    const int64_t* FB(int64_t op) const { return reroute.Begin(op, fptr, flink); }
    const int64_t* FE(int64_t op) const { return reroute.End(op, fptr, flink); }
    double FLat(int64_t op) const { return reroute.Latency(op, flat); }
    void WatchQueue(Ptr<QueueDisc> q) { queues.Watch(q); }

    void ScheduleReroutes() {
        for (int64_t t : reroute.Times())
            Simulator::Schedule(NanoSeconds(t), &Engine::ApplyReroutes, this, t);
    }

    // The reroutes due at atNs, after that instant's link events: host routes, fluid pairs.
    void ApplyReroutes(int64_t atNs) {
        for (const Reroutes::RouteHop& h : reroute.routeHops)
            if (h.atNs == atNs) {
                reroute.SetHostRoute(cables[h.cable], ifaces[h.cable], int(h.side),
                                     uint32_t(h.addr));
                ++reroute.applied;
            }
        if (!reroute.HasFluidMoves(atNs)) return;
        FluidAdvance();
        reroute.ApplyFluidMoves(atNs);
        FluidResolve();
    }

    // ---------- results ----------
    void Results(double* start, double* end) const {
        for (int64_t i = 0; i < n; ++i) { start[i] = t0[i]; end[i] = t1[i]; }
    }
    uint64_t TcpTimeouts() const {
        uint64_t t = 0;
        for (const Conn* c : conns) t += c->timeouts;
        return t;
    }
    uint64_t PacketsReceived() const {
        uint64_t p = 0;
        for (const Conn* c : conns) p += c->packetsRx;
        return p;
    }
};

void Conn::Open() {
    if (transport == UDP) {
        tx = Socket::CreateSocket(srcNode, UdpSocketFactory::GetTypeId());
        tx->Bind();
        tx->Connect(InetSocketAddress(dstAddr, port));
        rx = Socket::CreateSocket(dstNode, UdpSocketFactory::GetTypeId());
        rx->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
        rx->SetRecvCallback(MakeCallback(&Conn::OnRecv, this));
        connected = true;
        return;
    }
    // Segments fill the path MTU (IPv4 20 + TCP 20 + timestamps 12 bytes of headers); set
    // while CLOSED: ns-3 refuses to change it later, and accepted sockets inherit it.
    Ptr<Socket> listener = Socket::CreateSocket(dstNode, TcpSocketFactory::GetTypeId());
    listener->SetAttribute("SegmentSize", UintegerValue(mtu - 52));
    listener->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
    listener->Listen();
    listener->SetAcceptCallback(MakeCallback(&Conn::OnAcceptRequest, this),
                                MakeCallback(&Conn::OnAccept, this));
    tx = Socket::CreateSocket(srcNode, TcpSocketFactory::GetTypeId());
    tx->SetAttribute("SegmentSize", UintegerValue(mtu - 52));
    // TCP takes its source address from the route (a bound /32 would be overridden), i.e. the
    // primary address of the egress interface; ACKs are routed back to that address.
    tx->Bind();
    tx->SetConnectCallback(MakeCallback(&Conn::OnConnect, this),
                           MakeCallback(&Conn::OnConnectFail, this));
    tx->SetSendCallback(MakeCallback(&Conn::OnSend, this));
    tx->TraceConnectWithoutContext("CongState", MakeCallback(&Conn::OnCongState, this));
    tx->Connect(InetSocketAddress(dstAddr, port));
}

void Conn::OnConnectFail(Ptr<Socket> s) {
    eng->error = "TCP connection setup failed from node " + std::to_string(srcNode->GetId()) +
                 " to node " + std::to_string(dstNode->GetId()) + " port " +
                 std::to_string(port) + " at t=" +
                 std::to_string(Simulator::Now().GetNanoSeconds()) + " ns";
    Simulator::Stop();
}

void Conn::Enqueue(int64_t op, uint64_t b) {
    enq += b;
    flows.emplace_back(op, enq);
    if (transport == UDP) {
        if (!paceScheduled) {
            // Resume pacing no earlier than the previous datagram's slot ends.
            int64_t now = Simulator::Now().GetNanoSeconds();
            paceNextNs = std::max(paceNextNs, double(now));
            int64_t at = int64_t(std::llround(paceNextNs));
            paceScheduled = true;
            Simulator::Schedule(NanoSeconds(std::max<int64_t>(0, at - now)), &Conn::PaceTick,
                                this);
        }
    } else {
        Push();
    }
}

void Conn::Push() {
    if (!connected) return;
    while (sent < enq) {
        uint32_t avail = tx->GetTxAvailable();
        if (avail == 0) return;
        uint64_t want = std::min<uint64_t>(enq - sent, std::min<uint32_t>(avail, chunk));
        int r = tx->Send(Create<Packet>(uint32_t(want)), 0);
        if (r <= 0) return;
        sent += uint64_t(r);
    }
}

void Conn::PaceTick() {
    if (sent >= enq) { paceScheduled = false; return; }
    uint32_t size = uint32_t(std::min<uint64_t>(enq - sent, chunk));
    tx->Send(Create<Packet>(size), 0);
    sent += size;
    // Wire bytes: payload + UDP (8) + IPv4 (20) + PPP (2) headers; no drift from rounding.
    paceNextNs += double(size + 30) * 8.0 * 1e9 / paceBps;
    int64_t now = Simulator::Now().GetNanoSeconds();
    int64_t at = std::max<int64_t>(now, int64_t(std::llround(paceNextNs)));
    Simulator::Schedule(NanoSeconds(at - now), &Conn::PaceTick, this);
}

void Conn::OnRecv(Ptr<Socket> s) {
    Ptr<Packet> p;
    while ((p = s->Recv())) {
        recvd += p->GetSize();
        ++packetsRx;
    }
    while (!flows.empty() && flows.front().second <= recvd) {
        int64_t op = flows.front().first;
        flows.pop_front();
        eng->Finish(op);
    }
}

// Transport defaults; must run before the internet stack is installed.
void Configure(int transport, uint32_t socketBuffer, int64_t minRtoUs,
               uint32_t seed, uint32_t delAckCount, int64_t delAckTimeoutUs) {
    RngSeedManager::SetSeed(seed);
    RngSeedManager::SetRun(1);
    std::string tcpType = transport == DCTCP ? "ns3::TcpDctcp" : "ns3::TcpNewReno";
    Config::SetDefault("ns3::TcpL4Protocol::SocketType",
                       TypeIdValue(TypeId::LookupByName(tcpType)));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(socketBuffer));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(socketBuffer));
    Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue(delAckCount));
    // ns-3's default delayed-ACK timer is 200 ms, 200x the 1 ms minimum RTO: a burst ending in
    // an odd segment (DelAckCount 2) followed by idle time then times out spuriously, the
    // window falls to one segment, and each later lone segment again waits for the RTO (one
    // segment per RTO: the reshard plan's 2 MiB flows took up to 442 ms). Keep it below the RTO.
    Config::SetDefault("ns3::TcpSocket::DelAckTimeout", TimeValue(MicroSeconds(delAckTimeoutUs)));
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(MicroSeconds(minRtoUs)));
    Config::SetDefault("ns3::TcpSocketBase::ClockGranularity", TimeValue(MicroSeconds(1)));
}

// Nodes 0..count-1 with an IPv4 stack routed by static host routes only.
void CreateNodes(uint32_t count) {
    NodeContainer nodes;
    nodes.Create(count);
    InternetStackHelper stack;
    Ipv4StaticRoutingHelper staticRouting;
    stack.SetRoutingHelper(staticRouting);
    stack.Install(nodes);
}

int64_t RunSimulation(Engine& eng, double stopNs) {
    eng.Report(true);  // the replay starts: 0 of n ops
    eng.Start();
    if (stopNs > 0) Simulator::Stop(NanoSeconds(int64_t(stopNs)));
    Simulator::Run();
    return Simulator::Now().GetNanoSeconds();
}

uint64_t EventCount() { return Simulator::GetEventCount(); }

}  // namespace xsim
