// Max-min fair rates by progressive filling (water filling), and the completion rule of a
// fluid flow on a discrete clock: the one C++ home of both, shared by every compiled engine.
//
// Users: the flow backend's compiled core (plugins/flowcore, CMake), the ns-3 replay engine
// (plugins/ns3/xsim_ns3/engine.cpp, compiled by cppyy at run time) and the htsim driver
// (plugins/htsim/driver, make). Each build finds this directory as
// xsim_adapters.backend_api.NATIVE_INCLUDE_DIR (the core package's `include/`, installed with
// it as package data) and includes "xsim/maxmin.hpp". Header-only, C++17, no dependency.
//
// The algorithm. Every flow crosses a set of links; each link has a capacity. All unfrozen
// flows grow at the same rate until some link is full; the flows on the full links freeze at
// that rate; repeat. It is the compiled twin of xsim_adapters/backends/flow/maxmin.py, which
// has two forms chosen by size that round differently in the last bit: up to
// kMaxMinSmallEntries (flow, link) entries it subtracts the level from a link once per frozen
// flow; above, it subtracts count x level in one step (numpy). This solver does exactly the
// same floating-point operations in the same cases, so the flow backend's two engines agree
// bit for bit (compile with -ffp-contract=off for that: no fused multiply-add).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace xsim {

// Links whose fair share is within this relative distance of the minimum saturate together
// (maxmin.py's _REL_TOL): float noise must not split one level into many.
inline constexpr double kMaxMinRelTol = 1e-12;
// Up to this many (flow, link) entries the reference uses its per-entry form (SMALL_ENTRIES).
inline constexpr std::size_t kMaxMinSmallEntries = 300;

// --- a fluid flow on a discrete clock (ns-3: 1 ns ticks; htsim: 1 ps ticks) ----------------
// A flow is done at a tick when what is left would take at most half a tick at its rate (the
// clock cannot place its end any closer), plus this many bytes of float noise in the
// remaining bytes (a byte count minus a sum of rate x interval products).
inline constexpr double kFluidDoneSlackBytes = 1e-6;
// The next completion check is the exact time left rounded up to a whole tick, except that a
// time left within this many ticks above a whole tick (float noise of bytes / rate) rounds
// down: the done test above then takes the flow at that tick instead of one tick later.
inline constexpr double kFluidTickSlack = 1e-6;

// Whether a flow with `rem_bytes` left at `rate` bytes per tick ends at this tick.
inline bool fluid_done(double rem_bytes, double rate) {
  return rem_bytes <= rate * 0.5 + kFluidDoneSlackBytes;
}

// Ticks from now to the next completion check, given the exact ticks left of the flow that
// ends first (`rem_bytes / rate`); at least one tick.
inline int64_t fluid_wait_ticks(double ticks_left) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ticks_left - kFluidTickSlack)));
}

// A flow's path as a range of link ids, for MaxMinSolver::solve from a pointer pair.
template <class Id>
struct LinkSpan {
  const Id* first;
  const Id* last;
  const Id* begin() const { return first; }
  const Id* end() const { return last; }
};

// A reusable water-filling workspace over a fixed universe of global link ids 0 .. num_links.
// Memory: O(num_links) for the global-to-local map, plus O(entries) of the largest system; a
// solve touches only the links its flows cross.
class MaxMinSolver {
 public:
  explicit MaxMinSolver(std::size_t num_links = 0) { resize(num_links); }

  // The universe grows to `num_links` link ids (existing state is kept valid).
  void resize(std::size_t num_links) {
    if (stamp_.size() < num_links) {
      stamp_.resize(num_links, 0);
      local_of_.resize(num_links, -1);
    }
  }

  // Rates of `k` flows: `path_of(f)` is flow f's links (a range of integer global link ids
  // below num_links, no repeats); capacity[l] is link l's capacity (0 for a failed link), in
  // any unit. Writes rate[0 .. k) in that unit. A flow crossing no link is limited by none:
  // its rate is +inf.
  template <class PathOf>
  void solve(std::size_t k, PathOf&& path_of, const double* capacity, double* rate) {
    const std::size_t m = load(k, path_of, capacity);
    fill(k, m, rate);
  }

  // The same, flow f's links being paths[f][0 .. lens[f]).
  template <class Id>
  void solve(std::size_t k, const Id* const* paths, const int32_t* lens, const double* capacity,
             double* rate) {
    solve(k, [paths, lens](std::size_t f) { return LinkSpan<Id>{paths[f], paths[f] + lens[f]}; },
          capacity, rate);
  }

