// The replayer's RoCE fabric (network.transport): queues, ingress ports and senders built from
// transport.h's classes. Without --transport none of this runs (replay.cpp as before).
#include <algorithm>

#include "hpcc.h"
#include "replay.h"
#include "sinks.h"

namespace xsim {

namespace {
// A timed link event on a PFC egress queue.
class EgressRate final : public RateControl {
public:
    explicit EgressRate(PfcEgress* q) : _q(q) {}
    void set_bps(uint64_t bps) override { _q->set_bps(bps); }
private:
    PfcEgress* _q;
};
// HPCC's in-band telemetry holds this many hops (htsim's HPCCPacket::_int_info).
constexpr size_t HPCC_MAX_HOPS = 5;
}  // namespace

bool Replayer::build_transport(std::string& error) {
    const TransportOptions& t = _opt.transport;
    const size_t L = _in.links.size();
    const int64_t host_bytes = (int64_t)1 << 36;  // a host buffers what it sends in memory
    // LosslessInputQueue's constructor checks its (static, here unused) thresholds.
    LosslessInputQueue::_high_threshold = 2;
    LosslessInputQueue::_low_threshold = 1;
    _port_stats.assign(L, PortStats{});
    _switch_buf.assign(_in.num_nodes, SwitchBuffer{t.buffer_bytes, 0});
    std::vector<char> is_switch(_in.num_nodes, 0);  // a node with a switch (non-host) port
    for (const LinkSpec& l : _in.links)
        if (!l.from_host) is_switch[l.src_node] = 1;
    std::vector<PfcEgress*> egress;
    for (size_t i = 0; i < L; i++) {
        const LinkSpec& l = _in.links[i];
        auto* q = new PfcEgress((uint32_t)i, l.bps, host_bytes, eventlist(), l.from_host, t,
                                &_port_stats[i]);
        q->setName("link" + std::to_string(i));
        egress.push_back(q);
        _queues.push_back(q);
        _rate.push_back(new EgressRate(q));
        Pipe* p = new Pipe(l.latency_ps, eventlist());
        p->setName("pipe" + std::to_string(i));
        _pipes.push_back(p);
    }
    _ingress.assign(L, nullptr);
    for (size_t i = 0; i < L; i++) {
        const LinkSpec& l = _in.links[i];
        if (!is_switch[l.dst_node]) continue;
        // PAUSE frames travel back over the link's own delay (the reverse direction's is the same)
        _ingress[i] = new PfcIngress(eventlist(), egress[i], &_switch_buf[l.dst_node],
                                     l.latency_ps, t);
    }
    if (t.cc == CC_HPCC && !_in.events.empty()) {
        error = "cc hpcc with timed link events: htsim's HPCC sender cannot move to a detour";
        return false;
    }
    if (t.cc == CC_HPCC) {
        simtime_picosec base_rtt = 0;
        for (size_t r = 0; r < _in.routes.size(); r++) {
            if (_in.routes[r].size() > HPCC_MAX_HOPS) {
                error = "cc hpcc: route " + std::to_string(r) + " has " +
                        std::to_string(_in.routes[r].size()) + " hops; htsim's HPCC carries"
                        " in-band telemetry for at most " + std::to_string(HPCC_MAX_HOPS);
                return false;
            }
        }
        // HPCC's T: the network's base RTT, the longest route's propagation both ways plus one
        // data packet's serialization per hop (the HPCC paper's definition of T).
        for (const OpSpec& o : _in.ops) {
            if (o.kind != OP_FLOW || o.fwd_route < 0 || o.rev_route < 0) continue;
            simtime_picosec rtt = 0;
            for (uint32_t l : _in.routes[o.fwd_route])
                rtt += _in.links[l].latency_ps +
                       (simtime_picosec)((_opt.mtu + 64) * 8e12 / (double)_in.links[l].bps);
            for (uint32_t l : _in.routes[o.rev_route]) rtt += _in.links[l].latency_ps;
            base_rtt = std::max(base_rtt, rtt);
        }
        if (base_rtt > 0) HPCCSrc::_T = base_rtt;
        HPCCSrc::_eta = t.eta;
        HPCCSrc::_max_stages = t.max_stage;
    }
    return true;
}

void Replayer::start_transport_flow(uint32_t op, int32_t fwd_id, int32_t rev_id) {
    const OpSpec& f = _in.ops[op];
    const std::vector<uint32_t>& fwd = _in.routes[fwd_id];
    simtime_picosec now = eventlist().now();
    if (_opt.transport.cc == CC_HPCC) {
        HPCCSrc* src = new HPCCSrc(nullptr, nullptr, eventlist(), _in.links[fwd.front()].bps);
        if (_opt.transport.w_ai_bytes > 0) HPCCSrc::_Wai = _opt.transport.w_ai_bytes;
        HpccFlowSink* snk = new HpccFlowSink(this, op, f.value);
        src->set_dst(f.dst_rank);
        src->set_flowsize(f.value);
        snk->set_src(f.src_rank);
        Route* out = make_route(fwd_id, snk);
        Route* back = make_route(rev_id, src);
        out->set_reverse(back);
        back->set_reverse(out);
        src->connect(out, back, *snk, now);  // kept to the end of the run (no reaper)
        track(op, LiveFlow{false, src, snk, nullptr, out, back, fwd_id, rev_id});
        return;
    }
    RoceSrc* src;
    RoceFlowSink* snk = new RoceFlowSink(this, op, f.value, _opt.ack_every);
    if (_opt.transport.cc == CC_DCQCN) {
        src = new DcqcnSrc(eventlist(), _in.links[fwd.front()].bps, f.value, _opt.transport);
        snk->cnp = &_opt.transport;
    } else {
        src = new RoceSrc(nullptr, nullptr, eventlist(), _in.links[fwd.front()].bps);
    }
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
    if (!_opt.transport.pfc) {
        // A lossy fabric: the receiver NAKs a gap once, as an InfiniBand RC responder does
        // (htsim's RoceSink NAKs every out-of-sequence packet and the sender rewinds on each,
        // which multiplies resent packets: sinks.h), and a tail loss is resent on a timeout.
        snk->one_nak_per_gap = true;
        watch_tail_loss(op, src, &snk->packets_seen);
    }
}

const std::vector<PortStats>& Replayer::port_stats() {
    simtime_picosec now = eventlist().now();
    for (BaseQueue* q : _queues)
        if (auto* e = dynamic_cast<PfcEgress*>(q)) e->finish(now);
    return _port_stats;
}

}  // namespace xsim
