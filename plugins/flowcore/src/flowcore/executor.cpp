// The event loop; see executor.hpp. The three numbered steps of each instant follow
// executor.py's loop one to one, so a reader can put the two side by side.
#include "executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "calendar.hpp"
#include "xsim/maxmin.hpp"

namespace flowcore {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Calendar keys: op >= 0 ends that op; ~slot (-1 .. -2^30) is a flow slot's last byte leaving;
// kLatencyKey + op (below -2^30) ends flow op's start latency (its transmission begins). The
// ranges are disjoint because check_input() bounds the op count (and so the slots) by 2^30.
constexpr int32_t kLatencyKey = std::numeric_limits<int32_t>::min();
constexpr std::size_t kMaxOps = std::size_t{1} << 30;

class Executor {
 public:
  explicit Executor(const ProblemView& p);
  RunResult run(const ProgressHook& hook);

 private:
  void check_input() const;
  void build_successors();
  double latency(int32_t op) const { return op_lat_[op]; }
  void finish(int32_t op, double t);
  void start_flow(int32_t op, double t);
  void stop_flow(int32_t slot);
  // What-if (executor.py): a compute op's end under interval slowdowns, a flow's detour.
  double compute_end(int32_t op, double t) const;
  int64_t find_detour(int32_t op) const;
  void attach(int32_t slot, int64_t detour);
  void detach(int32_t slot);
  void reroute(double t);
  void mark_dirty(int32_t link) {
    if (!dirty_mark_[link]) {
      dirty_mark_[link] = 1;
      dirty_.push_back(link);
    }
  }
  void resolve_dirty(double t);
  void solve_group(double t);

