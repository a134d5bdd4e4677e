// The replayer (see replay.h). Flows complete at the receiver: when the sink holds every payload
// byte, which is what a consumer of the data waits for (the sender's final ACK comes one return
// latency later and gates nothing in the DAG).
#include "replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "compositequeue.h"
#include "eqds.h"
#include "ndp.h"
#include "roce.h"
#include "sinks.h"

namespace xsim {

RoceReaper::RoceReaper(EventList& ev, simtime_picosec delay)
    : EventSource(ev, "xsim_roce_reaper"), _delay(delay) {}

void RoceReaper::add(const Flow& f) {
    simtime_picosec t = eventlist().now() + _delay;
    _due.emplace_back(t, f);
    eventlist().sourceIsPending(*this, t);
}

void RoceReaper::doNextEvent() {
    simtime_picosec now = eventlist().now();
    while (!_due.empty() && _due.front().first <= now) {
        Flow& f = _due.front().second;
        if (f.src->_nacks_received == 0 && f.src->_rtx_packets_sent == 0 && !f.keep_routes) {
            delete f.src;
            delete f.sink;
            delete f.out;
            delete f.back;
            _reaped++;
        }
        delete f.trigger;
        _due.pop_front();
    }
}

NdpScanner::NdpScanner(EventList& ev, simtime_picosec period)
    : EventSource(ev, "xsim_ndp_scanner"), _period(period) {}

void NdpScanner::add(NdpSrc* src) {
    _live.push_back(src);
    if (!_armed) {
        _armed = true;
        eventlist().sourceIsPendingRel(*this, _period);
    }
}

void NdpScanner::retire(NdpSrc* src) { _retired.push_back(src); }

void NdpScanner::doNextEvent() {
    if (!_retired.empty()) {
        // Drop finished flows in one pass so a long run never scans its history.
        std::sort(_retired.begin(), _retired.end());
        _live.erase(std::remove_if(_live.begin(), _live.end(),
                                   [this](NdpSrc* s) {
                                       return std::binary_search(_retired.begin(),
                                                                 _retired.end(), s);
                                   }),
                    _live.end());
        _retired.clear();
    }
    simtime_picosec now = eventlist().now();
    for (NdpSrc* s : _live) s->rtx_timer_hook(now, _period);
    // Sleep when idle, so an event list with no live flows drains and a stuck DAG is detected.
    _armed = !_live.empty();
    if (_armed) eventlist().sourceIsPendingRel(*this, _period);
}

Replayer::Replayer(EventList& ev, const Input& in, const Options& opt)
    : EventSource(ev, "xsim_replayer"), _in(in), _opt(opt) {
    size_t n = in.ops.size();
    _pending.assign(n, 0);
    for (uint32_t s : in.succ) _pending[s]++;
    _start.assign(n, 0);
    _end.assign(n, 0);
    _ended.assign(n, 0);
    _down.assign(in.links.size(), 0);
    if (_opt.protocol == PROTO_NDP) {
        _ndp_src.assign(n, nullptr);
        _scanner = new NdpScanner(ev, timeFromUs((uint32_t)9));
    } else {
        // The slowest link's packet slot bounds every sender's pacing interval: a RoCE data
        // packet is the MTU plus RocePacket::ACKSIZE (64 bytes of headers in htsim's
        // rocepacket.h, the size RoceSrc::setRate paces with), in picoseconds at that link.
        uint64_t slowest = UINT64_MAX;
        for (const LinkSpec& l : in.links) slowest = std::min(slowest, l.bps);
        simtime_picosec slot = 1;
        const double packet_bytes = (double)opt.mtu + (double)RocePacket::ACKSIZE;
        const double ps_per_bit = 1e12;
        if (!in.links.empty())
            slot = (simtime_picosec)std::ceil(packet_bytes * 8.0 * ps_per_bit / (double)slowest);
        _reaper = new RoceReaper(ev, 2 * slot + 1);
    }
}

bool Replayer::build(std::string& error) {
    int64_t qbytes = _opt.queue_bytes;
    if (qbytes < 0) {
        // RoCE has no congestion control here: deep buffers stand in for a lossless (PFC)
        // fabric. NDP trims, so it wants shallow switch queues (htsim's default, 15 packets).
        // EQDS trims too (htsim's main_eqds uses composite queues).
        qbytes = _opt.protocol == PROTO_ROCE ? ((int64_t)1 << 36) : (int64_t)15 * _opt.mtu;
    }
    if (qbytes < (int64_t)_opt.mtu) {
        error = "queue of " + std::to_string(qbytes) + " bytes cannot hold one " +
                std::to_string(_opt.mtu) + "-byte packet";
        return false;
    }
    const int64_t host_bytes = (int64_t)1 << 36;  // NIC queues hold what the host offers
    if (_opt.transport.enabled && !build_transport(error)) return false;
    for (size_t i = 0; i < _in.links.size() && !_opt.transport.enabled; i++) {
        const LinkSpec& l = _in.links[i];
        BaseQueue* q;
        if (_opt.protocol == PROTO_NDP || _opt.protocol == PROTO_EQDS) {
            if (l.from_host) {
                auto* rq = new RatedQueue<PriorityQueue>(l.bps, host_bytes, eventlist(), nullptr);
                q = rq;
                _rate.push_back(rq);
            } else {
                auto* rq = new RatedQueue<CompositeQueue>(l.bps, qbytes, eventlist(), nullptr);
                q = rq;
                _rate.push_back(rq);
            }
        } else {
            auto* rq = new RatedQueue<Queue>(l.bps, l.from_host ? host_bytes : qbytes,
                                             eventlist(), nullptr);
            q = rq;
            _rate.push_back(rq);
        }
        q->setName("link" + std::to_string(i));
        _queues.push_back(q);
        Pipe* p = new Pipe(l.latency_ps, eventlist());
        p->setName("pipe" + std::to_string(i));
        _pipes.push_back(p);
    }
    for (size_t r = 0; r < _in.routes.size(); r++) {
        const std::vector<uint32_t>& hops = _in.routes[r];
        for (size_t j = 1; j < hops.size(); j++) {
            if (_in.links[hops[j - 1]].dst_node != _in.links[hops[j]].src_node) {
                error = "route " + std::to_string(r) + " is not connected: link " +
                        std::to_string(hops[j - 1]) + " ends at node " +
                        std::to_string(_in.links[hops[j - 1]].dst_node) + ", link " +
                        std::to_string(hops[j]) + " starts at node " +
                        std::to_string(_in.links[hops[j]].src_node);
                return false;
            }
        }
        if (hops.empty()) {
            error = "route " + std::to_string(r) + " has no links (a local flow must use -1)";
            return false;
        }
    }
    if (_opt.scale_up_fluid) build_fluid_groups();
    if (!_in.events.empty()) {
        _link_events = new LinkEvents(eventlist(), this, _in.events);
        eventlist().sourceIsPending(*_link_events, _in.events.front().at_ps);
    }
    return true;
}

LinkEvents::LinkEvents(EventList& ev, Replayer* owner, const std::vector<EventSpec>& events)
    : EventSource(ev, "xsim_link_events"), _owner(owner), _events(events) {}

void LinkEvents::doNextEvent() {
    simtime_picosec now = eventlist().now();
    while (_next < _events.size() && _events[_next].at_ps <= now) {
        _owner->set_link_bps(_events[_next].link, _events[_next].bps);
        _next++;
    }
    _owner->start_epoch();  // flows over links now down move to their detours
    if (_next < _events.size()) eventlist().sourceIsPending(*this, _events[_next].at_ps);
}

void Replayer::set_link_bps(uint32_t link, uint64_t bps) {
    _events_applied++;
    char down = bps == 0 ? 1 : 0;
    _num_down += (uint64_t)down - (uint64_t)_down[link];
    _down[link] = down;
    _rate[link]->set_bps(bps);
    if (link < _scratch.cap.size()) {
        _scratch.cap[link] = (double)bps / 8e12;
        for (int32_t g : _link_groups[link]) _fluid[g]->capacity_changed();
    }
}

// Groups are the connected components (union-find over nodes) of the links that fluid flows'
// routes use; on an NVSwitch star that is one group per server.
void Replayer::build_fluid_groups() {
    std::vector<uint32_t> parent(_in.num_nodes);
    for (uint32_t i = 0; i < _in.num_nodes; i++) parent[i] = i;
    auto find = [&parent](uint32_t x) {
        while (parent[x] != x) x = parent[x] = parent[parent[x]];
        return x;
    };
    std::vector<char> fluid_route(_in.routes.size(), 0);
    for (const OpSpec& o : _in.ops)
        if (o.kind == OP_FLOW && o.scale_up && o.fwd_route >= 0) fluid_route[o.fwd_route] = 1;
    for (const RerouteEpoch& e : _in.whatif.epochs)  // a fluid flow's detours are fluid too
        for (const Detour& d : e.detours)
            if (_in.ops[d.op].scale_up && d.fwd >= 0) fluid_route[d.fwd] = 1;
    for (size_t r = 0; r < _in.routes.size(); r++)
        if (fluid_route[r])
            for (uint32_t l : _in.routes[r])
                parent[find(_in.links[l].src_node)] = find(_in.links[l].dst_node);
    _route_group.assign(_in.routes.size(), -1);
    std::map<uint32_t, int32_t> group_of_root;
    for (size_t r = 0; r < _in.routes.size(); r++) {
        if (!fluid_route[r]) continue;
        uint32_t root = find(_in.links[_in.routes[r].front()].src_node);
        auto it = group_of_root.find(root);
        if (it == group_of_root.end()) {
            it = group_of_root.emplace(root, (int32_t)_fluid.size()).first;
            _fluid.push_back(new FluidGroup(eventlist(), this, _in, &_scratch));
        }
        _route_group[r] = it->second;
    }
    _scratch.solver.resize(_in.links.size());
    _scratch.cap.resize(_in.links.size());
    for (size_t l = 0; l < _in.links.size(); l++) _scratch.cap[l] = (double)_in.links[l].bps / 8e12;
    _link_groups.assign(_in.links.size(), {});
    for (size_t r = 0; r < _in.routes.size(); r++) {
        int32_t g = _route_group[r];
        if (g < 0) continue;
        for (uint32_t l : _in.routes[r]) {
            std::vector<int32_t>& gs = _link_groups[l];
            if (std::find(gs.begin(), gs.end(), g) == gs.end()) gs.push_back(g);
        }
    }
}

uint64_t Replayer::fluid_recomputes() const {
    uint64_t n = 0;
    for (const FluidGroup* g : _fluid) n += g->recomputes();
    return n;
}

void Replayer::finish_after(uint32_t op, simtime_picosec latency) {
    untrack(op);  // a fluid flow sent its last byte: it moves no more
    if (latency == 0) {
        _finished.push_back(op);
        drain();
        return;
    }
    simtime_picosec t = eventlist().now() + latency;
    _timers.push(Timer(t, op));
    eventlist().sourceIsPending(*this, t);
}

Route* Replayer::make_route(int32_t route_id, PacketSink* endpoint) const {
    const std::vector<uint32_t>& hops = _in.routes[route_id];
    Route* rt = new Route();
    for (size_t j = 0; j < hops.size(); j++) {
        uint32_t l = hops[j];
        // with a transport, a packet entering a switch port is accounted to that ingress port
        if (j > 0 && !_ingress.empty() && _ingress[hops[j - 1]] && !_in.links[l].from_host)
            rt->push_back(_ingress[hops[j - 1]]);
        rt->push_back(_queues[l]);
        rt->push_back(_pipes[l]);
    }
    rt->push_back(endpoint);
    return rt;
}

// Receivers pull at this fraction of their link's rate (dimensionless), the value htsim's own
// drivers use (datacenter/main_ndp.cpp and main_eqds.cpp): pulling slightly below line rate
// keeps the receiver's queue from growing when pull and data clocks drift.
constexpr double PULL_RATE_FRACTION = 0.99;

NdpPullPacer* Replayer::pacer_for(uint32_t link) {
    // One pacer per receiving link: a GPU that receives over NVLink and over its NIC at the same
    // time is pulled at each link's own speed.
    auto it = _pacers.find(link);
    if (it != _pacers.end()) return it->second;
    NdpPullPacer* p = new NdpPullPacer(eventlist(), _in.links[link].bps, PULL_RATE_FRACTION);
    _pacers[link] = p;
    return p;
}

EqdsPullPacer* Replayer::eqds_pacer_for(uint32_t link) {
    auto it = _eqds_pacers.find(link);
    if (it != _eqds_pacers.end()) return it->second;
    EqdsPullPacer* p =
        new EqdsPullPacer(_in.links[link].bps, PULL_RATE_FRACTION, EqdsSrc::_mtu, eventlist());
    _eqds_pacers[link] = p;
    return p;
}

EqdsNIC* Replayer::eqds_nic_for(uint32_t link) {
    // One NIC per sending link: it round-robins that link among the GPU's sources and the
    // control packets (pulls, ACKs) of the flows the GPU receives.
    auto it = _eqds_nics.find(link);
    if (it != _eqds_nics.end()) return it->second;
    EqdsNIC* n = new EqdsNIC(eventlist(), _in.links[link].bps);
    _eqds_nics[link] = n;
    return n;
}

uint32_t Replayer::initial_cwnd(int32_t fwd_route, int32_t rev_route) const {
    if (_opt.cwnd_pkts != 0) return _opt.cwnd_pkts;
    // 1.5 x the bandwidth-delay product of this route (bottleneck rate, both ways).
    uint64_t rate = UINT64_MAX;
    simtime_picosec rtt = 0;
    for (uint32_t l : _in.routes[fwd_route]) {
        rate = std::min(rate, _in.links[l].bps);
        rtt += _in.links[l].latency_ps;
    }
    for (uint32_t l : _in.routes[rev_route]) rtt += _in.links[l].latency_ps;
    double bdp_pkts = (double)rate * ((double)rtt * 1e-12) / 8.0 / _opt.mtu;
    return std::max<uint32_t>(4, (uint32_t)std::ceil(1.5 * bdp_pkts) + 2);
}

void Replayer::start_eqds_flow(uint32_t op, int32_t fwd_route, int32_t rev_route) {
    const OpSpec& f = _in.ops[op];
    const std::vector<uint32_t>& fwd = _in.routes[fwd_route];
    const std::vector<uint32_t>& rev = _in.routes[rev_route];
    EqdsSrc* src = new EqdsSrc(nullptr, eventlist(), *eqds_nic_for(fwd.front()));
    src->logFlowEvents(null_flow_logger);
    src->setCwnd((mem_b)initial_cwnd(fwd_route, rev_route) * Packet::data_packet_size());
    src->setDst(f.dst_rank);
    src->setFlowsize(f.value);
    EqdsFlowSink* snk = new EqdsFlowSink(eqds_pacer_for(fwd.back()), *eqds_nic_for(rev.front()),
                                         this, op, f.value);
    snk->setSrc(f.src_rank);
    Route* out = make_route(fwd_route, snk);
    Route* back = make_route(rev_route, src);
    out->set_reverse(back);
    back->set_reverse(out);
    src->connect(*out, *back, *snk, eventlist().now());
    track(op, LiveFlow{false, src, snk, nullptr, out, back, fwd_route, rev_route});
}

void Replayer::start_flow(uint32_t op) {
    const OpSpec& f = _in.ops[op];
    if (f.fwd_route < 0) {
        _finished.push_back(op);  // a local copy costs no network time
        return;
    }
    if (f.value == 0) {
        // An empty message (htsim cannot send a zero-byte flow): it arrives after the route's
        // propagation latency, as in the flow backend.
        simtime_picosec lat = 0;
        for (uint32_t l : _in.routes[f.fwd_route]) lat += _in.links[l].latency_ps;
        if (lat == 0) {
            _finished.push_back(op);
        } else {
            _timers.push(Timer(eventlist().now() + lat, op));
            eventlist().sourceIsPending(*this, eventlist().now() + lat);
        }
        return;
    }
    int32_t fwd_id = f.fwd_route, rev_id = f.rev_route;
    start_routes(op, fwd_id, rev_id);  // a route that is down now: start on the detour
    if (f.scale_up && _opt.scale_up_fluid) {
        _fluid_flows++;
        _fluid[_route_group[f.fwd_route]]->add(op, f.value, fwd_id);
        track(op, LiveFlow{true, nullptr, nullptr, nullptr, nullptr, nullptr, fwd_id, rev_id});
        return;
    }
    _flows_started++;
    if (_opt.protocol == PROTO_EQDS) {
        start_eqds_flow(op, fwd_id, rev_id);
        return;
    }
    if (_opt.transport.enabled) {
        start_transport_flow(op, fwd_id, rev_id);  // RoCE, DCQCN or HPCC (roce_fabric.cpp)
        return;
    }
    const std::vector<uint32_t>& fwd = _in.routes[fwd_id];
    simtime_picosec now = eventlist().now();
    if (_opt.protocol == PROTO_ROCE) {
        RoceSrc* src = new RoceSrc(nullptr, nullptr, eventlist(), _in.links[fwd.front()].bps);
        RoceFlowSink* snk = new RoceFlowSink(this, op, f.value, _opt.ack_every);
        src->set_dst(f.dst_rank);
        src->set_flowsize(f.value);
        snk->set_src(f.src_rank);
        Route* out = make_route(fwd_id, snk);
        Route* back = make_route(rev_id, src);
        snk->set_back_route(back);
        out->set_reverse(back);
        back->set_reverse(out);
        RoceEndTrigger* trig = new RoceEndTrigger(eventlist(), _reaper);
        trig->flow = RoceReaper::Flow{src, snk, out, back, trig};
        src->set_end_trigger(*trig);
        src->connect(out, back, *snk, now);
        LiveFlow live{false, src, snk, &trig->flow.keep_routes, out, back, fwd_id, rev_id};
        live.one_nak_per_gap = &snk->one_nak_per_gap;
        live.packets_seen = &snk->packets_seen;
        track(op, live);
    } else {
        NdpSrc* src = new NdpSrc(nullptr, nullptr, eventlist(), false);
        uint32_t cwnd = initial_cwnd(fwd_id, rev_id);
        src->setCwnd(cwnd * Packet::data_packet_size());
        src->set_dst(f.dst_rank);
        src->set_flowsize(f.value);
        NdpFlowSink* snk = new NdpFlowSink(this, op, f.value, pacer_for(fwd.back()));
        snk->set_src(f.src_rank);
        Route* out = make_route(fwd_id, snk);
        Route* back = make_route(rev_id, src);
        out->set_reverse(back);
        back->set_reverse(out);
        src->connect(out, back, *snk, now);
        _scanner->add(src);
        _ndp_src[op] = src;
        track(op, LiveFlow{false, src, snk, nullptr, out, back, fwd_id, rev_id});
    }
}

void Replayer::flow_done(uint32_t op) {
    untrack(op);
    if (_scanner && _ndp_src[op]) {
        _scanner->retire(_ndp_src[op]);
        _ndp_src[op] = nullptr;
    }
    _finished.push_back(op);
    drain();
}

void Replayer::op_done(uint32_t op) {
    _end[op] = eventlist().now();
    _ended[op] = 1;
    _done_count++;
    _last_done_ps = eventlist().now();
    for (uint64_t k = _in.succ_start[op]; k < _in.succ_start[op + 1]; k++) {
        uint32_t s = _in.succ[k];
        if (--_pending[s] == 0) _ready.push_back(s);
    }
}

// Process the worklists without recursion: barriers and zero-time ops can chain arbitrarily
// deep, and flow completions arrive from inside htsim's packet handlers.
void Replayer::drain() {
    if (_draining) return;
    _draining = true;
    while (!_ready.empty() || !_finished.empty()) {
        if (!_finished.empty()) {
            uint32_t op = _finished.back();
            _finished.pop_back();
            op_done(op);
            continue;
        }
        uint32_t op = _ready.back();
        _ready.pop_back();
        _start[op] = eventlist().now();
        const OpSpec& o = _in.ops[op];
        if (o.kind == OP_FLOW && o.latency_ps > 0) {
            // its start latency first (trace schema 2: NCCL's per-call cost), then the flow
            simtime_picosec t = eventlist().now() + o.latency_ps;
            _timers.push(Timer(t, op | BEGIN_FLOW));
            eventlist().sourceIsPending(*this, t);
        } else if (o.kind == OP_FLOW) {
            start_flow(op);
        } else if (o.kind == OP_COMPUTE && o.value > 0) {
            simtime_picosec t = compute_ps(op);  // interval slowdowns stretch it (whatif.cpp)
            _timers.push(Timer(t, op));
            eventlist().sourceIsPending(*this, t);
        } else {
            _finished.push_back(op);
        }
    }
    _draining = false;
}

void Replayer::doNextEvent() {
    simtime_picosec now = eventlist().now();
    while (!_timers.empty() && _timers.top().first <= now) {
        uint32_t id = _timers.top().second;
        _timers.pop();
        if (id & BEGIN_FLOW)
            start_flow(id & ~BEGIN_FLOW);  // its start latency is over: the first byte leaves
        else
            _finished.push_back(id);
    }
    drain();
}

std::vector<uint32_t> Replayer::unfinished(size_t limit) const {
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < _ended.size() && ids.size() < limit; i++)
        if (!_ended[i]) ids.push_back(i);
    return ids;
}

