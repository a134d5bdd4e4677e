// Max-min fair rates by progressive filling (water filling), the compiled twin of
// xsim_adapters/backends/flow/maxmin.py.
//
// Every flow crosses a set of links; each link has a capacity. All unfrozen flows grow at the
// same rate until some link is full; the flows on the full links freeze at that rate; repeat.
//
// The Python reference has two forms chosen by size, which round differently in the last bit:
// up to kSmallEntries (flow, link) entries it subtracts the level from a link once per frozen
// flow; above, it subtracts count x level in one step (numpy). This solver does exactly the
// same floating-point operations in the same cases, so both engines agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flowcore {

// Links whose fair share is within this relative distance of the minimum saturate together
// (maxmin.py's _REL_TOL; same reason: float noise must not split one level into many).
inline constexpr double kRelTol = 1e-12;
// Up to this many (flow, link) entries the reference uses its per-entry form (SMALL_ENTRIES).
inline constexpr std::size_t kSmallEntries = 300;

// A reusable water-filling workspace over a fixed universe of global link ids.
// Memory: O(num_links) for the global-to-local map, plus O(entries) of the largest system.
class MaxMinSolver {
 public:
  explicit MaxMinSolver(std::size_t num_links);

  // Rates of `k` flows: flow i crosses global links paths[i][0 .. lens[i]) (non-empty, no
  // repeats); capacity[l] is link l's capacity (0 for a failed link). Writes rate[0 .. k).
  void solve(std::size_t k, const int32_t* const* paths, const int32_t* lens,
             const double* capacity, double* rate);

 private:
  std::vector<uint64_t> stamp_;    // per global link: epoch_ when local_of_ is valid
  std::vector<int32_t> local_of_;  // per global link: its local index in the current system
  uint64_t epoch_ = 0;
  // per local link
  std::vector<double> rem_;
  std::vector<double> share_;  // rem_ / cnt_ this round (inf for a link without unfrozen flows)
  std::vector<int64_t> cnt_;
  std::vector<int64_t> dec_;
  std::vector<int64_t> head_;     // CSR over entries: flows on each local link
  std::vector<int32_t> on_link_;  // flow index per entry, grouped by local link
  std::vector<int32_t> full_;
  // per entry, in flow order: the local link
  std::vector<int32_t> entry_link_;
  std::vector<int64_t> flow_head_;  // per flow + 1: its first entry
};

}  // namespace flowcore
