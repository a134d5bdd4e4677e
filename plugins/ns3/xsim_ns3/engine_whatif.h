// What-if parts of the ns-3 replay engine (engine.cpp includes this; xsim_ns3/_whatif.py
// prepares their inputs): interval compute slowdowns, rerouting (host-route rewrites, fluid
// pair detours) and queue telemetry. Each is a plain struct the Engine holds, so the engine's
// own loop changes only where it asks them.
#pragma once

#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include "ns3/traffic-control-module.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <vector>

namespace xsim {

using namespace ns3;

// Interval compute slowdowns: per op the rank whose segments stretch it (-1: none), per rank
// its segments [lo, hi) at factor.
struct Slowdowns {
    std::vector<int64_t> rank;
    std::vector<int64_t> off;  // per rank + 1
    std::vector<double> lo, hi, f;

    void Load(int64_t nOps, const int64_t* opRank, int64_t nRanks, const int64_t* offsets,
              const double* segLo, const double* segHi, const double* factor) {
        rank.assign(opRank, opRank + nOps);
        off.assign(offsets, offsets + nRanks + 1);
        int64_t segs = off.empty() ? 0 : off.back();
        lo.assign(segLo, segLo + segs);
        hi.assign(segHi, segHi + segs);
        f.assign(factor, factor + segs);
    }

    // The delay until compute op `op` (duration `durNs`, started at `nowNs`) ends: where its
    // work ends at its rank's piecewise speed (trace/slowdowns.py stretched_end), rounded to
    // the ns; `durNs` for an op no window stretches.
    int64_t DelayNs(int64_t op, int64_t durNs, int64_t nowNs) const {
        if (rank.empty() || rank[op] < 0) return durNs;
        const int64_t r = rank[op];
        const double t = double(nowNs);
        double cur = t, rem = double(durNs);
        for (int64_t i = off[r]; i < off[r + 1]; ++i) {
            if (hi[i] <= cur) continue;
            if (lo[i] > cur) {
                double gap = lo[i] - cur;
                if (rem <= gap) return Round(cur + rem, t);
                rem -= gap;
                cur = lo[i];
            }
            double span = hi[i] - cur, need = rem * f[i];
            if (need <= span) return Round(cur + need, t);
            rem -= span / f[i];
            if (rem < 0.0) rem = 0.0;
            cur = hi[i];
        }
        return Round(cur + rem, t);
    }
    static int64_t Round(double end, double t) {
        return std::max<int64_t>(0, std::llround(end) - int64_t(t));
    }
};

// Rerouting: host routes to install at an instant, and fluid pairs moved to their detours
// (their local fluid links and latency then replace the op's own).
struct Reroutes {
    struct RouteHop { int64_t atNs, cable, side, addr; };
    struct FluidMove { int64_t atNs, pair; std::vector<int64_t> links; double lat; };
    std::vector<RouteHop> routeHops;    // in time order
    std::vector<FluidMove> fluidMoves;  // in time order
    std::vector<int64_t> fluidPair;               // per op, -1: not a fluid flow
    std::vector<std::vector<int64_t>> pairLinks;  // per fluid pair, empty: not moved
    std::vector<double> pairLat;
    uint64_t applied = 0;

    void Load(int64_t nOps, const int64_t* fpair, int64_t nHops, const int64_t* at,
              const int64_t* cable, const int64_t* side, const int64_t* addr, int64_t nMoves,
              const int64_t* fat, const int64_t* pair, const int64_t* ptr,
              const int64_t* links, const double* lat) {
        fluidPair.assign(fpair, fpair + nOps);
        for (int64_t i = 0; i < nHops; ++i)
            routeHops.push_back({at[i], cable[i], side[i], addr[i]});
        for (int64_t i = 0; i < nMoves; ++i)
            fluidMoves.push_back({fat[i], pair[i],
                                  std::vector<int64_t>(links + ptr[i], links + ptr[i + 1]),
                                  lat[i]});
    }

    // The distinct instants with reroutes, rising.
    std::vector<int64_t> Times() const {
        std::vector<int64_t> t;
        for (const RouteHop& h : routeHops) t.push_back(h.atNs);
        for (const FluidMove& m : fluidMoves) t.push_back(m.atNs);
        std::sort(t.begin(), t.end());
        t.erase(std::unique(t.begin(), t.end()), t.end());
        return t;
    }