 private:
  // Local link ids in order of first appearance (flow order, then path order), like the
  // insertion order of the reference's dicts; returns their number.
  template <class PathOf>
  std::size_t load(std::size_t k, PathOf& path_of, const double* capacity) {
    ++epoch_;
    std::size_t m = 0;
    std::size_t entries = 0;
    flow_head_.resize(k + 1);
    entry_link_.clear();
    for (std::size_t f = 0; f < k; ++f) {
      flow_head_[f] = static_cast<int64_t>(entries);
      for (const auto link : path_of(f)) {
        const std::size_t g = static_cast<std::size_t>(link);
        if (stamp_[g] != epoch_) {
          stamp_[g] = epoch_;
          local_of_[g] = static_cast<int32_t>(m++);
          if (rem_.size() < m) {
            rem_.resize(m);
            share_.resize(m);
            cnt_.resize(m);
            dec_.resize(m);
          }
          rem_[m - 1] = capacity[g];
          cnt_[m - 1] = 0;
          dec_[m - 1] = 0;
        }
        entry_link_.push_back(local_of_[g]);
        ++cnt_[local_of_[g]];
        ++entries;
      }
    }
    flow_head_[k] = static_cast<int64_t>(entries);
    // flows on each local link (CSR), in flow order
    head_.assign(m + 1, 0);
    for (std::size_t j = 0; j < m; ++j) head_[j + 1] = head_[j] + cnt_[j];
    on_link_.resize(entries);
    std::vector<int64_t>& cursor = dec_;  // zero here; reused as a cursor, zeroed again below
    for (std::size_t f = 0; f < k; ++f) {
      for (int64_t e = flow_head_[f]; e < flow_head_[f + 1]; ++e) {
        const int32_t j = entry_link_[e];
        on_link_[head_[j] + cursor[j]++] = static_cast<int32_t>(f);
      }
    }
    for (std::size_t j = 0; j < m; ++j) cursor[j] = 0;
    return m;
  }

  // Progressive filling over the loaded system of `k` flows and `m` local links. Each
  // statement mirrors a line of maxmin.py so that the engines round identically (the comments
  // name the Python form they follow).
  void fill(std::size_t k, std::size_t m, double* rate) {
    std::size_t unfrozen = k;
    for (std::size_t f = 0; f < k; ++f) {
      rate[f] = -1.0;
      if (flow_head_[f] == flow_head_[f + 1]) {  // no link: never frozen by a full one
        rate[f] = std::numeric_limits<double>::infinity();
        --unfrozen;
      }
    }
    const bool per_entry = flow_head_[k] <= static_cast<int64_t>(kMaxMinSmallEntries);
    while (unfrozen > 0) {  // _maxmin_python (per_entry) vs _maxmin_numpy
      // s = min(rem / cnt over links with cnt > 0), floored at 0
      double s = std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < m; ++j) {
        share_[j] = cnt_[j] > 0 ? rem_[j] / static_cast<double>(cnt_[j]) : s;  // inf: no flows
        if (share_[j] < s) s = share_[j];
      }
      if (s < 0.0) s = 0.0;
      const double limit = s + s * kMaxMinRelTol;
      full_.clear();
      for (std::size_t j = 0; j < m; ++j) {
        if (share_[j] <= limit) full_.push_back(static_cast<int32_t>(j));
      }
      for (const int32_t j : full_) {
        for (int64_t e = head_[j]; e < head_[j + 1]; ++e) {
          const int32_t f = on_link_[e];
          if (rate[f] >= 0.0) continue;  // frozen already
          rate[f] = s;
          --unfrozen;
          for (int64_t x = flow_head_[f]; x < flow_head_[f + 1]; ++x) {
            const int32_t o = entry_link_[x];
            if (per_entry) {  // rem[other] -= s; cnt[other] -= 1
              rem_[o] -= s;
              --cnt_[o];
            } else {
              ++dec_[o];
            }
          }
        }
      }
      if (!per_entry) {  // rem -= dec * s; cnt -= dec
        for (std::size_t j = 0; j < m; ++j) {
          if (dec_[j] != 0) {
            rem_[j] -= static_cast<double>(dec_[j]) * s;
            cnt_[j] -= dec_[j];
            dec_[j] = 0;
          }
        }
      }
    }
  }

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

}  // namespace xsim
