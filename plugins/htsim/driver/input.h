// The driver's input (format version 5): a binary file written by xsim_htsim._input from the
// trace's columns (layout in that module's docstring and docs/htsim.md), with optional
// what-if sections after the successors. Everything is in integers: bits per second,
// picoseconds, bytes, dense ids.
#ifndef XSIM_HTSIM_INPUT_H
#define XSIM_HTSIM_INPUT_H

#include <cstdint>
#include <string>
#include <vector>

namespace xsim {

inline constexpr uint32_t INPUT_FORMAT_VERSION = 5;

// OP_COMPUTE: a timer of `value` ps (a compute op or a barrier with a delay); OP_FLOW: a flow;
// OP_BARRIER: a join that takes no time.
enum OpKind : uint8_t { OP_COMPUTE = 0, OP_FLOW = 1, OP_BARRIER = 2 };

struct LinkSpec {
    uint32_t src_node, dst_node;
    uint64_t bps;         // capacity, bits per second
    uint64_t latency_ps;  // propagation + switching
    bool from_host;       // the link leaves a GPU: its queue is the host (NIC) queue
};

// At `at_ps`, link `link` starts serving at `bps` (0: the link is down until a later event).
struct EventSpec {
    uint64_t at_ps;
    uint32_t link;
    uint64_t bps;
};

struct OpSpec {
    OpKind kind;
    bool scale_up;        // flows only: the whole forward path is scale-up (intra-server) links
    uint64_t value;       // compute: duration in ps; flow: payload bytes; barrier: 0
    uint64_t latency_ps;  // flows only: start latency (first byte this long after the start)
    int32_t src_rank, dst_rank;  // flows only (-1 otherwise)
    int32_t fwd_route, rev_route;  // flows only: route ids (-1: a local flow, no network)
};

// What-if sections (optional, after succ; docs/htsim.md): interval compute slowdowns and the
// detours of rerouted flows (xsim_adapters/trace/slowdowns.py, topology/reroute.py).
struct SlowSegment {
    double lo_ps, hi_ps;  // [lo, hi) in ps; hi < 0: to the end of the run
    double factor;        // the rank computes at 1 / factor of its speed inside
};
struct Detour {
    uint32_t op;
    int32_t fwd, rev;     // route ids to move to (-1: that direction keeps its route)
};
struct RerouteEpoch {
    uint64_t at_ps;                // the instant (with link events) the epoch starts
    std::vector<Detour> detours;   // by rising op id
};
struct WhatIf {
    std::vector<uint64_t> slow_start;  // per rank + 1: CSR into slow_seg (empty: none)
    std::vector<SlowSegment> slow_seg;
    std::vector<int32_t> slow_rank;    // per op: the rank whose segments stretch it, -1: none
    std::vector<RerouteEpoch> epochs;  // one per distinct link-event time, in order
};

struct Input {
    uint32_t num_nodes = 0;
    std::vector<LinkSpec> links;
    std::vector<EventSpec> events;  // timed link rate changes, in time order
    std::vector<std::vector<uint32_t>> routes;  // link ids, source to destination
    std::vector<OpSpec> ops;
    std::vector<uint64_t> succ_start;  // CSR: successors of op i are succ[succ_start[i]..succ_start[i+1])
    std::vector<uint32_t> succ;
    WhatIf whatif;
};

// Read the input file; on a malformed file set `error` (naming the section and the entry) and
// return false.
bool read_input(const std::string& path, Input& in, std::string& error);

}  // namespace xsim

#endif
