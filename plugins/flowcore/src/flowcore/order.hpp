// Topological order check of a dependency graph (Kahn's algorithm), for trace validation:
// xsim_adapters/trace/validate.py asks it whether a trace's edges form a cycle before any
// backend runs. The numpy form there (one pass per level) is the reference; this is the same
// count in one linear pass, without the per-level Python overhead that dominates deep traces.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flowcore {

// How many of the `num_ops` ops Kahn's algorithm cannot order: 0 if and only if the edges
// (pred[i] -> succ[i], i < num_edges) form a DAG. Ops are 0..num_ops-1; every id must be in
// range (InputError otherwise). Exactly one of the 64-bit or 32-bit pairs is given.
int64_t unordered_ops(std::size_t num_ops, std::size_t num_edges, const int64_t* pred64,
                      const int64_t* succ64, const int32_t* pred32, const int32_t* succ32);

}  // namespace flowcore
