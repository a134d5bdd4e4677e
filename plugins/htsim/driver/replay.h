// The replayer: builds one htsim queue + pipe per directed link of our topology, then executes
// the op DAG on htsim's event list. A flow is created when its last predecessor ends (never up
// front, so host queues and timer scanners only ever see live flows); compute is a timed event.
#ifndef XSIM_HTSIM_REPLAY_H
#define XSIM_HTSIM_REPLAY_H

#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eventlist.h"
#include "fluid.h"
#include "input.h"
#include "pipe.h"
#include "queue.h"
#include "route.h"
#include "trigger.h"
#include "transport.h"

class NdpSrc;
class NdpPullPacer;
class EqdsNIC;
class EqdsPullPacer;
class RoceSrc;
class RoceSink;

namespace xsim {

enum Protocol { PROTO_ROCE, PROTO_NDP, PROTO_EQDS };

struct Options {
    Protocol protocol = PROTO_ROCE;
    uint32_t mtu = 9000;          // bytes per data packet
    int64_t queue_bytes = -1;     // switch queue capacity; -1: protocol default
    uint32_t cwnd_pkts = 0;       // NDP/EQDS initial window; 0: 1.5 x the route's bandwidth-delay
    uint32_t seed = 1;
    bool scale_up_fluid = true;   // flows flagged scale_up are timed by the fluid model
    uint32_t ack_every = 1;       // RoCE: the sink ACKs every k-th packet (1: htsim's RoceSink)
    double progress_s = 0.0;      // progress lines on stderr at most this often (0: none)
    TransportOptions transport;   // --transport (plan network.transport); disabled: as before
};

// Walks NDP sources that are still sending, every `period`, so their retransmission timers run;
// unlike htsim's NdpRtxTimerScanner it forgets a flow once it is done, and sleeps when idle.
class NdpScanner : public EventSource {
public:
    NdpScanner(EventList& ev, simtime_picosec period);
    void add(NdpSrc* src);
    void retire(NdpSrc* src);
    void doNextEvent() override;
private:
    simtime_picosec _period;
    std::vector<NdpSrc*> _live;
    std::vector<NdpSrc*> _retired;
    bool _armed = false;
};

class RoceEndTrigger;
class RoceRecovery;

// A queue whose service rate timed link events change. A rate change applies from the next
// packet the queue starts to serve (the one on the wire finishes at the old rate, as on a real
// link). Rate 0 takes the link down: the queue stops starting packets (the one on the wire
// still leaves) and keeps what arrives, up to its capacity (beyond it, drops, as a full queue
// does); a later event with a rate restarts service.
class RateControl {
public:
    virtual ~RateControl() = default;
    virtual void set_bps(uint64_t bps) = 0;
};

template <class Q>
class RatedQueue : public Q, public RateControl {
public:
    using Q::Q;
    void set_bps(uint64_t bps) override {
        if (bps == 0) {
            _down = true;
            return;
        }
        this->_bitrate = bps;
        this->_ps_per_byte = (simtime_picosec)((pow(10.0, 12.0) * 8) / this->_bitrate);
        bool restart = _down && _stalled;
        _down = _stalled = false;
        if (restart && this->queuesize() > 0) Q::beginService();
    }
    void beginService() override {
        if (_down) {
            _stalled = true;  // started again by the event that brings the link back
            return;
        }
        Q::beginService();
    }
    // Queue telemetry: every arrival updates the peak and the time integral of the bytes
    // queued (sampled at arrivals and departures: the occupancy is piecewise constant between).
    void receivePacket(Packet& pkt) override {
        sample();
        Q::receivePacket(pkt);
        sample();
    }
    void completeService() override {
        sample();
        Q::completeService();
        sample();
    }
    mem_b peak_bytes() const { return _peak; }
    double byte_ps() const { return _byte_ps; }
    mem_b last_bytes() const { return _last_bytes; }
    simtime_picosec last_ps() const { return _last_ps; }

private:
    void sample() {
        simtime_picosec now = this->eventlist().now();
        _byte_ps += (double)_last_bytes * (double)(now - _last_ps);
        _last_ps = now;
        _last_bytes = this->queuesize();
        if (_last_bytes > _peak) _peak = _last_bytes;
    }
    bool _down = false;
    bool _stalled = false;
    mem_b _peak = 0;
    mem_b _last_bytes = 0;
    simtime_picosec _last_ps = 0;
    double _byte_ps = 0;
};

class Replayer;

// Applies the input's timed link events at their times, in order.
class LinkEvents : public EventSource {
public:
    LinkEvents(EventList& ev, Replayer* owner, const std::vector<EventSpec>& events);
    void doNextEvent() override;
private:
    Replayer* _owner;
    const std::vector<EventSpec>& _events;
    size_t _next = 0;
};

// Frees a RoCE flow's htsim objects once its sender has its last ACK. Deletion waits one packet
// slot (the sender's last pacing event has then fired and found nothing to send), and a flow
// that saw a NACK is kept, since retransmitted copies may still be in flight.
class RoceReaper : public EventSource {
public:
    struct Flow {
        RoceSrc* src;
        RoceSink* sink;
        Route* out;
        Route* back;
        RoceEndTrigger* trigger;
        bool keep_routes = false;  // rerouted: its routes may still carry packets (whatif.cpp)
    };
    RoceReaper(EventList& ev, simtime_picosec delay);
    void add(const Flow& f);
    void doNextEvent() override;
    uint64_t reaped() const { return _reaped; }
private:
    simtime_picosec _delay;
    std::deque<std::pair<simtime_picosec, Flow>> _due;  // times rise: one fixed delay
    uint64_t _reaped = 0;
};

// The sender's end trigger: hands the flow to the reaper.
class RoceEndTrigger final : public Trigger {
public:
    RoceEndTrigger(EventList& ev, RoceReaper* reaper) : Trigger(ev, 0), _reaper(reaper) {}
    RoceReaper::Flow flow{};
    void activate() override { _reaper->add(flow); }
private:
    RoceReaper* _reaper;
};

class Replayer : public EventSource {
public:
    Replayer(EventList& ev, const Input& in, const Options& opt);
    // Build queues and pipes; false (with `error`) if htsim cannot build the network.
    bool build(std::string& error);
    // Run until every op has ended or nothing is left to simulate. Returns events processed.
    uint64_t run();
    // Called by a flow's sink when the last payload byte has arrived.
    void flow_done(uint32_t op);
    // Called by the fluid model: flow `op` sent its last byte now; it ends `latency` ps later.
    void finish_after(uint32_t op, simtime_picosec latency);
    void doNextEvent() override;  // compute timers