  const ProblemView& p_;
  const std::size_t n_;
  const std::size_t m_;
  // the DAG
  std::vector<int64_t> succ_off_;
  std::vector<int32_t> succ_list_;
  std::vector<int32_t> indeg_;
  // per op: its path latency as the difference of two prefix sums of link latency over
  // path_links (executor.py's rounding), without holding the prefix per path entry
  std::vector<double> op_lat_;
  std::vector<double> det_lat_prefix_;  // the same over reroute_links
  std::size_t max_path_ = 0;  // the longest route or detour
  // links, bytes/ns
  std::vector<double> nominal_;
  std::vector<double> cap_;
  std::vector<std::vector<int32_t>> link_flows_;  // active flow slots on each link
  std::vector<uint8_t> dirty_mark_;
  std::vector<int32_t> dirty_;
  // active flows, one slot each (slots are reused; memory follows the most flows at once)
  std::vector<int32_t> s_op_;      // -1: free
  std::vector<double> s_rate_;     // bytes/ns
  std::vector<double> s_rem_;      // bytes left at s_tlast_
  std::vector<double> s_tlast_;    // ns
  std::vector<double> s_due_;      // ns, when the last byte leaves at the current rate; -1: never
  std::vector<int32_t> s_pos_;     // [slot * max_path_ + i]: index in link_flows_ of path link i
  std::vector<const int32_t*> s_path_;  // the links the flow crosses now (route or detour)
  std::vector<int32_t> s_len_;
  std::vector<double> s_lat_;      // its path latency, ns
  std::vector<int64_t> s_det_;     // its detour's index, -1: its route
  std::vector<int32_t> free_slots_;
  int64_t active_ = 0;
  // connected-group search and solve
  std::vector<uint64_t> link_seen_;
  std::vector<uint64_t> slot_seen_;
  uint64_t epoch_ = 0;
  std::vector<int32_t> stack_;
  std::vector<int32_t> group_;
  std::vector<const int32_t*> group_paths_;
  std::vector<int32_t> group_lens_;
  std::vector<double> group_rates_;
  xsim::MaxMinSolver solver_;
  // the run
  Calendar calendar_;
  std::vector<int32_t> due_;  // the entries of the instant being taken
  std::vector<int32_t> ready_;
  std::vector<int32_t> began_;  // flows whose start latency ended now: they transmit from now
  double* start_ = nullptr;
  double* end_ = nullptr;
  int64_t done_ = 0;
  int64_t events_ = 0;
  int64_t recomputes_ = 0;
  int64_t solved_flows_ = 0;
  // rerouting: links at capacity 0 now, and the instants with link events so far (minus 1)
  std::vector<uint8_t> down_;
  int64_t num_down_ = 0;
  int64_t ev_epoch_ = -1;
  int64_t reroutes_ = 0;
  std::vector<int32_t> moving_;
};

Executor::Executor(const ProblemView& p)
    : p_(p), n_(p.num_ops), m_(p.num_links), solver_(p.num_links) {
  check_input();
  build_successors();
  op_lat_.resize(n_);
  double prefix = 0.0;  // np.cumsum: a sequential sum, the same rounding
  for (std::size_t op = 0; op < n_; ++op) {
    const double before = prefix;
    for (int64_t i = p_.path_offsets[op]; i < p_.path_offsets[op + 1]; ++i) {
      prefix += p_.link_latency_ns[p_.path_links[i]];
    }
    op_lat_[op] = prefix - before;
  }
  const std::size_t det_entries =
      p_.num_detours ? static_cast<std::size_t>(p_.reroute_offsets[p_.num_detours]) : 0;
  det_lat_prefix_.resize(det_entries + 1);
  det_lat_prefix_[0] = 0.0;
  for (std::size_t i = 0; i < det_entries; ++i) {
    det_lat_prefix_[i + 1] = det_lat_prefix_[i] + p_.link_latency_ns[p_.reroute_links[i]];
  }
  for (std::size_t j = 0; j < p_.num_detours; ++j) {
    const auto len = static_cast<std::size_t>(p_.reroute_offsets[j + 1] - p_.reroute_offsets[j]);
    max_path_ = std::max(max_path_, len);
  }
  down_.assign(m_, 0);
  nominal_.resize(m_);
  for (std::size_t l = 0; l < m_; ++l) nominal_[l] = p_.link_gbps[l] / 8.0;  // Gb/s -> B/ns
  cap_ = nominal_;
  link_flows_.resize(m_);
  dirty_mark_.assign(m_, 0);
  link_seen_.assign(m_, 0);
}

void Executor::check_input() const {
  if (n_ >= kMaxOps) {
    throw InputError("flow: " + std::to_string(n_) + " ops; the native engine takes fewer than "
                     "2^30 ops");
  }
  for (std::size_t e = 0; e < p_.num_edges; ++e) {
    const int64_t a = p_.pred64 ? p_.pred64[e] : p_.pred32[e];
    const int64_t b = p_.succ64 ? p_.succ64[e] : p_.succ32[e];
    const int64_t n = static_cast<int64_t>(n_);
    if (a < 0 || b < 0 || a >= n || b >= n) {
      throw InputError("flow: deps reference op " + std::to_string(a < 0 || a >= n ? a : b) +
                       " but the trace has " + std::to_string(n_) + " ops");
    }
  }
  if (p_.path_offsets[0] != 0) throw InputError("flow: path_offsets[0] must be 0");
  for (std::size_t op = 0; op < n_; ++op) {
    const int64_t a = p_.path_offsets[op];
    const int64_t b = p_.path_offsets[op + 1];
    if (b < a) throw InputError("flow: path_offsets must not decrease");
    for (int64_t i = a; i < b; ++i) {
      const int32_t l = p_.path_links[i];
      if (l < 0 || static_cast<std::size_t>(l) >= m_) {
        throw InputError("flow: op " + std::to_string(op) + " crosses link " +
                         std::to_string(l) + " but the topology has " + std::to_string(m_) +
                         " links");
      }
      for (int64_t j = a; j < i; ++j) {
        if (p_.path_links[j] == l) {
          throw InputError("flow: op " + std::to_string(op) + " crosses link " +
                           std::to_string(l) + " twice; paths must be simple");
        }
      }
    }
  }
  if (p_.num_detours && p_.reroute_offsets[0] != 0) {
    throw InputError("flow: reroute_offsets[0] must be 0");
  }
  for (std::size_t j = 0; j < p_.num_detours; ++j) {
    if (j && p_.reroute_key[j] <= p_.reroute_key[j - 1]) {
      throw InputError("flow: reroute keys must rise");
    }
    if (p_.reroute_offsets[j + 1] <= p_.reroute_offsets[j]) {
      throw InputError("flow: detour " + std::to_string(j) + " has no links");
    }
    for (int64_t i = p_.reroute_offsets[j]; i < p_.reroute_offsets[j + 1]; ++i) {
      const int32_t l = p_.reroute_links[i];
      if (l < 0 || static_cast<std::size_t>(l) >= m_) {
        throw InputError("flow: detour " + std::to_string(j) + " crosses link " +
                         std::to_string(l) + " but the topology has " + std::to_string(m_) +
                         " links");
      }
    }
  }
  if (p_.num_slow_ranks) {
    for (std::size_t op = 0; op < n_; ++op) {
      if (p_.kind[op] == kKindCompute &&
          (p_.rank[op] < 0 || static_cast<std::size_t>(p_.rank[op]) >= p_.num_slow_ranks)) {
        throw InputError("flow: compute op " + std::to_string(op) + " has rank " +
                         std::to_string(p_.rank[op]) + " outside the slowdown schedule's " +
                         std::to_string(p_.num_slow_ranks) + " ranks");
      }
    }
  }
  for (std::size_t e = 0; e < p_.num_events; ++e) {
    const int64_t l = p_.events_link[e];
    if (l < 0 || static_cast<std::size_t>(l) >= m_) {
      throw InputError("flow: link event " + std::to_string(e) + " names link " +
                       std::to_string(l) + " but the topology has " + std::to_string(m_) +
                       " links");
    }
  }
}

void Executor::build_successors() {
  // CSR of successors, each op's in edge order (executor.py: a stable argsort by pred)
  succ_off_.assign(n_ + 1, 0);
  indeg_.assign(n_, 0);
  for (std::size_t e = 0; e < p_.num_edges; ++e) {
    const int64_t a = p_.pred64 ? p_.pred64[e] : p_.pred32[e];
    const int64_t b = p_.succ64 ? p_.succ64[e] : p_.succ32[e];
    ++succ_off_[a + 1];
    ++indeg_[b];
  }
  for (std::size_t i = 0; i < n_; ++i) succ_off_[i + 1] += succ_off_[i];
  succ_list_.resize(p_.num_edges);
  // fill through succ_off_[a] as the cursor of op a (no copy of the offsets), which moves
  // each op's offset to the next op's: shift them back afterwards
  for (std::size_t e = 0; e < p_.num_edges; ++e) {
    const int64_t a = p_.pred64 ? p_.pred64[e] : p_.pred32[e];
    const int64_t b = p_.succ64 ? p_.succ64[e] : p_.succ32[e];
    succ_list_[succ_off_[a]++] = static_cast<int32_t>(b);
  }
  for (std::size_t i = n_; i > 0; --i) succ_off_[i] = succ_off_[i - 1];
  succ_off_[0] = 0;
  for (std::size_t op = 0; op < n_; ++op) {
    const auto len = static_cast<std::size_t>(p_.path_offsets[op + 1] - p_.path_offsets[op]);
    max_path_ = std::max(max_path_, len);
  }
}

void Executor::finish(int32_t op, double t) {
  end_[op] = t;
  ++done_;
  for (int64_t j = succ_off_[op]; j < succ_off_[op + 1]; ++j) {
    const int32_t s = succ_list_[j];
    if (--indeg_[s] == 0) ready_.push_back(s);
  }
}

void Executor::start_flow(int32_t op, double t) {
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(s_op_.size());
    s_op_.push_back(-1);
    s_rate_.push_back(0.0);
    s_rem_.push_back(0.0);
    s_tlast_.push_back(0.0);
    s_due_.push_back(-1.0);
    s_pos_.resize(s_pos_.size() + max_path_);
    s_path_.push_back(nullptr);
    s_len_.push_back(0);
    s_lat_.push_back(0.0);
    s_det_.push_back(-1);
    slot_seen_.push_back(0);
  }
  ++active_;
  s_op_[slot] = op;
  s_rate_[slot] = 0.0;
  s_rem_[slot] = static_cast<double>(p_.nbytes[op]);
  s_tlast_[slot] = t;
  s_due_[slot] = -1.0;
  int64_t detour = -1;
  if (num_down_ > 0) {  // its route is down: start on the detour, if there is one
    for (int64_t i = p_.path_offsets[op]; i < p_.path_offsets[op + 1]; ++i) {
      if (cap_[p_.path_links[i]] == 0.0) {
        detour = find_detour(op);
        if (detour >= 0) ++reroutes_;
        break;
      }
    }
  }
  attach(slot, detour);
}

