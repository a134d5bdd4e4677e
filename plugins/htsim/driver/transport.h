// RoCE fabric transport (the plan's network.transport, docs/transport.md), composed from htsim's
// lossless queues and PAUSE frames without patching htsim:
// - PfcEgress: every link's transmit queue, an htsim LosslessOutputQueue (stops on a PAUSE
//   frame, resumes on XON; stamps HPCC's in-band telemetry) plus RED ECN marking at dequeue,
//   telemetry and rate changes for timed link events;
// - PfcIngress: per switch ingress port, an htsim LosslessInputQueue subclass doing the
//   ingress accounting against a shared switch buffer (static or dynamic XOFF/XON), dropping
//   what the buffer cannot hold, and sending htsim EthPausePackets upstream over the link's delay;
// - DcqcnSrc / DcqcnSink: a DCQCN reaction point over htsim's RoceSrc (rate limiter state
//   machine of Zhu et al. 2015) and a notification point that sends CNPs for marked packets.
#ifndef XSIM_HTSIM_TRANSPORT_H
#define XSIM_HTSIM_TRANSPORT_H

#include <cstdint>
#include <string>
#include <vector>

#include "callback_pipe.h"
#include "eventlist.h"
#include "network.h"
#include "queue_lossless_input.h"
#include "queue_lossless_output.h"
#include "roce.h"

namespace xsim {

class Replayer;

enum CcKind { CC_NONE = 0, CC_DCQCN = 1, CC_HPCC = 2 };

struct TransportOptions {
    bool enabled = false;
    bool pfc = false;
    int64_t buffer_bytes = 0;
    double alpha = 0;            // > 0: dynamic thresholds; 0: static xoff/xon
    int64_t xoff_bytes = 0, xon_bytes = 0, xon_offset_bytes = 0;
    bool ecn = false;
    double pmax = 0;
    std::vector<int64_t> kmin_bytes, kmax_bytes;  // per link id
    CcKind cc = CC_NONE;
    // DCQCN
    double g = 0, alpha_timer_us = 0, rate_timer_us = 0, rai_mbps = 0, rhai_mbps = 0,
           min_rate_mbps = 0, cnp_interval_us = 0, initial_alpha = 1;
    int64_t byte_counter_bytes = 0;
    uint32_t fast_recovery_steps = 0;
    // HPCC
    double eta = 0.95;
    uint32_t max_stage = 5;
    uint32_t w_ai_bytes = 0;
};

// Reads the driver's --transport file ("key value" lines, "ecn_link ID KMIN KMAX" per link).
bool read_transport(const std::string& path, size_t num_links, TransportOptions& t,
                    std::string& error);

// Per-link transport telemetry.
struct PortStats {
    uint64_t pause_sent = 0;      // PAUSE (XOFF) frames the receiving end sent to this link
    uint64_t pause_received = 0;  // of them, those that reached this link's transmitter
    uint64_t paused_ps = 0;       // time this link's transmitter spent paused
    uint64_t ecn_marks = 0;       // packets marked CE at this link's egress queue
    uint64_t cnps = 0;            // CNPs this link carried
    uint64_t drops = 0;           // packets dropped for want of buffer at this link's switch
    uint64_t drop_bytes = 0;
};

// The shared buffer of one switch.
struct SwitchBuffer {
    int64_t capacity = 0;
    int64_t used = 0;
};

// The ingress VQ of a host queue: a host buffers what it sends in its own memory.
class HostIngress : public VirtualQueue {
public:
    void completedService(Packet&) override {}
};

class PfcEgress : public LosslessOutputQueue {
public:
    PfcEgress(uint32_t link, linkspeed_bps bps, mem_b maxsize, EventList& ev, bool host,
              const TransportOptions& t, PortStats* stats);
    using LosslessOutputQueue::receivePacket;
    void receivePacket(Packet& pkt) override;
    void receivePacket(Packet& pkt, VirtualQueue* prev) override;
    void beginService() override;
    void completeService() override;
    void set_bps(uint64_t bps);  // a timed link event (0: down)
    uint32_t link() const { return _link; }
    PortStats* stats() { return _stats; }
    mem_b peak_bytes() const { return _peak; }
    double byte_ps() const { return _byte_ps; }
    mem_b last_bytes() const { return _last_bytes; }
    simtime_picosec last_ps() const { return _last_ps; }
    void finish(simtime_picosec now);  // close the open paused interval at the end of the run

private:
    void sample();
    void mark(Packet& pkt);
    uint32_t _link;
    bool _host;
    const TransportOptions& _t;
    PortStats* _stats;
    HostIngress _host_vq;
    bool _down = false, _stalled = false, _paused = false;
    simtime_picosec _paused_since = 0;
    mem_b _peak = 0, _last_bytes = 0;
    simtime_picosec _last_ps = 0;
    double _byte_ps = 0;
};

class PfcIngress : public LosslessInputQueue {
public:
    // `upstream` is the egress queue of the link this port receives from; PAUSE frames reach
    // it `latency_ps` after they are sent.
    PfcIngress(EventList& ev, PfcEgress* upstream, SwitchBuffer* buffer, simtime_picosec latency_ps,
               const TransportOptions& t);
    void receivePacket(Packet& pkt) override;
    void completedService(Packet& pkt) override;

private:
    int64_t xoff() const;
    void pause(bool on);
    PfcEgress* _up;
    SwitchBuffer* _buf;
    const TransportOptions& _t;
    CallbackPipe _wire;
    bool _paused = false;
};

// DCQCN reaction point: htsim's RoceSrc (go-back-N, ACKs) with its pacing replaced by a rate
// limiter. One pending event at a time, at the earlier of the next packet slot and the next
// DCQCN timer; nothing is pending once the last byte is sent (the reaper may then free it).
class DcqcnSrc : public RoceSrc {
public:
    DcqcnSrc(EventList& ev, linkspeed_bps line_bps, uint64_t flow_bytes, const TransportOptions& t);
    void doNextEvent() override;
    void receivePacket(Packet& pkt) override;
    double rate_bps() const { return _rc; }
    uint64_t cnps_received() const { return _cnps; }

private:
    void on_cnp();
    void advance_timers(simtime_picosec now);
    void settle_alpha(simtime_picosec now);
    void increase();
    simtime_picosec spacing() const;
    const TransportOptions& _t;
    double _line, _rc, _rt, _alpha;
    uint64_t _flow_bytes;
    bool _limited = false;       // a CNP has arrived: the timers run
    bool _cnp_in_period = false;
    simtime_picosec _next_alpha = 0, _next_rate = 0, _last_sent = 0;
    bool _sent_any = false;
    uint64_t _bytes_since = 0;   // byte counter since the last increase event
    uint32_t _t_stage = 0, _b_stage = 0;
    uint64_t _cnps = 0;
};

// The CNP: a 64-byte control packet on the flow's reverse route.
class CnpPacket : public Packet {
public:
    static CnpPacket* newpkt(PacketFlow& flow, const Route& route, uint32_t dst);
    void free() override;
    PktPriority priority() const override { return Packet::PRIO_HI; }
    virtual ~CnpPacket() {}
    static constexpr int SIZE = 64;
private:
    static PacketDB<CnpPacket> _db;
};

}  // namespace xsim

#endif