    const std::vector<simtime_picosec>& start_ps() const { return _start; }
    const std::vector<simtime_picosec>& end_ps() const { return _end; }
    uint64_t ops_done() const { return _done_count; }
    // One "xsim-htsim: progress: ..." line on stderr (see run()).
    void report(uint64_t events, double wall_s) const;
    uint64_t flows_started() const { return _flows_started; }
    uint64_t flows_freed() const { return _reaper ? _reaper->reaped() : 0; }
    uint64_t fluid_flows() const { return _fluid_flows; }
    uint64_t fluid_groups() const { return _fluid.size(); }
    uint64_t fluid_recomputes() const;
    // Ids of up to `limit` ops that have not ended, lowest first.
    std::vector<uint32_t> unfinished(size_t limit) const;
    // A timed link event: link `link` serves at `bps` from now on (0: down).
    void set_link_bps(uint32_t link, uint64_t bps);
    uint64_t link_events_applied() const { return _events_applied; }
    // What-if (whatif.cpp): called by LinkEvents once the events of an instant are applied.
    void start_epoch();
    uint64_t reroutes() const { return _reroutes; }
    // run() stopped because no op ended for STALL_LIMIT_PS after the last link event.
    bool stalled() const { return _stalled; }
    // 60 s of simulated time (ps): far beyond any one op of a training iteration (kernels and
    // transfers take micro- to milliseconds), so only a run that can never finish reaches it.
    static constexpr simtime_picosec STALL_LIMIT_PS = (simtime_picosec)60 * 1000000000000ULL;
    // Transport telemetry per link id (transport enabled only; closes open pause intervals).
    const std::vector<PortStats>& port_stats();
    bool transport() const { return _opt.transport.enabled; }
    // Queue telemetry, per link id: peak and time-mean bytes queued, drops, trims.
    void queue_stats(std::vector<uint64_t>& peak, std::vector<double>& mean,
                     std::vector<uint64_t>& drops, std::vector<uint64_t>& trims) const;

private:
    // What-if (whatif.cpp): interval slowdowns and rerouting.
    struct LiveFlow {
        bool fluid = false;
        void* src = nullptr;        // RoceSrc / NdpSrc / EqdsSrc
        void* sink = nullptr;       // RoceSink / NdpSink / EqdsSink
        bool* keep_routes = nullptr;  // RoCE: its reaper record's keep_routes
        Route* out = nullptr;
        Route* back = nullptr;
        int32_t fwd = -1, rev = -1;  // the route ids it sends on now
        bool* one_nak_per_gap = nullptr;  // RoCE: its sink's NAK suppression (replay.cpp)
        const uint64_t* packets_seen = nullptr;  // RoCE: data packets its sink received
    };
    simtime_picosec compute_ps(uint32_t op) const;  // when compute op `op` started now ends
    bool route_down(int32_t route) const;
    const Detour* detour_of(uint32_t op) const;      // this epoch's detour of `op`, if any
    void start_routes(uint32_t op, int32_t& fwd, int32_t& rev);
    void move(uint32_t op, LiveFlow& f);
    void track(uint32_t op, const LiveFlow& f);
    void untrack(uint32_t op);
    std::vector<char> _down;          // per link: serving at rate 0
    uint64_t _num_down = 0;
    int64_t _epoch = -1;              // instants with link events so far, minus one
    uint64_t _reroutes = 0;
    simtime_picosec _last_done_ps = 0;
    bool _stalled = false;
    std::unordered_map<uint32_t, LiveFlow> _live;  // flows that may move (only with detours)
    std::vector<Route*> _old_routes;  // replaced routes, still pointed at by packets
    RoceRecovery* _roce_recovery = nullptr;  // made on the first RoCE move (whatif.cpp)
public:
    bool op_ended(uint32_t op) const { return _ended[op] != 0; }
private:
    void op_done(uint32_t op);
    void drain();
    void start_flow(uint32_t op);
    Route* make_route(int32_t route_id, PacketSink* endpoint) const;
    NdpPullPacer* pacer_for(uint32_t link);
    EqdsPullPacer* eqds_pacer_for(uint32_t link);
    EqdsNIC* eqds_nic_for(uint32_t link);
    uint32_t initial_cwnd(int32_t fwd_route, int32_t rev_route) const;
    void start_eqds_flow(uint32_t op, int32_t fwd_route, int32_t rev_route);
    void build_fluid_groups();
    bool build_transport(std::string& error);   // PFC/ECN queues (transport.cpp's classes)
    void start_transport_flow(uint32_t op, int32_t fwd_id, int32_t rev_id);
    // Resend from the last ACK when a RoCE flow that sent everything goes quiet for a timeout
    // (whatif.cpp's RoceRecovery): a lossy fabric's tail loss has no later packet to NACK it.
    void watch_tail_loss(uint32_t op, RoceSrc* src, const uint64_t* packets_seen);
    std::vector<PfcIngress*> _ingress;      // by link id: the port it enters at a switch
    std::vector<SwitchBuffer> _switch_buf;  // by node id
    std::vector<PortStats> _port_stats;     // by link id