void Executor::attach(int32_t slot, int64_t detour) {
  // Put the slot's flow on its route (detour -1) or on detour `detour`, on every link's list.
  const int32_t op = s_op_[slot];
  s_det_[slot] = detour;
  if (detour < 0) {
    s_path_[slot] = p_.path_links + p_.path_offsets[op];
    s_len_[slot] = static_cast<int32_t>(p_.path_offsets[op + 1] - p_.path_offsets[op]);
    s_lat_[slot] = latency(op);
  } else {
    const int64_t a = p_.reroute_offsets[detour];
    const int64_t b = p_.reroute_offsets[detour + 1];
    s_path_[slot] = p_.reroute_links + a;
    s_len_[slot] = static_cast<int32_t>(b - a);
    s_lat_[slot] = det_lat_prefix_[b] - det_lat_prefix_[a];
  }
  const int32_t* path = s_path_[slot];
  for (int32_t i = 0; i < s_len_[slot]; ++i) {
    const int32_t l = path[i];
    s_pos_[slot * max_path_ + i] = static_cast<int32_t>(link_flows_[l].size());
    link_flows_[l].push_back(slot);
    mark_dirty(l);
  }
}

int64_t Executor::find_detour(int32_t op) const {
  const int64_t key = ev_epoch_ * static_cast<int64_t>(n_) + op;
  const int64_t* end = p_.reroute_key + p_.num_detours;
  const int64_t* it = std::lower_bound(p_.reroute_key, end, key);
  return (it != end && *it == key) ? static_cast<int64_t>(it - p_.reroute_key) : -1;
}