    const std::vector<int64_t>* Moved(int64_t op) const {
        int64_t p = fluidPair.empty() ? -1 : fluidPair[op];
        if (p < 0 || p >= int64_t(pairLinks.size()) || pairLinks[p].empty()) return nullptr;
        return &pairLinks[p];
    }
    // The local fluid links of op `op` now: its detour's, else [fptr[op], fptr[op + 1]).
    const int64_t* Begin(int64_t op, const std::vector<int64_t>& fptr,
                         const std::vector<int64_t>& flink) const {
        const std::vector<int64_t>* m = Moved(op);
        return m ? m->data() : flink.data() + fptr[op];
    }
    const int64_t* End(int64_t op, const std::vector<int64_t>& fptr,
                       const std::vector<int64_t>& flink) const {
        const std::vector<int64_t>* m = Moved(op);
        return m ? m->data() + m->size() : flink.data() + fptr[op + 1];
    }
    double Latency(int64_t op, const std::vector<double>& flat) const {
        return Moved(op) ? pairLat[fluidPair[op]] : flat[op];
    }

    bool HasFluidMoves(int64_t atNs) const {
        for (const FluidMove& m : fluidMoves)
            if (m.atNs == atNs) return true;
        return false;
    }
    void ApplyFluidMoves(int64_t atNs) {
        for (const FluidMove& m : fluidMoves) {
            if (m.atNs != atNs) continue;
            if (int64_t(pairLinks.size()) <= m.pair) {
                pairLinks.resize(m.pair + 1);
                pairLat.resize(m.pair + 1);
            }
            pairLinks[m.pair] = m.links;
            pairLat[m.pair] = m.lat;
            ++applied;
        }
    }

    // At the sending end (`side`) of a cable, packets to `address` leave through it from now
    // on: the node's other host routes to that address are removed first.
    static void SetHostRoute(const NetDeviceContainer& cable, const Ipv4InterfaceContainer& ifc,
                             int side, uint32_t address) {
        Ptr<NetDevice> dev = cable.Get(side);
        Ptr<Ipv4> ip = dev->GetNode()->GetObject<Ipv4>();
        Ipv4StaticRoutingHelper helper;
        Ptr<Ipv4StaticRouting> rt = helper.GetStaticRouting(ip);
        Ipv4Address dest(address);
        for (int64_t i = int64_t(rt->GetNRoutes()) - 1; i >= 0; --i) {
            Ipv4RoutingTableEntry e = rt->GetRoute(uint32_t(i));
            if (e.IsHost() && e.GetDest() == dest) rt->RemoveRoute(uint32_t(i));
        }
        rt->AddHostRouteTo(dest, ifc.GetAddress(1 - side),
                           uint32_t(ip->GetInterfaceForDevice(dev)));
    }
};

// Per-queue-disc telemetry (docs/metrics.md "Queues"): the most bytes it held, and the time
// integral of its bytes (for the mean occupancy), fed by its BytesInQueue trace source.
struct QueueWatch {
    uint32_t peakBytes = 0;
    double byteNs = 0;  // integral of bytes over time, byte-ns
    double lastNs = 0;
    uint32_t lastBytes = 0;
    void OnBytes(uint32_t, uint32_t now) {
        double t = double(Simulator::Now().GetNanoSeconds());
        byteNs += double(lastBytes) * (t - lastNs);
        lastNs = t;
        lastBytes = now;
        if (now > peakBytes) peakBytes = now;
    }
};

struct QueueTelemetry {
    std::deque<QueueWatch> watches;  // per cable end, in AddCable order (2 per cable)
    std::vector<Ptr<QueueDisc>> qdiscs;

    void Watch(Ptr<QueueDisc> q) {
        watches.emplace_back();
        qdiscs.push_back(q);
        q->TraceConnectWithoutContext("BytesInQueue",
                                      MakeCallback(&QueueWatch::OnBytes, &watches.back()));
    }

    // Per cable end (index 2 * cable + side): peak bytes, mean bytes over [0, endNs], drops
    // (packets, bytes) and ECN marks, from the queue disc's own statistics.
    void Stats(double endNs, double* peak, double* mean, double* drops, double* dropBytes,
               double* marks) {
        for (size_t i = 0; i < qdiscs.size(); ++i) {
            QueueWatch& w = watches[i];
            double area = w.byteNs + double(w.lastBytes) * (endNs - w.lastNs);
            peak[i] = w.peakBytes;
            mean[i] = endNs > 0 ? area / endNs : 0.0;
            const QueueDisc::Stats& st = qdiscs[i]->GetStats();
            drops[i] = st.nTotalDroppedPackets;
            dropBytes[i] = double(st.nTotalDroppedBytes);
            marks[i] = st.nTotalMarkedPackets;
        }
    }
};

}  // namespace xsim
