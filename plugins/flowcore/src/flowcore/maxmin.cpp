// Water filling; see maxmin.hpp. Each statement mirrors a line of maxmin.py so that the two
// engines round identically (the comments name the Python form they follow).
#include "maxmin.hpp"

#include <limits>

namespace flowcore {

MaxMinSolver::MaxMinSolver(std::size_t num_links)
    : stamp_(num_links, 0), local_of_(num_links, -1) {}

void MaxMinSolver::solve(std::size_t k, const int32_t* const* paths, const int32_t* lens,
                         const double* capacity, double* rate) {
  // Local link ids in order of first appearance (flow order, then path order), like the
  // insertion order of the reference's dicts.
  ++epoch_;
  std::size_t m = 0;
  std::size_t entries = 0;
  flow_head_.resize(k + 1);
  entry_link_.clear();
  for (std::size_t f = 0; f < k; ++f) {
    flow_head_[f] = static_cast<int64_t>(entries);
    for (int32_t i = 0; i < lens[f]; ++i) {
      const int32_t g = paths[f][i];
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
  {
    std::vector<int64_t>& fill = dec_;  // zero here; reused as a cursor, zeroed again below
    for (std::size_t f = 0; f < k; ++f) {
      for (int64_t e = flow_head_[f]; e < flow_head_[f + 1]; ++e) {
        const int32_t j = entry_link_[e];
        on_link_[head_[j] + fill[j]++] = static_cast<int32_t>(f);
      }
    }
    for (std::size_t j = 0; j < m; ++j) fill[j] = 0;
  }
  for (std::size_t f = 0; f < k; ++f) rate[f] = -1.0;
  const bool per_entry = entries <= kSmallEntries;  // _maxmin_python vs _maxmin_numpy
  std::size_t unfrozen = k;
  while (unfrozen > 0) {
    // s = min(rem / cnt over links with cnt > 0), floored at 0
    double s = std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < m; ++j) {
      share_[j] = cnt_[j] > 0 ? rem_[j] / static_cast<double>(cnt_[j]) : s;  // inf: no flows
      if (share_[j] < s) s = share_[j];
    }
    if (s < 0.0) s = 0.0;
    const double limit = s + s * kRelTol;
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

}  // namespace flowcore