double Executor::compute_end(int32_t op, double t) const {
  // trace/slowdowns.py stretched_end, step for step
  double fin = t + static_cast<double>(p_.duration_ns[op]);
  if (p_.kind[op] != kKindCompute || !p_.num_slow_ranks) return fin;
  const int32_t r = p_.rank[op];
  const int64_t a = p_.slow_offsets[r];
  const int64_t b = p_.slow_offsets[r + 1];
  if (a == b) return fin;
  double cur = t;
  double rem = static_cast<double>(p_.duration_ns[op]);
  for (int64_t i = a; i < b; ++i) {
    const double lo = p_.slow_lo_ns[i];
    const double hi = p_.slow_hi_ns[i];
    const double f = p_.slow_factor[i];
    if (hi <= cur) continue;
    if (lo > cur) {
      const double gap = lo - cur;
      if (rem <= gap) return cur + rem;
      rem -= gap;
      cur = lo;
    }
    const double span = hi - cur;
    const double need = rem * f;
    if (need <= span) return cur + need;
    rem -= span / f;
    if (rem < 0.0) rem = 0.0;
    cur = hi;
  }
  return cur + rem;
}

void Executor::detach(int32_t slot) {
  // Take the slot's flow off every link of its current path.
  const int32_t* path = s_path_[slot];
  for (int32_t i = 0; i < s_len_[slot]; ++i) {
    const int32_t l = path[i];
    std::vector<int32_t>& lf = link_flows_[l];
    const int32_t pos = s_pos_[slot * max_path_ + i];
    const int32_t last = lf.back();
    lf[pos] = last;  // swap-remove; the moved slot learns its new position on this link
    lf.pop_back();
    if (last != slot) {
      const int32_t* lp = s_path_[last];
      for (int32_t j = 0;; ++j) {
        if (lp[j] == l) {
          s_pos_[last * max_path_ + j] = pos;
          break;
        }
      }
    }
    if (!lf.empty()) mark_dirty(l);  // a link left empty changes nobody's rate
  }
}

void Executor::reroute(double t) {
  // executor.py _reroute: every transmitting flow over a down link that has a detour for this
  // epoch moves to it, in op order; its bytes left are settled at t.
  moving_.clear();
  for (std::size_t l = 0; l < m_; ++l) {
    if (!down_[l]) continue;
    for (const int32_t slot : link_flows_[l]) moving_.push_back(slot);
  }
  std::sort(moving_.begin(), moving_.end(),
            [this](int32_t a, int32_t b) { return s_op_[a] < s_op_[b]; });
  moving_.erase(std::unique(moving_.begin(), moving_.end()), moving_.end());
  for (const int32_t slot : moving_) {
    const int64_t detour = find_detour(s_op_[slot]);
    if (detour < 0) continue;
    const double old = s_rate_[slot];
    if (old > 0.0) {
      const double left = s_rem_[slot] - old * (t - s_tlast_[slot]);
      s_rem_[slot] = left > 0.0 ? left : 0.0;
    }
    s_tlast_[slot] = t;
    s_rate_[slot] = 0.0;
    s_due_[slot] = -1.0;  // its pending last byte is void; the re-solve schedules anew
    detach(slot);
    attach(slot, detour);
    ++reroutes_;
  }
}

