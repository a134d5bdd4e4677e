// What-if runs in the replayer (see replay.h and docs/htsim.md): interval compute slowdowns,
// rerouting of flows whose path crosses a link that is down, and the queues' telemetry.
//
// Rerouting switches the route a live flow's endpoints send on: the source's data route and the
// sink's ACK / pull route (htsim has no API for the sink's, so its private member is reached
// with the standard explicit-instantiation access idiom below; htsim itself is not changed).
// Packets already sent keep the route they carry; those queued at the down link stay there
// (delivered late, as duplicates, if it comes back) and the transport recovers the gap: RoCE by
// go-back-N on the sink's NACK, NDP and EQDS by their own retransmissions. The replaced routes
// are kept until the run ends, since packets in flight still point at them.
#include "replay.h"

#include <algorithm>
#include <deque>

#include "compositequeue.h"
#include "eqds.h"
#include "ndp.h"
#include "roce.h"

namespace xsim {

namespace {

// Access to a private data member: an explicit instantiation may name it (C++17
// [temp.spec]/6), and the friend function it defines hands the member pointer out.
template <class Tag, typename Tag::type M>
struct Robber {
    friend typename Tag::type get(Tag) { return M; }
};
// The tag of Endpoint::_route (const Route*). Each instantiation declares the one plain
// function its Robber defines (GCC's -Wnon-template-friend notes exactly that: intended).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-template-friend"
#endif
template <class Endpoint>
struct RouteOf {
    typedef const Route* Endpoint::*type;
    friend type get(RouteOf);
};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
template struct Robber<RouteOf<RoceSink>, &RoceSink::_route>;
template struct Robber<RouteOf<NdpSink>, &NdpSink::_route>;
template struct Robber<RouteOf<EqdsSrc>, &EqdsSrc::_route>;
template struct Robber<RouteOf<EqdsSink>, &EqdsSink::_route>;

template <class Endpoint>
void set_route(void* endpoint, const Route* route) {
    static_cast<Endpoint*>(endpoint)->*get(RouteOf<Endpoint>()) = route;
}

}  // namespace

// htsim's RoCE resends only on the sink's NACK (its RoceSrc computes an RTO but arms no timer),
// and a NACK needs a later packet to arrive out of order. A flow that had sent its last packet
// before it moved, all of them then lost at the dead link, would wait forever. A RoCE NIC's
// retransmission timer resends from the last acknowledged byte (go-back-N) when nothing comes
// back for its timeout: this does that for moved flows, starting from the RoCE minimum RTO the
// driver sets (RoceSrc::_min_rto, 1 ms: main.cpp) and doubling it after each resend (backoff,
// as retransmission timers do, so a long queue ahead of the data does not set off a storm of
// them). It resends only when the sink got no data packet and the source no ACK in a whole
// timeout, and only once the source has sent everything (before that, a later packet's NACK
// recovers the gap); it checks again until the flow completes. Checked once per timeout, it
// fires one to two timeouts after the flow's last packet or ACK.
class RoceRecovery : public EventSource {
public:
    RoceRecovery(EventList& ev, Replayer* owner)
        : EventSource(ev, "xsim_roce_recovery"), _owner(owner) {}
    void watch(uint32_t op, RoceSrc* src, const uint64_t* seen, uint64_t size) {
        arm(Watch{0, op, src, seen, size, 0, 0, RoceSrc::_min_rto});
    }
    void doNextEvent() override {
        simtime_picosec now = eventlist().now();
        std::vector<Watch> again;
        while (!_due.empty() && _due.front().at <= now) {
            Watch w = _due.front();
            _due.pop_front();
            if (_owner->op_ended(w.op)) continue;  // delivered: nothing to resend
            RoceSrc* src = w.src;
            bool idle = src->_last_acked == w.acked && *w.seen == w.seen_then;
            if (idle && src->_highest_sent >= w.size && src->_last_acked < w.size) {
                // go back to the last acknowledged byte, as RoceSrc::processNack does
                src->_rtx_packets_sent += src->_highest_sent - src->_last_acked;
                src->_highest_sent = src->_last_acked;
                eventlist().sourceIsPendingRel(*src, 0);
                w.timeout *= 2;
            }
            again.push_back(w);
        }
        for (Watch& w : again) arm(w);
    }
private:
    struct Watch {
        simtime_picosec at;
        uint32_t op;
        RoceSrc* src;
        const uint64_t* seen;     // the sink's data packets so far
        uint64_t size;
        uint64_t acked;           // the source's last acknowledged byte when armed
        uint64_t seen_then;       // *seen when armed
        simtime_picosec timeout;
    };
    void arm(Watch w) {
        w.at = eventlist().now() + w.timeout;
        w.acked = w.src->_last_acked;
        w.seen_then = *w.seen;
        // timeouts differ per flow (backoff): keep the queue in time order
        auto it = std::upper_bound(_due.begin(), _due.end(), w.at,
                                   [](simtime_picosec t, const Watch& x) { return t < x.at; });
        _due.insert(it, w);
        eventlist().sourceIsPending(*this, w.at);
    }
    Replayer* _owner;
    std::deque<Watch> _due;  // by time
};

simtime_picosec Replayer::compute_ps(uint32_t op) const {
    // xsim_adapters/trace/slowdowns.py stretched_end, in ps, rounded to the ps
    const OpSpec& o = _in.ops[op];
    const WhatIf& w = _in.whatif;
    simtime_picosec now = eventlist().now();
    if (w.slow_rank.empty() || w.slow_rank[op] < 0) return now + o.value;
    const int32_t r = w.slow_rank[op];
    double cur = (double)now, rem = (double)o.value;
    for (uint64_t i = w.slow_start[r]; i < w.slow_start[r + 1]; i++) {
        const SlowSegment& g = w.slow_seg[i];
        const double hi = g.hi_ps < 0 ? INFINITY : g.hi_ps;
        if (hi <= cur) continue;
        if (g.lo_ps > cur) {
            double gap = g.lo_ps - cur;
            if (rem <= gap) return (simtime_picosec)std::llround(cur + rem);
            rem -= gap;
            cur = g.lo_ps;
        }
        double span = hi - cur, need = rem * g.factor;
        if (need <= span) return (simtime_picosec)std::llround(cur + need);
        rem -= span / g.factor;
        if (rem < 0.0) rem = 0.0;
        cur = hi;
    }
    return (simtime_picosec)std::llround(cur + rem);
}

bool Replayer::route_down(int32_t route) const {
    if (route < 0 || _num_down == 0) return false;
    for (uint32_t l : _in.routes[route])
        if (_down[l]) return true;
    return false;
}

const Detour* Replayer::detour_of(uint32_t op) const {
    if (_epoch < 0 || (size_t)_epoch >= _in.whatif.epochs.size()) return nullptr;
    const std::vector<Detour>& ds = _in.whatif.epochs[_epoch].detours;
    auto it = std::lower_bound(ds.begin(), ds.end(), op,
                               [](const Detour& d, uint32_t o) { return d.op < o; });
    return (it != ds.end() && it->op == op) ? &*it : nullptr;
}

void Replayer::start_routes(uint32_t op, int32_t& fwd, int32_t& rev) {
    if (_num_down == 0) return;
    const Detour* d = detour_of(op);
    if (!d) return;
    bool moved = false;
    if (d->fwd >= 0 && route_down(fwd)) { fwd = d->fwd; moved = true; }
    if (d->rev >= 0 && route_down(rev)) { rev = d->rev; moved = true; }
    if (moved) _reroutes++;
}

void Replayer::start_epoch() {
    _epoch++;
    if (_num_down == 0 || _live.empty() || (size_t)_epoch >= _in.whatif.epochs.size()) return;
    for (const Detour& d : _in.whatif.epochs[_epoch].detours) {
        auto it = _live.find(d.op);
        if (it == _live.end()) continue;
        LiveFlow& f = it->second;
        bool fwd = d.fwd >= 0 && route_down(f.fwd), rev = d.rev >= 0 && route_down(f.rev);
        if (!fwd && !rev) continue;
        if (fwd) f.fwd = d.fwd;
        if (rev) f.rev = d.rev;
        move(d.op, f);
        _reroutes++;
    }
}

void Replayer::move(uint32_t op, LiveFlow& f) {
    if (f.fluid) {
        _fluid[_route_group[_in.ops[op].fwd_route]]->reroute(op, f.fwd);
        return;
    }
    // New route objects (packets in flight keep pointing at the old ones, kept alive).
    PacketSink* sink_end = f.out->at(f.out->size() - 1);
    PacketSink* src_end = f.back->at(f.back->size() - 1);
    Route* out = make_route(f.fwd, sink_end);
    Route* back = make_route(f.rev, src_end);
    out->set_reverse(back);
    back->set_reverse(out);
    _old_routes.push_back(f.out);
    _old_routes.push_back(f.back);
    f.out = out;
    f.back = back;
    switch (_opt.protocol) {
    case PROTO_ROCE: {
        auto* src = static_cast<RoceSrc*>(f.src);
        src->_route = out;
        set_route<RoceSink>(f.sink, back);
        if (f.keep_routes) *f.keep_routes = true;  // the reaper must not free its routes
        if (f.one_nak_per_gap) *f.one_nak_per_gap = true;  // one NAK per lost run
        if (!_roce_recovery) _roce_recovery = new RoceRecovery(eventlist(), this);
        if (f.packets_seen) _roce_recovery->watch(op, src, f.packets_seen, _in.ops[op].value);
        break;
    }
    case PROTO_NDP:
        static_cast<NdpSrc*>(f.src)->_route = out;
        set_route<NdpSink>(f.sink, back);
        break;
    case PROTO_EQDS:
        set_route<EqdsSrc>(f.src, out);
        set_route<EqdsSink>(f.sink, back);
        break;
    }
}

void Replayer::watch_tail_loss(uint32_t op, RoceSrc* src, const uint64_t* packets_seen) {
    if (!_roce_recovery) _roce_recovery = new RoceRecovery(eventlist(), this);
    _roce_recovery->watch(op, src, packets_seen, _in.ops[op].value);
}

void Replayer::track(uint32_t op, const LiveFlow& f) {
    if (!_in.whatif.epochs.empty()) _live[op] = f;
}

void Replayer::untrack(uint32_t op) {
    if (!_live.empty()) _live.erase(op);
}

void Replayer::queue_stats(std::vector<uint64_t>& peak, std::vector<double>& mean,
                           std::vector<uint64_t>& drops, std::vector<uint64_t>& trims) const {
    simtime_picosec now = eventlist().now();
    size_t n = _queues.size();
    peak.assign(n, 0);
    mean.assign(n, 0.0);
    drops.assign(n, 0);
    trims.assign(n, 0);
    for (size_t i = 0; i < n; i++) {
        BaseQueue* q = _queues[i];
        auto fill = [&](auto* rq) {
            peak[i] = (uint64_t)rq->peak_bytes();
            double area = rq->byte_ps() + (double)rq->last_bytes() * (double)(now - rq->last_ps());
            mean[i] = now > 0 ? area / (double)now : 0.0;
        };
        if (auto* a = dynamic_cast<RatedQueue<Queue>*>(q)) {
            fill(a);
            drops[i] = (uint64_t)a->num_drops();
        } else if (auto* b = dynamic_cast<RatedQueue<CompositeQueue>*>(q)) {
            fill(b);
            drops[i] = (uint64_t)b->num_drops();
            trims[i] = (uint64_t)b->num_stripped();
        } else if (auto* c = dynamic_cast<RatedQueue<PriorityQueue>*>(q)) {
            fill(c);
            drops[i] = (uint64_t)c->num_drops();
        } else if (auto* e = dynamic_cast<PfcEgress*>(q)) {
            fill(e);
            drops[i] = _port_stats[i].drops;  // buffer overflow at this port's switch
        }
    }
}

}  // namespace xsim
