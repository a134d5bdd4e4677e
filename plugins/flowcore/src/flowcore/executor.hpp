// The flow backend's event loop in C++: the compiled twin of
// xsim_adapters/backends/flow/executor.py (the reference; read its module docstring for the
// model). Times in ns, sizes in bytes, rates in bytes/ns, capacities given in Gb/s.
//
// Determinism: nothing iterates a hash container. The calendar (calendar.hpp) takes the
// instants in time order and, within one, the entries in the order they were scheduled (an op
// id for an op end, ~slot for a flow's last byte); all entries due at one instant are taken
// before the rates are re-solved, as in the reference. Within an instant the values computed
// (start and end = the instant; the rates of each connected group of flows) do not depend on
// the order in which entries are taken, and every floating-point operation is the reference's,
// so both engines produce the same timeline bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

namespace flowcore {

inline constexpr int8_t kKindCompute = 0;  // trace/schema.py KINDS order
inline constexpr int8_t kKindFlow = 1;
inline constexpr int8_t kKindBarrier = 2;

// Borrowed views of the executor's input arrays (FlowProblem in executor.py).
struct ProblemView {
  std::size_t num_ops = 0;
  const int8_t* kind = nullptr;           // per op
  const int64_t* duration_ns = nullptr;   // per op (compute, timed barriers, flow start latency)
  const int64_t* nbytes = nullptr;        // per op (flows)
  std::size_t num_edges = 0;
  const int64_t* pred64 = nullptr;        // per edge; either the 64-bit or the 32-bit pair
  const int64_t* succ64 = nullptr;
  const int32_t* pred32 = nullptr;
  const int32_t* succ32 = nullptr;
  const int64_t* path_offsets = nullptr;  // per op + 1: CSR into path_links
  const int32_t* path_links = nullptr;
  std::size_t num_links = 0;
  const double* link_gbps = nullptr;        // per link, nominal capacity
  const double* link_latency_ns = nullptr;  // per link
  std::size_t num_events = 0;
  const double* events_at_ns = nullptr;     // per timed link event
  const int64_t* events_link = nullptr;
  const double* events_factor = nullptr;
  // What-if inputs (executor.py FlowProblem): interval compute slowdowns and detours.
  const int32_t* rank = nullptr;            // per op (only read when slowdowns are given)
  std::size_t num_slow_ranks = 0;           // 0: no interval slowdowns
  const int64_t* slow_offsets = nullptr;    // per rank + 1: CSR into the segments
  const double* slow_lo_ns = nullptr;       // per segment
  const double* slow_hi_ns = nullptr;
  const double* slow_factor = nullptr;
  std::size_t num_detours = 0;              // 0: no rerouting
  const int64_t* reroute_key = nullptr;     // per detour, rising: epoch * num_ops + op
  const int64_t* reroute_offsets = nullptr; // per detour + 1: CSR into reroute_links
  const int32_t* reroute_links = nullptr;
};

// What a run produced. start/end are NaN for ops that never finished.
struct RunResult {
  std::unique_ptr<double[]> start_ns;
  std::unique_ptr<double[]> end_ns;
  int64_t done = 0;                 // ops that finished
  int64_t events = 0;               // op ends, flow transmission ends, link events (as executor.py)
  int64_t max_active_flows = 0;
  int64_t rate_recomputations = 0;  // connected groups of flows re-solved
  int64_t solved_flows = 0;         // the sizes of those groups, summed
  double wall_s = 0.0;              // the whole native call (wall clock)
  double cpu_s = 0.0;               // the same span in this thread's CPU time (steadier on a
                                    // shared machine)
  bool aborted = false;             // the progress hook asked to stop
  // Flows still transmitting when the run ended (only when done < num_ops), by op id.
  std::vector<int64_t> active_ops;
  std::vector<double> active_rates;
  std::vector<int64_t> active_detours;  // per active op: its detour's index, -1: its route
  int64_t reroutes = 0;                 // flows moved to (or started on) a detour
  std::vector<double> capacity;     // per link at the end, bytes/ns
};

// Called about every 1% of ops (and at the end) with (done_ops, total_ops); return false to
// stop the run (e.g. a Python exception or a pending signal).
using ProgressHook = std::function<bool(int64_t, int64_t)>;

// A malformed input (dependency out of range, a path repeating a link, too many ops).
class InputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Execute the DAG. Throws InputError for malformed input; never returns partial results as
// complete (result.done < num_ops tells the caller the run got stuck or was stopped).
RunResult run_flows(const ProblemView& problem, const ProgressHook& hook);

}  // namespace flowcore