void Executor::stop_flow(int32_t slot) {
  detach(slot);
  s_op_[slot] = -1;
  free_slots_.push_back(slot);
  --active_;
}

void Executor::resolve_dirty(double t) {
  // executor.py's _components: the groups of active flows connected to a dirty link through
  // shared links; each is independent of the others and solved on its own.
  ++epoch_;
  for (const int32_t seed : dirty_) {
    dirty_mark_[seed] = 0;
    if (link_seen_[seed] == epoch_ || link_flows_[seed].empty()) continue;
    link_seen_[seed] = epoch_;
    stack_.assign(1, seed);
    group_.clear();
    while (!stack_.empty()) {
      const int32_t l = stack_.back();
      stack_.pop_back();
      for (const int32_t slot : link_flows_[l]) {
        if (slot_seen_[slot] == epoch_) continue;
        slot_seen_[slot] = epoch_;
        group_.push_back(slot);
        const int32_t* path = s_path_[slot];
        for (int32_t i = 0; i < s_len_[slot]; ++i) {
          const int32_t o = path[i];
          if (link_seen_[o] != epoch_) {
            link_seen_[o] = epoch_;
            stack_.push_back(o);
          }
        }
      }
    }
    solve_group(t);
  }
  dirty_.clear();
}

void Executor::solve_group(double t) {
  ++recomputes_;
  const std::size_t k = group_.size();
  solved_flows_ += static_cast<int64_t>(k);
  group_rates_.resize(k);
  if (k == 1) {  // alone: its bottleneck link
    const int32_t* path = s_path_[group_[0]];
    double r = kInf;
    for (int32_t i = 0; i < s_len_[group_[0]]; ++i) r = std::min(r, cap_[path[i]]);
    group_rates_[0] = r;
  } else {
    group_paths_.resize(k);
    group_lens_.resize(k);
    for (std::size_t i = 0; i < k; ++i) {
      group_paths_[i] = s_path_[group_[i]];
      group_lens_[i] = s_len_[group_[i]];
    }
    solver_.solve(k, group_paths_.data(), group_lens_.data(), cap_.data(), group_rates_.data());
  }
  for (std::size_t i = 0; i < k; ++i) {
    const int32_t f = group_[i];
    const double r = group_rates_[i];
    const double old = s_rate_[f];
    if (r == old) continue;  // its pending finish stays valid
    if (old > 0.0) {
      const double left = s_rem_[f] - old * (t - s_tlast_[f]);
      s_rem_[f] = left > 0.0 ? left : 0.0;
    }
    s_tlast_[f] = t;
    s_rate_[f] = r;
    if (r > 0.0) {
      const double fin = t + s_rem_[f] / r;
      s_due_[f] = fin;
      calendar_.push(fin, ~f);
    } else {
      s_due_[f] = -1.0;
    }
  }
}

