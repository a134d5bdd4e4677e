// The receivers the replayer gives htsim's transports: each tells the replayer when its flow
// holds every payload byte (see replay.cpp). Included by replay.cpp and roce_fabric.cpp (each
// gets its own internal copy).
#ifndef XSIM_HTSIM_SINKS_H
#define XSIM_HTSIM_SINKS_H

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "eqds.h"
#include "ndp.h"
#include "replay.h"
#include "ecn.h"
#include "hpcc.h"
#include "roce.h"
#include "transport.h"

namespace xsim {

namespace {

// What every sink below keeps of its flow: it tells the replayer, once, when the payload
// bytes it holds reach the flow's size.
struct FlowDone {
    Replayer* r;
    uint32_t op;
    uint64_t bytes;
    bool fired = false;
    void check(uint64_t held) {
        if (!fired && held >= bytes) {
            fired = true;
            r->flow_done(op);
        }
    }
};

// A sink (RoceSink, NdpSink) that tells the replayer when its cumulative ACK covers the whole
// flow. The sink's own constructor arguments follow ours.
template <class Sink>
class FlowSink : public Sink {
public:
    template <class... Args>
    FlowSink(Replayer* r, uint32_t op, uint64_t bytes, Args&&... args)
        : Sink(std::forward<Args>(args)...), _done{r, op, bytes} {}
    void receivePacket(Packet& pkt) override {
        Sink::receivePacket(pkt);
        _done.check(this->_cumulative_ack);
    }
private:
    FlowDone _done;
};
using NdpFlowSink = FlowSink<NdpSink>;
using HpccFlowSink = FlowSink<HPCCSink>;

// The RoCE sink. With ack_every == 1 it is htsim's RoceSink exactly (one ACK per packet).
// With ack_every = k > 1 (the opt-in --ack-every: fewer events, at a measured error) it runs
// the same in-order/NACK logic but acknowledges only every k-th packet and the flow's last
// one: RoCE without congestion control uses ACKs for go-back-N and completion only, so what
// changes is the ACK packets' load on the reverse path (64 of every ~9000 bytes per packet).
//
// After a reroute (whatif.cpp) it answers a sequence gap as an InfiniBand RC responder does:
// one NAK for the gap, then later out-of-sequence packets are dropped without another until the
// expected one arrives. htsim's RoceSink NAKs every out-of-sequence packet and the source
// rewinds on each; with packets lost at a dead link ahead of a deep queue, that multiplied the
// resent bytes (a 2-GPU plan, 400G NICs over 200G spines: 31.2 ms against the fluid 14.4 ms).
// Flows never moved keep htsim's behaviour exactly.
class RoceFlowSink : public RoceSink {
public:
    RoceFlowSink(Replayer* r, uint32_t op, uint64_t bytes, uint32_t ack_every)
        : _done{r, op, bytes}, _ack_every(ack_every) {}
    void set_back_route(const Route* back) { _back = back; }
    bool one_nak_per_gap = false;  // set when the flow moves
    uint64_t packets_seen = 0;     // data packets that reached this sink (whatif.cpp's timer)
    // DCQCN notification point (transport cc: dcqcn): a CNP back to the sender for a packet
    // marked CE, at most one per cnp_interval_us per flow. Sent before the packet's ACK, so
    // it never reaches a sender the reaper has freed (both take the same FIFO path).
    const TransportOptions* cnp = nullptr;
    void receivePacket(Packet& pkt) override {
        if (cnp && pkt.type() == ROCE && (pkt.flags() & ECN_CE)) {
            simtime_picosec now = EventList::now();
            if (!_cnp_sent || now - _last_cnp_ps >= timeFromUs(cnp->cnp_interval_us)) {
                _cnp_sent = true;
                _last_cnp_ps = now;
                CnpPacket::newpkt(_src->_flow, *_back, _srcaddr)->sendOn();
            }
        }
        if (pkt.type() == ROCE) {
            packets_seen++;
            if (one_nak_per_gap && already_naked(static_cast<RocePacket&>(pkt))) {
                pkt.free();  // already NAKed this gap: drop silently
                return;
            }
        }
        if (_ack_every <= 1) {
            RoceSink::receivePacket(pkt);
        } else {
            coalesced(pkt);
        }
        _done.check(this->_cumulative_ack);
    }

private:
    // One NAK per gap: true for an out-of-sequence packet of a gap already NAKed.
    bool already_naked(RocePacket& p) {
        if (p.seqno() <= _cumulative_ack + 1) return false;  // in sequence
        if (_naked_gap && _nak_ack == _cumulative_ack) return true;
        _naked_gap = true;
        _nak_ack = _cumulative_ack;
        return false;
    }

    void coalesced(Packet& pkt) {
        if (pkt.type() != ROCE) abort();
        RocePacket* p = (RocePacket*)(&pkt);
        RocePacket::seq_t seqno = p->seqno();
        if (seqno > _cumulative_ack + 1) {  // out of order: NACK at once, as RoceSink does
            RoceNack* nack = RoceNack::newpkt(_src->_flow, *_back, _cumulative_ack, _srcaddr);
            nack->set_pathid(0);
            nack->set_ts(p->ts());
            nack->sendOn();
            p->free();
            return;
        }
        uint64_t size = p->size() - RocePacket::ACKSIZE;
        if (seqno == _cumulative_ack + 1) _cumulative_ack = seqno + size - 1;
        if (++_unacked >= _ack_every || _cumulative_ack >= _done.bytes) {
            _unacked = 0;
            RoceAck* ack = RoceAck::newpkt(_src->_flow, *_back, _cumulative_ack, _srcaddr);
            ack->set_pathid(0);
            ack->sendOn();
        }
        p->free();
    }

    FlowDone _done;
    bool _cnp_sent = false;
    simtime_picosec _last_cnp_ps = 0;
    uint32_t _ack_every;
    uint32_t _unacked = 0;
    const Route* _back = nullptr;
    bool _naked_gap = false;
    RoceAck::seq_t _nak_ack = 0;
};

// The same for EQDS. EQDS sequence numbers count packets (each carries EqdsSrc::_mss payload
// bytes, the last one less; an RTS probe after a timeout also takes a number), so the flow is
// complete once the cumulative ACK covers ceil(bytes / mss) data packets.
class EqdsFlowSink : public EqdsSink {
public:
    EqdsFlowSink(EqdsPullPacer* pacer, EqdsNIC& nic, Replayer* r, uint32_t op, uint64_t bytes)
        : EqdsSink(nullptr, pacer, nic), _done{r, op, bytes} {}
    void receivePacket(Packet& pkt) override {
        EqdsSink::receivePacket(pkt);
        if (_done.fired) return;
        uint64_t cum = cumulative_ack();
        uint64_t rts = getSrc()->_rts_packets_sent;
        if (cum > rts) _done.check((cum - rts) * (uint64_t)EqdsSrc::_mss);
    }
private:
    FlowDone _done;
};

// htsim's EqdsSrc constructor leaves its flow-event logger pointer uninitialized and
// dereferences it when non-null; giving every source this no-op logger makes that defined.
class NullFlowLogger final : public FlowEventLogger {
public:
    void logEvent(PacketFlow&, Logged&, FlowEvent, mem_b, uint64_t) override {}
};
NullFlowLogger null_flow_logger;

}  // namespace

}  // namespace xsim

#endif
