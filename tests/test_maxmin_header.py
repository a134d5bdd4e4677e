"""The shared C++ max-min header (``xsim_adapters/include/xsim/maxmin.hpp``) on its own.

The flow core, the ns-3 engine and the htsim driver all compile this one header; here a small
program built from it with g++ solves systems read from stdin, in both of the solver's calling
forms (a path accessor over int64 link lists, as ns-3 and htsim call it; pointer arrays of
int32, as the flow core does), and prints rates as hex floats. The rates must equal the Python
reference (``xsim_adapters/backends/flow/maxmin.py``) bit for bit, in its per-entry form and in
its numpy form (above SMALL_ENTRIES entries); the tie tolerance, the no-link and failed-link
cases and the fluid completion rule are checked against their closed forms.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from xsim_adapters.backend_api import NATIVE_INCLUDE_DIR
from xsim_adapters.backends.flow.maxmin import SMALL_ENTRIES, maxmin_rates

PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "xsim/maxmin.hpp"

int main(int argc, char**) {
  if (argc > 1) {  // the fluid completion rule: "done rem rate" / "wait ticks" lines
    char what[8];
    double a, b;
    while (std::scanf("%7s %la %la", what, &a, &b) == 3) {
      if (what[0] == 'd') std::printf("%d\n", xsim::fluid_done(a, b) ? 1 : 0);
      else std::printf("%lld\n", (long long)xsim::fluid_wait_ticks(a));
    }
    return 0;
  }
  int mode, k, m;
  while (std::scanf("%d %d %d", &mode, &k, &m) == 3) {
    std::vector<std::vector<long long>> paths(k);
    for (int f = 0; f < k; ++f) {
      int len;
      std::scanf("%d", &len);
      paths[f].resize(len);
      for (int i = 0; i < len; ++i) std::scanf("%lld", &paths[f][i]);
    }
    std::vector<double> cap(m), rate(k);
    for (int l = 0; l < m; ++l) std::scanf("%la", &cap[l]);
    xsim::MaxMinSolver solver(m);
    if (mode == 0) {  // ns-3 / htsim form: a path accessor over int64 links
      solver.solve(k, [&](std::size_t f) -> const std::vector<long long>& { return paths[f]; },
                   cap.data(), rate.data());
    } else {  // flow-core form: pointer arrays of int32 links
      std::vector<std::vector<int32_t>> p32(k);
      std::vector<const int32_t*> ptr(k);
      std::vector<int32_t> len(k);
      for (int f = 0; f < k; ++f) {
        p32[f].assign(paths[f].begin(), paths[f].end());
        ptr[f] = p32[f].data();
        len[f] = (int32_t)p32[f].size();
      }
      solver.solve(k, ptr.data(), len.data(), cap.data(), rate.data());
    }
    for (int f = 0; f < k; ++f) std::printf("%a\n", rate[f]);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def solver_exe(tmp_path_factory) -> str:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++) to build the header's test program")
    d = tmp_path_factory.mktemp("maxmin-header")
    src = d / "solve.cpp"
    src.write_text(PROGRAM)
    exe = d / "solve"
    proc = subprocess.run([cxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror",
                           "-ffp-contract=off", f"-I{NATIVE_INCLUDE_DIR}", str(src), "-o",
                           str(exe)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return str(exe)


def solve(exe: str, flow_links: list[list[int]], capacity: list[float], mode: int) -> list[float]:
    lines = [f"{mode} {len(flow_links)} {len(capacity)}"]
    lines += [" ".join(map(str, [len(p), *p])) for p in flow_links]
    lines += [float(c).hex() for c in capacity]
    out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         check=True).stdout.split()
    return [float.fromhex(x) if x not in ("inf", "-inf") else float(x) for x in out]


def random_system(rng: np.random.Generator, flows: int, links: int) -> tuple[list, list]:
    paths = [sorted(rng.choice(links, size=int(rng.integers(1, 5)), replace=False).tolist())
             for _ in range(flows)]
    cap = rng.choice([100.0, 50.0, 12.5, 400.0 / 3.0, 900.0], size=links).tolist()
    return paths, cap


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("flows, links", [(6, 5), (40, 12), (150, 40)])
def test_header_matches_the_python_reference_bit_for_bit(solver_exe, mode, flows, links):
    rng = np.random.default_rng(flows * 7 + links)
    paths, cap = random_system(rng, flows, links)
    entries = sum(len(p) for p in paths)
    assert (entries <= SMALL_ENTRIES) == (flows < 150)  # both of the reference's forms are hit
    assert solve(solver_exe, paths, cap, mode) == maxmin_rates(paths, cap)


@pytest.mark.parametrize("mode", [0, 1])
def test_closed_forms(solver_exe, mode):
    # Link 0 (10) carries flows 0 and 1, link 1 (4) flows 1 and 2: link 1 fills first at 2
    # each, then flow 0 takes the 8 left on link 0.
    assert solve(solver_exe, [[0], [0, 1], [1]], [10.0, 4.0], mode) == [8.0, 2.0, 2.0]
    # A failed link (capacity 0) stops its flows; the others share what is left.
    assert solve(solver_exe, [[0, 1], [1], [1]], [0.0, 9.0], mode) == [0.0, 4.5, 4.5]


def test_shares_within_the_tie_tolerance_saturate_together(solver_exe):
    # Link 0: 2.0 for two flows (share 1.0); link 1: one flow, share 1 + 5e-13, within the
    # relative tolerance 1e-12 of 1.0: one level, so that flow gets exactly 1.0. At 1 + 4e-12 the
    # links are two levels and the flow keeps its own share.
    near = 1.0 + 5e-13
    assert solve(solver_exe, [[0], [0], [1]], [2.0, near], 0) == [1.0, 1.0, 1.0]
    far = 1.0 + 4e-12
    assert solve(solver_exe, [[0], [0], [1]], [2.0, far], 0) == [1.0, 1.0, far]
    assert maxmin_rates([[0], [0], [1]], [2.0, near]) == [1.0, 1.0, 1.0]  # the same tolerance
    assert maxmin_rates([[0], [0], [1]], [2.0, far]) == [1.0, 1.0, far]


def test_a_flow_crossing_no_link_is_unlimited(solver_exe):
    assert solve(solver_exe, [[], [0]], [3.0], 0) == [float("inf"), 3.0]


def test_fluid_completion_rule(solver_exe):
    """Done when the rest takes at most half a tick (+ 1e-6 bytes of noise); the next check is
    the time left rounded up to a tick, except within 1e-6 tick above a whole one; >= 1 tick."""
    cases = [("d", 50.0, 100.0), ("d", 50.0 + 1e-6, 100.0), ("d", 50.0 + 4e-6, 100.0),
             ("d", 1e-6, 0.0), ("d", 3e-6, 0.0),
             ("w", 3.0 + 5e-7, 0.0), ("w", 3.0 + 4e-6, 0.0), ("w", 2.5, 0.0), ("w", 0.0, 0.0),
             ("w", -7.0, 0.0)]
    text = "".join(f"{w} {a.hex()} {b.hex()}\n" for w, a, b in cases)
    out = subprocess.run([solver_exe, "rule"], input=text, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", "1", "0", "1", "0", "3", "4", "3", "1", "1"]