RunResult Executor::run(const ProgressHook& hook) {
  RunResult res;
  res.start_ns.reset(new double[n_]);
  res.end_ns.reset(new double[n_]);
  start_ = res.start_ns.get();
  end_ = res.end_ns.get();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::fill(start_, start_ + n_, nan);
  std::fill(end_, end_ + n_, nan);

  std::vector<std::size_t> ev_order(p_.num_events);
  std::iota(ev_order.begin(), ev_order.end(), std::size_t{0});
  std::stable_sort(ev_order.begin(), ev_order.end(), [this](std::size_t a, std::size_t b) {
    return p_.events_at_ns[a] < p_.events_at_ns[b];
  });
  std::size_t ev_i = 0;
  double next_ev = p_.num_events ? p_.events_at_ns[ev_order[0]] : kInf;

  const int64_t n = static_cast<int64_t>(n_);
  const int64_t report_every = std::max<int64_t>(1, n / 100);
  int64_t next_report = report_every;
  int64_t max_active = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    if (indeg_[i] == 0) ready_.push_back(static_cast<int32_t>(i));
  }
  double t = 0.0;
  while (true) {
    // 1. start everything that became ready at t (barriers and 0-time ops cascade)
    while (!ready_.empty() || !began_.empty()) {
      int32_t op;
      bool flow;
      if (!began_.empty()) {
        op = began_.back();
        began_.pop_back();
        flow = true;
      } else {
        op = ready_.back();
        ready_.pop_back();
        start_[op] = t;
        flow = p_.kind[op] == kKindFlow;
        if (flow && p_.duration_ns[op] > 0) {  // start latency first
          calendar_.push(t + static_cast<double>(p_.duration_ns[op]), kLatencyKey + op);
          continue;
        }
      }
      if (flow) {
        if (p_.path_offsets[op] != p_.path_offsets[op + 1] && p_.nbytes[op] > 0) {
          start_flow(op, t);
          continue;
        }
        const double fin = t + latency(op);  // nothing to send: only the latency
        if (fin > t) {
          calendar_.push(fin, op);
          continue;
        }
      } else if (p_.duration_ns[op] > 0) {  // compute (interval slowdowns), timed barrier
        calendar_.push(compute_end(op, t), op);
        continue;
      }
      finish(op, t);  // barrier, zero-time compute, zero-latency empty flow: ends now
    }
    max_active = std::max(max_active, active_);
    // 2. re-solve the flows connected to what changed
    if (!dirty_.empty()) resolve_dirty(t);
    if (done_ >= next_report) {
      if (!hook(done_, n)) {
        res.aborted = true;
        break;
      }
      next_report = done_ + report_every;
    }
    // 3. take everything due at the next instant
    if (!calendar_.empty()) {
      t = calendar_.next_time() <= next_ev ? calendar_.next_time() : next_ev;
    } else if (next_ev < kInf) {
      t = next_ev;
    } else {
      break;
    }
    if (!calendar_.empty() && calendar_.next_time() == t) {
      calendar_.pop_next(due_);
      for (const int32_t key : due_) {
        if (key >= 0) {
          ++events_;
          finish(key, t);
          continue;
        }
        if (key < -static_cast<int32_t>(kMaxOps)) {  // a start latency ended
          ++events_;
          began_.push_back(key - kLatencyKey);
          continue;
        }
        const int32_t slot = ~key;
        if (s_op_[slot] < 0 || s_due_[slot] != t) continue;  // superseded by a rate change
        s_due_[slot] = -1.0;
        ++events_;
        const int32_t op = s_op_[slot];
        const double fin = t + s_lat_[slot];  // its route's or its detour's latency
        stop_flow(slot);
        if (fin > t) {
          calendar_.push(fin, op);
          continue;
        }
        finish(op, t);
      }
    }
    if (ev_i < p_.num_events && p_.events_at_ns[ev_order[ev_i]] <= t) {
      while (ev_i < p_.num_events && p_.events_at_ns[ev_order[ev_i]] <= t) {
        const std::size_t e = ev_order[ev_i];
        const int64_t link = p_.events_link[e];
        cap_[link] = nominal_[link] * p_.events_factor[e];
        const uint8_t is_down = cap_[link] == 0.0 ? 1 : 0;
        num_down_ += static_cast<int64_t>(is_down) - static_cast<int64_t>(down_[link]);
        down_[link] = is_down;
        if (!link_flows_[link].empty()) mark_dirty(static_cast<int32_t>(link));
        ++events_;
        ++ev_i;
      }
      ++ev_epoch_;
      if (num_down_ > 0 && p_.num_detours) reroute(t);
    }
    next_ev = ev_i < p_.num_events ? p_.events_at_ns[ev_order[ev_i]] : kInf;
  }

  res.done = done_;
  res.events = events_;
  res.max_active_flows = max_active;
  res.rate_recomputations = recomputes_;
  res.solved_flows = solved_flows_;
  res.reroutes = reroutes_;
  if (done_ < n) {  // what the caller needs to say why the run got stuck
    std::vector<std::pair<int32_t, int32_t>> active;  // (op, slot)
    for (std::size_t slot = 0; slot < s_op_.size(); ++slot) {
      if (s_op_[slot] >= 0) active.emplace_back(s_op_[slot], static_cast<int32_t>(slot));
    }
    std::sort(active.begin(), active.end());
    for (const auto& [op, slot] : active) {
      res.active_ops.push_back(op);
      res.active_rates.push_back(s_rate_[slot]);
      res.active_detours.push_back(s_det_[slot]);
    }
    res.capacity = cap_;
  }
  return res;
}

}  // namespace

namespace {

// This thread's CPU time in s (0 where the clock is missing).
double thread_cpu_s() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

RunResult run_flows(const ProblemView& problem, const ProgressHook& hook) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_s();
  Executor ex(problem);
  RunResult res = ex.run(hook);
  res.cpu_s = thread_cpu_s() - c0;  // includes the progress hook's Python, if any
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace flowcore
