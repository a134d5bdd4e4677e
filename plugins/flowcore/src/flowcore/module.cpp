// Python bindings (nanobind) of the compiled flow core: xsim_flowcore._flowcore.
//
// Arrays cross the boundary without copies: inputs are borrowed numpy views (the caller keeps
// them alive for the call), outputs are numpy arrays that own the C++ buffers. The event loop
// runs with the GIL released; the progress callback and the signal check take it back briefly.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "order.hpp"
#include "xsim/maxmin.hpp"

namespace nb = nanobind;

namespace {

template <typename T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyIn = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A numpy array that owns `data` (allocated with new[]).
template <typename T>
Out<T> owned(T* data, std::size_t n) {
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return Out<T>(data, {n}, owner);
}

template <typename T>
Out<T> copy_of(const std::vector<T>& v) {
  T* data = new T[v.size()];
  std::copy(v.begin(), v.end(), data);
  return owned(data, v.size());
}

// pred/succ may be int64 or int32 (both the same dtype).
void set_edges(flowcore::ProblemView& pv, const AnyIn& pred, const AnyIn& succ) {
  if (pred.shape(0) != succ.shape(0)) {
    throw std::invalid_argument("flowcore: pred and succ differ in length");
  }
  pv.num_edges = pred.shape(0);
  if (pred.dtype() == nb::dtype<int64_t>() && succ.dtype() == nb::dtype<int64_t>()) {
    pv.pred64 = static_cast<const int64_t*>(pred.data());
    pv.succ64 = static_cast<const int64_t*>(succ.data());
  } else if (pred.dtype() == nb::dtype<int32_t>() && succ.dtype() == nb::dtype<int32_t>()) {
    pv.pred32 = static_cast<const int32_t*>(pred.data());
    pv.succ32 = static_cast<const int32_t*>(succ.data());
  } else {
    throw std::invalid_argument("flowcore: pred and succ must both be int64 or both int32");
  }
}

// The what-if inputs (interval slowdowns and detours), all optional; see executor.hpp.
struct WhatIf {
  std::optional<In<int32_t>> rank;
  std::optional<In<int64_t>> slow_offsets;
  std::optional<In<double>> slow_lo_ns, slow_hi_ns, slow_factor;
  std::optional<In<int64_t>> reroute_key, reroute_offsets;
  std::optional<In<int32_t>> reroute_links;
};

void set_whatif(flowcore::ProblemView& pv, const WhatIf& w) {
  if (w.slow_offsets && w.slow_offsets->shape(0) > 1) {
    if (!w.rank || !w.slow_lo_ns || !w.slow_hi_ns || !w.slow_factor) {
      throw std::invalid_argument("flowcore: slow_offsets needs rank, slow_lo_ns, slow_hi_ns"
                                  " and slow_factor");
    }
    if (w.rank->shape(0) != pv.num_ops) {
      throw std::invalid_argument("flowcore: rank must have one entry per op");
    }
    const std::size_t segs = w.slow_lo_ns->shape(0);
    const int64_t* off = w.slow_offsets->data();
    const std::size_t nr = w.slow_offsets->shape(0) - 1;
    if (w.slow_hi_ns->shape(0) != segs || w.slow_factor->shape(0) != segs || off[0] != 0 ||
        static_cast<std::size_t>(off[nr]) != segs) {
      throw std::invalid_argument("flowcore: slowdown segment arrays differ in length");
    }
    for (std::size_t r = 0; r < nr; ++r) {
      if (off[r + 1] < off[r]) throw std::invalid_argument("flowcore: slow_offsets decrease");
    }
    pv.rank = w.rank->data();
    pv.num_slow_ranks = nr;
    pv.slow_offsets = off;
    pv.slow_lo_ns = w.slow_lo_ns->data();
    pv.slow_hi_ns = w.slow_hi_ns->data();
    pv.slow_factor = w.slow_factor->data();
  }
  if (w.reroute_key && w.reroute_key->shape(0) > 0) {
    if (!w.reroute_offsets || !w.reroute_links ||
        w.reroute_offsets->shape(0) != w.reroute_key->shape(0) + 1 ||
        static_cast<std::size_t>(w.reroute_offsets->data()[w.reroute_key->shape(0)]) !=
            w.reroute_links->shape(0)) {
      throw std::invalid_argument("flowcore: reroute_key, reroute_offsets and reroute_links"
                                  " do not form a CSR");
    }
    pv.num_detours = w.reroute_key->shape(0);
    pv.reroute_key = w.reroute_key->data();
    pv.reroute_offsets = w.reroute_offsets->data();
    pv.reroute_links = w.reroute_links->data();
  }
}

nb::dict run(In<int8_t> kind, In<int64_t> duration_ns, In<int64_t> nbytes, AnyIn pred,
             AnyIn succ, In<int64_t> path_offsets, In<int32_t> path_links,
             In<double> link_gbps, In<double> link_latency_ns, In<double> events_at_ns,
             In<int64_t> events_link, In<double> events_factor, nb::object progress,
             std::optional<In<int32_t>> rank, std::optional<In<int64_t>> slow_offsets,
             std::optional<In<double>> slow_lo_ns, std::optional<In<double>> slow_hi_ns,
             std::optional<In<double>> slow_factor, std::optional<In<int64_t>> reroute_key,
             std::optional<In<int64_t>> reroute_offsets,
             std::optional<In<int32_t>> reroute_links) {
  const std::size_t n = kind.shape(0);
  if (duration_ns.shape(0) != n || nbytes.shape(0) != n || path_offsets.shape(0) != n + 1) {
    throw std::invalid_argument("flowcore: per-op arrays differ in length");
  }
  if (link_latency_ns.shape(0) != link_gbps.shape(0)) {
    throw std::invalid_argument("flowcore: per-link arrays differ in length");
  }
  if (events_link.shape(0) != events_at_ns.shape(0) ||
      events_factor.shape(0) != events_at_ns.shape(0)) {
    throw std::invalid_argument("flowcore: link event arrays differ in length");
  }
  if (static_cast<std::size_t>(path_offsets.data()[n]) != path_links.shape(0)) {
    throw std::invalid_argument("flowcore: path_offsets[-1] must equal len(path_links)");
  }
  flowcore::ProblemView pv;
  pv.num_ops = n;
  pv.kind = kind.data();
  pv.duration_ns = duration_ns.data();
  pv.nbytes = nbytes.data();
  set_edges(pv, pred, succ);
  pv.path_offsets = path_offsets.data();
  pv.path_links = path_links.data();
  pv.num_links = link_gbps.shape(0);
  pv.link_gbps = link_gbps.data();
  pv.link_latency_ns = link_latency_ns.data();
  pv.num_events = events_at_ns.shape(0);
  pv.events_at_ns = events_at_ns.data();
  pv.events_link = events_link.data();
  pv.events_factor = events_factor.data();
  set_whatif(pv, WhatIf{rank, slow_offsets, slow_lo_ns, slow_hi_ns, slow_factor, reroute_key,
                        reroute_offsets, reroute_links});

  std::unique_ptr<nb::python_error> error;
  const flowcore::ProgressHook hook = [&](int64_t done, int64_t total) -> bool {
    nb::gil_scoped_acquire gil;
    try {
      if (PyErr_CheckSignals() != 0) throw nb::python_error();  // Ctrl-C stops the run
      if (!progress.is_none()) progress(done, total);
    } catch (nb::python_error& e) {
      error = std::make_unique<nb::python_error>(std::move(e));
      return false;
    }
    return true;
  };
  flowcore::RunResult res;
  {
    nb::gil_scoped_release nogil;
    res = flowcore::run_flows(pv, hook);
  }
  if (error) throw std::move(*error);

  nb::dict out;
  out["start_ns"] = owned(res.start_ns.release(), n);
  out["end_ns"] = owned(res.end_ns.release(), n);
  out["done"] = res.done;
  out["events"] = res.events;
  out["max_active_flows"] = res.max_active_flows;
  out["rate_recomputations"] = res.rate_recomputations;
  out["solved_flows"] = res.solved_flows;
  out["wall_s"] = res.wall_s;
  out["cpu_s"] = res.cpu_s;
  out["active_ops"] = copy_of(res.active_ops);
  out["active_rates"] = copy_of(res.active_rates);
  out["active_detours"] = copy_of(res.active_detours);
  out["reroutes"] = res.reroutes;
  out["capacity"] = copy_of(res.capacity);
  return out;
}

Out<double> maxmin(In<int64_t> flow_offsets, In<int32_t> flow_links, In<double> capacity) {
  const std::size_t k = flow_offsets.shape(0) ? flow_offsets.shape(0) - 1 : 0;
  std::vector<const int32_t*> paths(k);
  std::vector<int32_t> lens(k);
  const int64_t* off = flow_offsets.data();
  if (k && (off[0] != 0 || static_cast<std::size_t>(off[k]) != flow_links.shape(0))) {
    throw std::invalid_argument("flowcore: flow_offsets must run from 0 to len(flow_links)");
  }
  for (std::size_t i = 0; i < k; ++i) {
    if (off[i + 1] <= off[i]) throw std::invalid_argument("flowcore: a flow has no links");
    paths[i] = flow_links.data() + off[i];
    lens[i] = static_cast<int32_t>(off[i + 1] - off[i]);
    for (int32_t j = 0; j < lens[i]; ++j) {
      const int32_t l = paths[i][j];
      if (l < 0 || static_cast<std::size_t>(l) >= capacity.shape(0)) {
        throw std::invalid_argument("flowcore: link id out of range: " + std::to_string(l));
      }
    }
  }
  xsim::MaxMinSolver solver(capacity.shape(0));
  auto* rate = new double[k];
  solver.solve(k, paths.data(), lens.data(), capacity.data(), rate);
  return owned(rate, k);
}

int64_t unordered_ops(AnyIn pred, AnyIn succ, std::size_t num_ops) {
  flowcore::ProblemView pv;
  set_edges(pv, pred, succ);
  int64_t left = 0;
  {
    nb::gil_scoped_release nogil;
    left = flowcore::unordered_ops(num_ops, pv.num_edges, pv.pred64, pv.succ64, pv.pred32,
                                   pv.succ32);
  }
  return left;
}

}  // namespace