    const Input& _in;
    Options _opt;
    std::vector<BaseQueue*> _queues;  // by link id
    std::vector<RateControl*> _rate;  // by link id: the same queues, as rate controls
    LinkEvents* _link_events = nullptr;
    uint64_t _events_applied = 0;
    std::vector<std::vector<int32_t>> _link_groups;  // link id -> fluid groups using it
    std::vector<Pipe*> _pipes;        // by link id
    std::vector<uint32_t> _pending;   // unfinished predecessors per op
    std::vector<simtime_picosec> _start, _end;
    std::vector<char> _ended;
    std::vector<uint32_t> _ready;     // worklist: ops whose predecessors are done
    std::vector<uint32_t> _finished;  // worklist: ops that ended at now()
    bool _draining = false;
    uint64_t _done_count = 0;
    uint64_t _flows_started = 0;
    // A timer ends op `id`, or with BEGIN_FLOW set ends flow (id & ~BEGIN_FLOW)'s start latency
    // (ops are fewer than 2^31: the reader checks).
    static constexpr uint32_t BEGIN_FLOW = 0x80000000u;
    typedef std::pair<simtime_picosec, uint32_t> Timer;
    std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> _timers;
    std::map<uint32_t, NdpPullPacer*> _pacers;  // NDP: one pull pacer per receiving link
    std::map<uint32_t, EqdsPullPacer*> _eqds_pacers;  // EQDS: one pull pacer per receiving link
    std::map<uint32_t, EqdsNIC*> _eqds_nics;          // EQDS: one NIC per sending link
    std::vector<NdpSrc*> _ndp_src;              // NDP: source of each live flow op
    NdpScanner* _scanner = nullptr;
    RoceReaper* _reaper = nullptr;
    // Fluid scale-up: one group per connected set of scale-up links (a server), by route id.
    std::vector<FluidGroup*> _fluid;
    std::vector<int32_t> _route_group;  // route id -> index in _fluid, -1: not a fluid route
    FluidScratch _scratch;
    uint64_t _fluid_flows = 0;
};

}  // namespace xsim

#endif
