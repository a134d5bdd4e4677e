// The driver's input (format version 4): a binary file written by xsim_htsim._input from the
// trace's columns (layout in that module's docstring and docs/htsim.md). Everything is in
// integers: bits per second, picoseconds, bytes, dense ids.
#ifndef XSIM_HTSIM_INPUT_H
#define XSIM_HTSIM_INPUT_H

#include <cstdint>
#include <string>
#include <vector>

namespace xsim {

inline constexpr uint32_t INPUT_FORMAT_VERSION = 4;

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

struct Input {
    uint32_t num_nodes = 0;
    std::vector<LinkSpec> links;
    std::vector<EventSpec> events;  // timed link rate changes, in time order
    std::vector<std::vector<uint32_t>> routes;  // link ids, source to destination
    std::vector<OpSpec> ops;
    std::vector<uint64_t> succ_start;  // CSR: successors of op i are succ[succ_start[i]..succ_start[i+1])
    std::vector<uint32_t> succ;
};

// Read the input file; on a malformed file set `error` (naming the section and the entry) and
// return false.
bool read_input(const std::string& path, Input& in, std::string& error);

}  // namespace xsim

#endif