NB_MODULE(_flowcore, m) {
  m.doc() = "Compiled event loop and max-min solver of the xsim-adapters flow backend.";
  // Bumped whenever run()'s arguments or result change; the backend checks it.
  // 2: a flow's duration_ns is its start latency; interval slowdowns and reroutes
  // 3: both in one core (the merged interface)
  m.attr("INTERFACE_VERSION") = 3;
  m.def("run", &run, nb::arg("kind").noconvert(), nb::arg("duration_ns").noconvert(),
        nb::arg("nbytes").noconvert(), nb::arg("pred").noconvert(),
        nb::arg("succ").noconvert(), nb::arg("path_offsets").noconvert(),
        nb::arg("path_links").noconvert(), nb::arg("link_gbps").noconvert(),
        nb::arg("link_latency_ns").noconvert(), nb::arg("events_at_ns").noconvert(),
        nb::arg("events_link").noconvert(), nb::arg("events_factor").noconvert(),
        nb::arg("progress").none(), nb::arg("rank").noconvert() = nb::none(),
        nb::arg("slow_offsets").noconvert() = nb::none(),
        nb::arg("slow_lo_ns").noconvert() = nb::none(),
        nb::arg("slow_hi_ns").noconvert() = nb::none(),
        nb::arg("slow_factor").noconvert() = nb::none(),
        nb::arg("reroute_key").noconvert() = nb::none(),
        nb::arg("reroute_offsets").noconvert() = nb::none(),
        nb::arg("reroute_links").noconvert() = nb::none(),
        "Execute the flow DAG; returns a dict (see xsim_flowcore.run_flows).");
  m.def("maxmin", &maxmin, nb::arg("flow_offsets").noconvert(),
        nb::arg("flow_links").noconvert(), nb::arg("capacity").noconvert(),
        "Max-min fair rates of flows given as a CSR of link ids.");
  m.def("unordered_ops", &unordered_ops, nb::arg("pred").noconvert(),
        nb::arg("succ").noconvert(), nb::arg("num_ops"),
        "How many of num_ops ops Kahn's algorithm cannot order (0: the edges form a DAG).");
}