void Replayer::report(uint64_t events, double wall_s) const {
    std::fprintf(stderr,
                 "xsim-htsim: progress: %llu of %zu ops done, sim t=%llu ns, %.1f s wall,"
                 " %llu events\n",
                 (unsigned long long)_done_count, _in.ops.size(),
                 (unsigned long long)(eventlist().now() / 1000), wall_s,
                 (unsigned long long)events);
    std::fflush(stderr);
}

uint64_t Replayer::run() {
    uint64_t events = 0;
    auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    // A progress line when the replay starts, at most every progress_s wall seconds while it
    // runs (the clock is read every 16k events) and when it ends: the Python side relays them
    // to the backend progress hook, and a run stopped by a wall limit says where it got to.
    if (_opt.progress_s > 0) report(0, 0.0);
    for (uint32_t i = 0; i < _in.ops.size(); i++)
        if (_pending[i] == 0) _ready.push_back(i);
    drain();
    const simtime_picosec last_event =
        _in.events.empty() ? 0 : _in.events.back().at_ps;
    while (_done_count < _in.ops.size() && EventList::doNextEvent()) {
        if ((events & 0xFFFF) == 0) {
            // A transport that never resends what a failed link swallowed (NDP resends only
            // trimmed packets) keeps its timers ticking forever: stop once no op has ended for
            // STALL_LIMIT_PS of simulated time after the last link event (whatif.cpp).
            simtime_picosec now = eventlist().now();
            if (now > last_event && now - std::max(_last_done_ps, last_event) > STALL_LIMIT_PS) {
                _stalled = true;
                break;
            }
        }
        if ((++events & 0x3FFF) == 0 && _opt.progress_s > 0) {
            auto t = std::chrono::steady_clock::now();
            if (std::chrono::duration<double>(t - last).count() >= _opt.progress_s) {
                last = t;
                report(events, std::chrono::duration<double>(t - t0).count());
            }
        }
    }
    if (_opt.progress_s > 0)
        report(events, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                           .count());
    return events;
}

}  // namespace xsim
