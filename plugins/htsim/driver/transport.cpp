// RoCE fabric transport: PFC ingress/egress, ECN marking, DCQCN (see transport.h and
// docs/transport.md for the model and each parameter's source).
#include "transport.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "ecn.h"
#include "rocepacket.h"

namespace xsim {

PacketDB<CnpPacket> CnpPacket::_db;

CnpPacket* CnpPacket::newpkt(PacketFlow& flow, const Route& route, uint32_t dst) {
    CnpPacket* p = _db.allocPacket();
    p->set_route(flow, route, SIZE, 0);
    p->_type = CNP;
    p->_is_header = true;
    p->set_dst(dst);
    return p;
}

void CnpPacket::free() { _db.freePacket(this); }

bool read_transport(const std::string& path, size_t num_links, TransportOptions& t,
                    std::string& error) {
    std::ifstream in(path);
    if (!in) {
        error = "cannot read " + path;
        return false;
    }
    t.enabled = true;
    t.kmin_bytes.assign(num_links, 0);
    t.kmax_bytes.assign(num_links, 0);
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
        lineno++;
        std::istringstream ss(line);
        std::string key;
        if (!(ss >> key)) continue;
        bool ok = true;
        if (key == "ecn_link") {
            size_t id;
            int64_t kmin, kmax;
            ok = bool(ss >> id >> kmin >> kmax) && id < num_links && kmin < kmax;
            if (ok) {
                t.kmin_bytes[id] = kmin;
                t.kmax_bytes[id] = kmax;
            }
        } else if (key == "lossless") {
            std::string v;
            ok = bool(ss >> v) && (v == "none" || v == "pfc");
            t.pfc = v == "pfc";
        } else if (key == "cc") {
            std::string v;
            ok = bool(ss >> v);
            if (v == "none") t.cc = CC_NONE;
            else if (v == "dcqcn") t.cc = CC_DCQCN;
            else if (v == "hpcc") t.cc = CC_HPCC;
            else ok = false;
        } else {
            double v;
            ok = bool(ss >> v) && std::isfinite(v) && v >= 0;
            if (key == "buffer_bytes") t.buffer_bytes = (int64_t)v;
            else if (key == "alpha") t.alpha = v;
            else if (key == "xoff_bytes") t.xoff_bytes = (int64_t)v;
            else if (key == "xon_bytes") t.xon_bytes = (int64_t)v;
            else if (key == "xon_offset_bytes") t.xon_offset_bytes = (int64_t)v;
            else if (key == "ecn") t.ecn = v != 0;
            else if (key == "pmax") t.pmax = v;
            else if (key == "g") t.g = v;
            else if (key == "alpha_timer_us") t.alpha_timer_us = v;
            else if (key == "rate_timer_us") t.rate_timer_us = v;
            else if (key == "byte_counter_bytes") t.byte_counter_bytes = (int64_t)v;
            else if (key == "fast_recovery_steps") t.fast_recovery_steps = (uint32_t)v;
            else if (key == "rai_mbps") t.rai_mbps = v;
            else if (key == "rhai_mbps") t.rhai_mbps = v;
            else if (key == "min_rate_mbps") t.min_rate_mbps = v;
            else if (key == "cnp_interval_us") t.cnp_interval_us = v;
            else if (key == "initial_alpha") t.initial_alpha = v;
            else if (key == "eta") t.eta = v;
            else if (key == "max_stage") t.max_stage = (uint32_t)v;
            else if (key == "w_ai_bytes") t.w_ai_bytes = (uint32_t)v;
            else ok = false;
        }
        if (!ok) {
            error = path + ":" + std::to_string(lineno) + ": bad transport line '" + line + "'";
            return false;
        }
    }
    if (t.buffer_bytes <= 0) {
        error = path + ": buffer_bytes must be positive";
        return false;
    }
    if (t.pfc && t.alpha <= 0 && !(t.xon_bytes < t.xoff_bytes)) {
        error = path + ": static PFC thresholds need xon_bytes < xoff_bytes";
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- egress

PfcEgress::PfcEgress(uint32_t link, linkspeed_bps bps, mem_b maxsize, EventList& ev, bool host,
                     const TransportOptions& t, PortStats* stats)
    : LosslessOutputQueue(bps, maxsize, ev, nullptr, 0, 0),
      _link(link), _host(host), _t(t), _stats(stats) {}

void PfcEgress::sample() {
    simtime_picosec now = eventlist().now();
    _byte_ps += (double)_last_bytes * (double)(now - _last_ps);
    _last_ps = now;
    _last_bytes = queuesize();
    if (_last_bytes > _peak) _peak = _last_bytes;
}

void PfcEgress::receivePacket(Packet& pkt) {
    if (pkt.type() == ETH_PAUSE) {
        EthPausePacket& p = static_cast<EthPausePacket&>(pkt);
        simtime_picosec now = eventlist().now();
        if (p.sleepTime() > 0) {
            _stats->pause_received++;
            if (!_paused) {
                _paused = true;
                _paused_since = now;
            }
        } else if (_paused) {
            _paused = false;
            _stats->paused_ps += now - _paused_since;
        }
        LosslessOutputQueue::receivePacket(pkt);
        return;
    }
    if (_host) {
        receivePacket(pkt, &_host_vq);  // from a transport: no switch ingress to account to
        return;
    }
    LosslessOutputQueue::receivePacket(pkt);  // from a PfcIngress (its ingress queue set)
}

// Deterministic per-queue generator for the marking decisions (htsim's drand() uses rand(),
// which RoceSrc's constructor reseeds from the wall clock).
static double uniform01(uint64_t& state) {
    state += 0x9E3779B97F4A7C15ULL;  // splitmix64
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

void PfcEgress::mark(Packet& pkt) {
    if (!_t.ecn || _host || (pkt.type() != ROCE && pkt.type() != HPCC)) return;
    int64_t q = queuesize();  // bytes queued as it leaves, itself included (htsim's rule)
    int64_t kmin = _t.kmin_bytes[_link], kmax = _t.kmax_bytes[_link];
    bool ce;
    if (q <= kmin) {
        ce = false;
    } else if (q >= kmax) {
        ce = true;
    } else {
        static uint64_t state = 0x5DEECE66DULL;
        ce = uniform01(state) < _t.pmax * (double)(q - kmin) / (double)(kmax - kmin);
    }
    if (ce) {
        pkt.set_flags(pkt.flags() | ECN_CE);
        _stats->ecn_marks++;
    }
}

void PfcEgress::receivePacket(Packet& pkt, VirtualQueue* prev) {
    if (pkt.type() == CNP) _stats->cnps++;
    sample();
    LosslessOutputQueue::receivePacket(pkt, prev);
    sample();
}

void PfcEgress::beginService() {
    if (_down) {
        _stalled = true;  // started again by the event that brings the link back
        return;
    }
    LosslessOutputQueue::beginService();
}

void PfcEgress::completeService() {
    sample();
    // Marked as it leaves (dequeue marking): the signal carries the queue the packet saw at
    // the head, not one it waited behind, so the sender hears of congestion one queueing
    // delay sooner than with marking at enqueue.
    mark(*_enqueued.next_to_pop());
    LosslessOutputQueue::completeService();
    sample();
}

void PfcEgress::set_bps(uint64_t bps) {
    if (bps == 0) {
        _down = true;
        return;
    }
    _bitrate = bps;
    _ps_per_byte = (simtime_picosec)((pow(10.0, 12.0) * 8) / _bitrate);
    bool restart = _down && _stalled;
    _down = _stalled = false;
    if (restart && queuesize() > 0 && !is_paused()) LosslessOutputQueue::beginService();
}

void PfcEgress::finish(simtime_picosec now) {
    if (_paused) {
        _stats->paused_ps += now - _paused_since;
        _paused_since = now;
    }
    sample();
}

// ---------------------------------------------------------------- ingress

PfcIngress::PfcIngress(EventList& ev, PfcEgress* upstream, SwitchBuffer* buffer,
                       simtime_picosec latency_ps, const TransportOptions& t)
    : LosslessInputQueue(ev, upstream), _up(upstream), _buf(buffer), _t(t),
      _wire(latency_ps, ev, upstream) {}

int64_t PfcIngress::xoff() const {
    if (_t.alpha > 0) return (int64_t)(_t.alpha * (double)std::max<int64_t>(0, _buf->capacity - _buf->used));
    return _t.xoff_bytes;
}

void PfcIngress::pause(bool on) {
    _paused = on;
    if (on) _up->stats()->pause_sent++;
    // htsim's PAUSE frame: sleep > 0 stops the upstream transmitter, 0 restarts it
    EthPausePacket* p = EthPausePacket::newpkt(on ? 1000 : 0, 0);
    _wire.receivePacket(*p);
}

void PfcIngress::receivePacket(Packet& pkt) {
    if (_buf->used + pkt.size() > _buf->capacity) {
        // No room in the switch's buffer: drop-tail (without PFC this is the normal loss; with
        // it, a sign of too little headroom). Counted on the port the packet was headed for.
        PacketSink* next = pkt.route()->at(pkt.nexthop());
        if (PfcEgress* e = dynamic_cast<PfcEgress*>(next)) {
            e->stats()->drops++;
            e->stats()->drop_bytes += pkt.size();
        }
        pkt.free();
        return;
    }
    _queuesize += pkt.size();
    _buf->used += pkt.size();
    if (_t.pfc && !_paused && _queuesize > xoff()) pause(true);
    pkt.sendOn2(this);
}

void PfcIngress::completedService(Packet& pkt) {
    _queuesize -= pkt.size();
    _buf->used -= pkt.size();
    if (_paused) {
        int64_t xon = _t.alpha > 0 ? xoff() - _t.xon_offset_bytes : _t.xon_bytes;
        if (_queuesize <= std::max<int64_t>(0, xon)) pause(false);
    }
}

// ---------------------------------------------------------------- DCQCN

DcqcnSrc::DcqcnSrc(EventList& ev, linkspeed_bps line_bps, uint64_t flow_bytes,
                   const TransportOptions& t)
    : RoceSrc(nullptr, nullptr, ev, line_bps), _t(t), _line((double)line_bps),
      _rc((double)line_bps), _rt((double)line_bps), _alpha(t.initial_alpha),
      _flow_bytes(flow_bytes) {}

simtime_picosec DcqcnSrc::spacing() const {
    double bits = ((double)Packet::data_packet_size() + RocePacket::ACKSIZE) * 8.0;
    return (simtime_picosec)std::ceil(bits * 1e12 / _rc);
}

void DcqcnSrc::on_cnp() {
    _cnps++;
    simtime_picosec now = eventlist().now();
    if (!_limited) {
        _limited = true;  // the first CNP starts the alpha periods and the increase timer
        _next_alpha = now + timeFromUs(_t.alpha_timer_us);
    } else {
        settle_alpha(now);
    }
    // Rate decrease (Zhu et al. 2015, reaction point): remember the rate as the target, cut the
    // current rate by alpha / 2, restart the increase timer, byte counter and stages.
    _rt = _rc;
    _rc = std::max(_rc * (1.0 - _alpha / 2.0), _t.min_rate_mbps * 1e6);
    _cnp_in_period = true;
    _t_stage = _b_stage = 0;
    _bytes_since = 0;
    _next_rate = now + timeFromUs(_t.rate_timer_us);
}

// Alpha is updated at the end of every alpha period: alpha <- (1 - g) alpha + g if a CNP arrived
// in the period, else (1 - g) alpha. Only a rate cut reads alpha, so the periods are settled
// then, in closed form (no event per period).
void DcqcnSrc::settle_alpha(simtime_picosec now) {
    if (now < _next_alpha) return;
    simtime_picosec ka = timeFromUs(_t.alpha_timer_us);
    uint64_t periods = (now - _next_alpha) / ka + 1;  // boundaries passed
    _alpha = (1.0 - _t.g) * _alpha + (_cnp_in_period ? _t.g : 0.0);
    _cnp_in_period = false;
    if (periods > 1) _alpha *= std::pow(1.0 - _t.g, (double)(periods - 1));
    _next_alpha += periods * ka;
}

void DcqcnSrc::increase() {
    // One rate-increase event: fast recovery while both stage counters are below F, hyper
    // increase once both exceed it, additive increase otherwise; then halfway to the target.
    uint32_t F = _t.fast_recovery_steps;
    if (std::max(_t_stage, _b_stage) < F) {
        // fast recovery: the target stays
    } else if (std::min(_t_stage, _b_stage) > F) {
        _rt = std::min(_line, _rt + _t.rhai_mbps * 1e6);
    } else {
        _rt = std::min(_line, _rt + _t.rai_mbps * 1e6);
    }
    _rc = std::min(_line, (_rt + _rc) / 2.0);
}

void DcqcnSrc::advance_timers(simtime_picosec now) {
    if (!_limited) return;
    simtime_picosec kr = timeFromUs(_t.rate_timer_us);
    // the timer's increase events (bounded: each one halves the gap to the target at least)
    for (int k = 0; _next_rate <= now && k < 100000; k++) {
        _t_stage++;
        increase();
        _next_rate += kr;
    }
    if (_next_rate <= now) _next_rate = now + kr;
}

void DcqcnSrc::receivePacket(Packet& pkt) {
    if (pkt.type() == CNP) {
        if (_flow_started) on_cnp();
        pkt.free();
        return;
    }
    RoceSrc::receivePacket(pkt);
}

void DcqcnSrc::doNextEvent() {
    simtime_picosec now = eventlist().now();
    advance_timers(now);
    if (_highest_sent >= _flow_bytes) return;  // all sent: a NACK restarts us (RoceSrc)
    simtime_picosec gap = spacing();
    if (!_sent_any || now >= _last_sent + gap) {
        send_packet();
        _sent_any = true;
        _last_sent = now;
        _bytes_since += _mss;
        if (_limited && _t.byte_counter_bytes > 0 && _bytes_since >= (uint64_t)_t.byte_counter_bytes) {
            _bytes_since = 0;
            _b_stage++;
            increase();
            gap = spacing();
        }
        if (_highest_sent >= _flow_bytes) return;  // nothing pending: safe to reap
    }
    simtime_picosec next = _last_sent + gap;
    if (_limited) next = std::min(next, _next_rate);
    if (next <= now) next = now + 1;
    eventlist().sourceIsPending(*this, next);
}

}  // namespace xsim
