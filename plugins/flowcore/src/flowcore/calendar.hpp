// The event calendar of the flow core: what is due when.
//
// Distinct times live in a binary min-heap; the entries due at one time live in a bucket (in
// insertion order). Many ops end at the same instant (every rank of a stage finishes the same
// kernel together), so one heap operation serves many entries: on the 1,024-GPU plan this cuts
// heap work about tenfold against one heap entry per event. The Python reference keeps the same
// structure (a heap of times and a dict of lists).
//
// The time -> bucket index is an open-addressing hash table that is only looked up, never
// iterated, so nothing depends on its layout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace flowcore {

// Time (ns, a finite double) -> bucket number; linear probing with backward-shift deletion.
class TimeIndex {
 public:
  TimeIndex() : keys_(kInitial, kEmpty), vals_(kInitial, 0) {}

  // The slot holding `t`'s bucket number; `fresh` tells whether `t` was just added (then the
  // caller sets the value).
  uint32_t& find_or_add(double t, bool& fresh) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    const uint64_t k = bits(t);
    std::size_t i = slot_of(k);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == k) {
        fresh = false;
        return vals_[i];
      }
      i = (i + 1) & (keys_.size() - 1);
    }
    keys_[i] = k;
    ++size_;
    fresh = true;
    return vals_[i];
  }

  // Remove `t` (which must be present) and return its bucket number.
  uint32_t take(double t) {
    const uint64_t k = bits(t);
    const std::size_t mask = keys_.size() - 1;
    std::size_t i = slot_of(k);
    while (keys_[i] != k) i = (i + 1) & mask;
    const uint32_t v = vals_[i];
    // backward-shift: move later members of the probe run into the hole
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; keys_[j] != kEmpty; j = (j + 1) & mask) {
      const std::size_t home = slot_of(keys_[j]);
      // j may move to the hole if its home is not cyclically within (hole, j]
      if (((j - home) & mask) >= ((j - hole) & mask)) {
        keys_[hole] = keys_[j];
        vals_[hole] = vals_[j];
        hole = j;
      }
    }
    keys_[hole] = kEmpty;
    --size_;
    return v;
  }

 private:
  static constexpr std::size_t kInitial = 1024;
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // a NaN pattern: never a time

  static uint64_t bits(double t) {
    if (t == 0.0) t = 0.0;  // -0.0 and 0.0 are one instant
    uint64_t x;
    std::memcpy(&x, &t, sizeof x);
    return x;
  }
  std::size_t slot_of(uint64_t x) const {
    x ^= x >> 33;  // the finalizer of MurmurHash3 (public domain): well-mixed low bits
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return static_cast<std::size_t>(x) & (keys_.size() - 1);
  }
  void grow() {
    std::vector<uint64_t> old_keys(keys_.size() * 2, kEmpty);
    std::vector<uint32_t> old_vals(vals_.size() * 2, 0);
    old_keys.swap(keys_);
    old_vals.swap(vals_);
    const std::size_t mask = keys_.size() - 1;
    for (std::size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] == kEmpty) continue;
      std::size_t j = slot_of(old_keys[i]);
      while (keys_[j] != kEmpty) j = (j + 1) & mask;
      keys_[j] = old_keys[i];
      vals_[j] = old_vals[i];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  std::size_t size_ = 0;
};

class Calendar {
 public:
  // Schedule `key` at time `t` (ns).
  void push(double t, int32_t key) {
    bool fresh = false;
    uint32_t& b = index_.find_or_add(t, fresh);
    if (fresh) {
      if (free_.empty()) {
        b = static_cast<uint32_t>(buckets_.size());
        buckets_.emplace_back();
      } else {
        b = free_.back();
        free_.pop_back();
      }
      times_.push_back(t);
      std::push_heap(times_.begin(), times_.end(), std::greater<double>{});
    }
    buckets_[b].push_back(key);
  }

  bool empty() const { return times_.empty(); }

  // The earliest time with something due (only when !empty()).
  double next_time() const { return times_.front(); }

  // Move the entries due at next_time() into `out` (replacing its contents), in the order they
  // were pushed, and forget that time.
  void pop_next(std::vector<int32_t>& out) {
    const double t = times_.front();
    std::pop_heap(times_.begin(), times_.end(), std::greater<double>{});
    times_.pop_back();
    const uint32_t b = index_.take(t);
    out.swap(buckets_[b]);
    buckets_[b].clear();  // keeps its capacity for reuse
    free_.push_back(b);
  }

 private:
  std::vector<double> times_;  // min-heap of distinct times
  TimeIndex index_;
  std::vector<std::vector<int32_t>> buckets_;
  std::vector<uint32_t> free_;  // buckets not in use
};

}  // namespace flowcore
