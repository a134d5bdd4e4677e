"""Max-min fair rates by progressive filling (water filling).

Every flow crosses a set of links; each link has a capacity. All unfrozen flows grow at the
same rate until some link is full; the flows on the full links freeze at that rate; repeat.
The result is the unique max-min fair allocation: no flow can get more without taking from a
flow that has no more.

One algorithm, in two forms chosen by size (and tested to agree to 1e-12 on random systems in
tests/test_flow_backend.py): plain Python for the small systems that make up almost every
recomputation (a ring step on NVSwitch links touches a handful of links: 8 flows on 7 links
take ~67 us in Python and ~820 us through numpy's fixed per-call costs, measured on the CI
machine), and numpy for big systems (thousands of flows on a shared fabric), where per-entry
Python costs more. This module is the reference of the one C++ solver,
``xsim_adapters/include/xsim/maxmin.hpp``, which the flow core, the ns-3 engine and the htsim
driver compile: it repeats both forms operation for operation (tests/test_maxmin_header.py: bit
for bit; tests/test_fluid_engines.py: the engines on the same traces).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Links whose fair share is within this relative distance of the minimum saturate together;
# without it float noise splits one level into many and can leave a link overfull by 1 ulp.
# The C++ header's kMaxMinRelTol / kMaxMinSmallEntries are these (tests/test_backend_api.py).
_REL_TOL = 1e-12
SMALL_ENTRIES = 300  # up to this many (flow, link) entries the Python version is faster


def maxmin_rates(flow_links: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rate of each flow (same unit as ``capacity``, e.g. bytes/ns).

    ``flow_links[i]`` are the link ids flow ``i`` crosses (non-empty, no repeats);
    ``capacity[l]`` is link ``l``'s capacity (0 for a failed link: its flows get rate 0).
    """
    entries = sum(len(links) for links in flow_links)
    if entries <= SMALL_ENTRIES:
        return _maxmin_python(flow_links, capacity)
    return _maxmin_numpy(flow_links, capacity).tolist()


def _maxmin_python(flow_links: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    rem: dict[int, float] = {}
    cnt: dict[int, int] = {}
    on_link: dict[int, list[int]] = {}
    for f, links in enumerate(flow_links):
        for link in links:
            if link in cnt:
                cnt[link] += 1
                on_link[link].append(f)
            else:
                rem[link] = capacity[link]
                cnt[link] = 1
                on_link[link] = [f]
    rate: list[float] = [-1.0] * len(flow_links)
    unfrozen = len(flow_links)
    while unfrozen:
        s = min(rem[link] / c for link, c in cnt.items() if c)
        if s < 0.0:
            s = 0.0
        limit = s + s * _REL_TOL
        full = [link for link, c in cnt.items() if c and rem[link] / c <= limit]
        for link in full:
            for f in on_link[link]:
                if rate[f] >= 0.0:
                    continue
                rate[f] = s
                unfrozen -= 1
                for other in flow_links[f]:
                    rem[other] -= s
                    cnt[other] -= 1
    return rate


def _maxmin_numpy(flow_links: Sequence[Sequence[int]], capacity: Sequence[float]) -> np.ndarray:
    k = len(flow_links)
    lens = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=k)
    fidx = np.repeat(np.arange(k, dtype=np.int64), lens)
    glinks = np.fromiter(
        (link for links in flow_links for link in links), dtype=np.int64, count=int(lens.sum())
    )
    uniq, lidx = np.unique(glinks, return_inverse=True)
    m = len(uniq)
    cap = np.fromiter((capacity[link] for link in uniq.tolist()), dtype=np.float64, count=m)
    return maxmin_entries(fidx, lidx, cap, k, m)


def maxmin_entries(
    fidx: np.ndarray, lidx: np.ndarray, cap: np.ndarray, k: int, m: int
) -> np.ndarray:
    """Water filling on an incidence list: entry ``e`` says flow ``fidx[e]`` crosses local
    link ``lidx[e]``; ``cap`` has the ``m`` local links' capacities. Returns ``k`` rates."""
    rate = np.full(k, -1.0)
    rem = cap.astype(np.float64, copy=True)
    cnt = np.bincount(lidx, minlength=m).astype(np.float64)
    live = np.ones(len(fidx), dtype=bool)  # entries of unfrozen flows
    while live.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(cnt > 0, rem / cnt, np.inf)
        s = max(float(share.min()), 0.0)
        full = share <= s + s * _REL_TOL
        hit = live & full[lidx]
        newly = np.unique(fidx[hit])
        rate[newly] = s
        frozen_now = np.zeros(k, dtype=bool)
        frozen_now[newly] = True
        gone = live & frozen_now[fidx]
        dec = np.bincount(lidx[gone], minlength=m)
        rem -= dec * s
        cnt -= dec
        live &= ~gone
    return rate
