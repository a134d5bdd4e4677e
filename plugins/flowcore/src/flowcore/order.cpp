// Kahn's algorithm over a CSR of successors: see order.hpp.
#include "order.hpp"

#include <string>
#include <vector>

#include "executor.hpp"  // InputError

namespace flowcore {

namespace {

template <typename T>
int64_t count_unordered(std::size_t n, std::size_t m, const T* pred, const T* succ) {
  std::vector<int64_t> off(n + 1, 0);
  std::vector<int32_t> indeg(n, 0);
  for (std::size_t i = 0; i < m; ++i) {
    const T a = pred[i], b = succ[i];
    if (a < 0 || b < 0 || static_cast<std::size_t>(a) >= n ||
        static_cast<std::size_t>(b) >= n) {
      throw InputError("flowcore: edge " + std::to_string(i) + " names an op outside 0.." +
                       std::to_string(n ? n - 1 : 0));
    }
    ++off[static_cast<std::size_t>(a) + 1];
    ++indeg[static_cast<std::size_t>(b)];
  }
  for (std::size_t i = 0; i < n; ++i) off[i + 1] += off[i];
  std::vector<int32_t> targets(m);
  {
    std::vector<int64_t> cursor(off.begin(), off.end() - 1);
    for (std::size_t i = 0; i < m; ++i) {
      targets[static_cast<std::size_t>(cursor[static_cast<std::size_t>(pred[i])]++)] =
          static_cast<int32_t>(succ[i]);
    }
  }
  // The ready ops as a stack in one vector: each op is pushed at most once (when its
  // in-degree reaches zero), so `ready` never holds more than n entries.
  std::vector<int32_t> ready;
  ready.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (indeg[i] == 0) ready.push_back(static_cast<int32_t>(i));
  }
  int64_t ordered = 0;
  while (!ready.empty()) {
    const int32_t op = ready.back();
    ready.pop_back();
    ++ordered;
    for (int64_t j = off[static_cast<std::size_t>(op)]; j < off[static_cast<std::size_t>(op) + 1];
         ++j) {
      const int32_t s = targets[static_cast<std::size_t>(j)];
      if (--indeg[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
    }
  }
  return static_cast<int64_t>(n) - ordered;
}

}  // namespace

int64_t unordered_ops(std::size_t num_ops, std::size_t num_edges, const int64_t* pred64,
                      const int64_t* succ64, const int32_t* pred32, const int32_t* succ32) {
  if (num_ops >= (static_cast<std::size_t>(1) << 31)) {
    throw InputError("flowcore: more than 2^31 - 1 ops");
  }
  if (pred64 != nullptr) return count_unordered(num_ops, num_edges, pred64, succ64);
  return count_unordered(num_ops, num_edges, pred32, succ32);
}

}  // namespace flowcore
