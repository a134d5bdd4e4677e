"""Event-driven execution of a trace's DAG with max-min fair flows.

Model (times in ns, sizes in bytes, rates in bytes/ns):

- an op starts when its last predecessor ends (ops without predecessors start at 0);
- a compute op ends ``duration_ns`` after it starts; a barrier ends ``duration_ns`` after it
  starts (0 for a plain join);
- a flow's first byte leaves ``duration_ns`` after it starts (its start latency: NCCL's
  per-call cost, 0 for a plain transfer); from then on it transmits ``bytes`` at its max-min
  fair share of the links on its path among all flows transmitting at that moment
  (recomputed whenever a flow starts or stops transmitting or a link event changes a
  capacity), and ends ``latency`` (sum of its links' latencies) after its last byte left; so
  one flow alone takes ``duration_ns + latency + bytes / bottleneck``;
- a link event sets a link's capacity to ``factor`` x nominal at its time;
- a compute op of a rank with interval slowdowns (``slow_*``, :mod:`...trace.slowdowns`) ends
  when its work is done at the rank's piecewise speed (:func:`stretched_end`);
- rerouting (:mod:`...topology.reroute`): at the start of epoch ``e`` (the ``e``-th instant
  with link events, after they apply) a transmitting flow whose path crosses a down link
  (capacity 0) moves to its detour ``reroute_*[e * N + op]`` if it has one: its remaining
  bytes go on from there at the new path's max-min share, and it ends the detour's latency
  after its last byte; a flow starting while its route crosses a down link starts on its
  detour. Flows without a detour stay stalled (the error names them and the link).

Only the flows connected (through shared links) to what changed are re-solved, all events at
one instant are handled before one re-solve, and the hot loop uses plain lists and a heap.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...backend_api import KIND_COMPUTE, KIND_FLOW, KINDS, PHASES, BackendError, stretched_end
from .maxmin import maxmin_rates

Progress = Callable[[int, float], None]  # (ops done, simulated time reached in ns)


@dataclass
class FlowProblem:
    """Everything the executor needs, as plain arrays (see :func:`run_flows`)."""

    kind: np.ndarray  # int8 per op
    duration_ns: np.ndarray  # int64 per op
    nbytes: np.ndarray  # int64 per op
    rank: np.ndarray  # int32 per op (for error messages)
    phase: np.ndarray  # int8 per op (for error messages)
    pred: np.ndarray  # int32 or int64 per edge
    succ: np.ndarray  # the same dtype as pred
    path_offsets: np.ndarray  # int64 per op + 1: CSR of link ids (empty for non-flows)
    path_links: np.ndarray  # int32
    link_gbps: np.ndarray  # float64 per link, nominal capacity
    link_latency_ns: np.ndarray  # float64 per link
    link_names: list[str] = field(default_factory=list)  # "a->b" per link, for messages
    events_at_ns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    events_link: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    events_factor: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Interval compute slowdowns (trace/slowdowns.py SlowSchedule): rank r's segments are
    # slow_offsets[r]:slow_offsets[r+1]; empty offsets: none.
    slow_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    slow_lo_ns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slow_hi_ns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slow_factor: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Detours (topology/reroute.py Detours over all ops): sorted keys epoch * N + op, CSR.
    reroute_key: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reroute_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    reroute_links: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))


@dataclass
class FlowResult:
    start_ns: np.ndarray
    end_ns: np.ndarray
    stats: dict


def run_flows(problem: FlowProblem, progress: Progress | None = None) -> FlowResult:
    """Execute the DAG; return per-op start/end times or raise BackendError if ops get stuck."""
    return _Executor(problem, progress).run()


def check_deps(p: FlowProblem) -> None:
    """Raise BackendError if an edge names an op outside 0..N-1 (both engines check this)."""
    n = len(p.kind)
    if len(p.pred) and (
        int(p.pred.min()) < 0 or int(p.succ.min()) < 0
        or int(p.pred.max()) >= n or int(p.succ.max()) >= n
    ):
        bad = int(max(p.pred.max(), p.succ.max()))
        raise BackendError(f"flow: deps reference op {bad} but the trace has {n} ops")


class _Executor:
    def __init__(self, p: FlowProblem, progress: Progress | None) -> None:
        self.p = p
        n = len(p.kind)
        self.n = n
        check_deps(p)
        order = np.argsort(p.pred, kind="stable")
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(p.pred, minlength=n), out=off[1:])
        self.succ_off = off.tolist()
        self.succ_list = p.succ[order].tolist()
        self.indeg = np.bincount(p.succ, minlength=n).tolist()
        self.kind = p.kind.tolist()
        self.duration = p.duration_ns.tolist()
        self.nbytes = p.nbytes.tolist()
        self.poff = p.path_offsets.tolist()
        self.plinks = p.path_links.tolist()
        # per-op path latency (0 for non-flows): a prefix sum over the CSR
        lat = np.concatenate([[0.0], np.cumsum(p.link_latency_ns[p.path_links])])
        self.latency = (lat[p.path_offsets[1:]] - lat[p.path_offsets[:-1]]).tolist()
        self.nominal = (p.link_gbps / 8.0).tolist()  # Gb/s -> bytes/ns
        self.cap = list(self.nominal)
        self.progress = progress
        so = p.slow_offsets
        self.slow_off = so.tolist() if len(so) else []
        self.slow_lo, self.slow_hi = p.slow_lo_ns.tolist(), p.slow_hi_ns.tolist()
        self.slow_f = p.slow_factor.tolist()
        # detour key -> (links, latency): latency as a prefix-sum difference, as for routes
        rl = np.concatenate([[0.0], np.cumsum(p.link_latency_ns[p.reroute_links])])
        ro = p.reroute_offsets
        self.detour: dict[int, tuple[list[int], float]] = {
            int(k): (p.reroute_links[ro[j]:ro[j + 1]].tolist(), float(rl[ro[j + 1]] - rl[ro[j]]))
            for j, k in enumerate(p.reroute_key.tolist())
        }

    def run(self) -> FlowResult:  # noqa: C901 - one hot loop, kept together for speed
        t0 = time.perf_counter()
        c0 = time.thread_time()
        n = self.n
        kind, duration, nbytes = self.kind, self.duration, self.nbytes
        poff, plinks, latency = self.poff, self.plinks, self.latency
        succ_off, succ_list, indeg = self.succ_off, self.succ_list, self.indeg
        cap, nominal = self.cap, self.nominal
        nan, inf = float("nan"), float("inf")
        start = [nan] * n
        end = [nan] * n
        link_flows: list[set[int]] = [set() for _ in range(len(cap))]
        # per-op flow state in flat lists (faster than dicts in the hot loop)
        rate = [0.0] * n  # bytes/ns
        rem = [0.0] * n  # bytes left at tlast
        tlast = [0.0] * n
        tx_due = [-1.0] * n  # when the flow's last byte leaves at its current rate (-1: never)
        flow_links: dict[int, list[int]] = {}  # the flows transmitting now
        # Calendar: the distinct future times in a heap, what is due at each in a dict of
        # lists (many ops end at the same instant, so this beats one heap entry per op).
        # An entry ``op >= 0`` ends that op; ``~op`` is flow op's last byte leaving, valid only
        # while tx_due[op] still equals that time (a rate change reschedules it); ``~op - n``
        # ends flow op's start latency (its transmission begins).
        times: list[float] = []
        due: dict[float, list[int]] = {}
        push, pop = heapq.heappush, heapq.heappop
        order = np.argsort(self.p.events_at_ns, kind="stable")
        ev_at = self.p.events_at_ns[order].tolist()
        ev_link = self.p.events_link[order].tolist()
        ev_factor = self.p.events_factor[order].tolist()
        n_ev = len(ev_at)
        ev_i = 0
        next_ev = ev_at[0] if n_ev else inf
        rank = self.p.rank.tolist() if self.slow_off else []
        slow_off, slow_lo, slow_hi, slow_f = self.slow_off, self.slow_lo, self.slow_hi, self.slow_f
        detour = self.detour
        down: set[int] = set()  # links at capacity 0 now
        epoch = -1  # instants with link events so far, minus one
        reroutes = 0

        done = 0
        events = 0
        recomputes = 0
        max_active = 0
        report_every = max(1, n // 100)
        next_report = report_every
        progress = self.progress
        dirty: set[int] = set()
        ready = [i for i in range(n - 1, -1, -1) if indeg[i] == 0]
        began: list[int] = []  # flows whose start latency ended at t: they transmit now
        t = 0.0
        while True:
            # 1. start everything that became ready at t (barriers and 0-time ops cascade)
            while ready or began:
                if began:
                    op = began.pop()
                    k = KIND_FLOW
                else:
                    op = ready.pop()
                    start[op] = t
                    k = kind[op]
                    if k == KIND_FLOW and duration[op] > 0:  # start latency first
                        fin = t + duration[op]
                        lst = due.get(fin)
                        if lst is None:
                            due[fin] = [~op - n]
                            push(times, fin)
                        else:
                            lst.append(~op - n)
                        continue
                if k == KIND_FLOW:
                    a, b = poff[op], poff[op + 1]
                    if a != b and nbytes[op] > 0:
                        links = plinks[a:b]
                        if down and any(cap[lk] == 0.0 for lk in links):
                            got = detour.get(epoch * n + op)
                            if got is not None:  # its route is down: start on the detour
                                links, latency[op] = got
                                reroutes += 1
                        flow_links[op] = links
                        rem[op] = float(nbytes[op])
                        tlast[op] = t
                        for link in links:
                            link_flows[link].add(op)
                        dirty.update(links)
                        continue
                    fin = t + latency[op]  # nothing to send: only the latency
                    if fin > t:
                        lst = due.get(fin)
                        if lst is None:
                            due[fin] = [op]
                            push(times, fin)
                        else:
                            lst.append(op)
                        continue
                elif k != KIND_FLOW and duration[op] > 0:  # compute, timed barrier
                    fin = t + duration[op]
                    if k == KIND_COMPUTE and slow_off:
                        r = rank[op]
                        if slow_off[r] != slow_off[r + 1]:  # interval slowdowns on r
                            fin = stretched_end(t, float(duration[op]), slow_lo, slow_hi,
                                                slow_f, slow_off[r], slow_off[r + 1])
                    lst = due.get(fin)
                    if lst is None:
                        due[fin] = [op]
                        push(times, fin)
                    else:
                        lst.append(op)
                    continue
                # barrier, zero-time compute, zero-latency empty flow: ends now
                end[op] = t
                done += 1
                for j in range(succ_off[op], succ_off[op + 1]):
                    s = succ_list[j]
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        ready.append(s)
            if len(flow_links) > max_active:
                max_active = len(flow_links)
            # 2. re-solve the flows connected to what changed
            if dirty:
                groups = _components(dirty, link_flows, flow_links)
                dirty = set()
                for comp in groups:
                    recomputes += 1
                    if len(comp) == 1:  # alone: its bottleneck link
                        new = [min([cap[link] for link in flow_links[comp[0]]])]
                    else:
                        new = maxmin_rates([flow_links[f] for f in comp], cap)
                    for f, r in zip(comp, new, strict=True):
                        old = rate[f]
                        if r == old:
                            continue  # its pending finish stays valid
                        if old > 0.0:
                            left = rem[f] - old * (t - tlast[f])
                            rem[f] = left if left > 0.0 else 0.0
                        tlast[f] = t
                        rate[f] = r
                        if r > 0.0:
                            fin = t + rem[f] / r
                            tx_due[f] = fin
                            lst = due.get(fin)
                            if lst is None:
                                due[fin] = [~f]
                                push(times, fin)
                            else:
                                lst.append(~f)
                        else:
                            tx_due[f] = -1.0
            if progress is not None and done >= next_report:
                progress(done, t)
                next_report = done + report_every
            # 3. take everything due at the next instant
            if times:
                t = times[0] if times[0] <= next_ev else next_ev
            elif next_ev < inf:
                t = next_ev
            else:
                break
            if times and times[0] == t:
                pop(times)
                for e in due.pop(t):
                    if e >= 0:
                        events += 1
                        end[e] = t
                        done += 1
                        for j in range(succ_off[e], succ_off[e + 1]):
                            s = succ_list[j]
                            indeg[s] -= 1
                            if indeg[s] == 0:
                                ready.append(s)
                        continue
                    if e < -n:  # a start latency ended: the flow transmits from now
                        events += 1
                        began.append(~(e + n))
                        continue
                    op = ~e
                    if tx_due[op] != t:
                        continue  # superseded by a later rate change
                    tx_due[op] = -1.0
                    events += 1
                    for link in flow_links.pop(op):
                        others = link_flows[link]
                        others.discard(op)
                        if others:  # a link left empty changes nobody's rate
                            dirty.add(link)
                    fin = t + latency[op]
                    if fin > t:
                        lst = due.get(fin)
                        if lst is None:
                            due[fin] = [op]
                            push(times, fin)
                        else:
                            lst.append(op)
                        continue
                    end[op] = t
                    done += 1
                    for j in range(succ_off[op], succ_off[op + 1]):
                        s = succ_list[j]
                        indeg[s] -= 1
                        if indeg[s] == 0:
                            ready.append(s)
            if ev_i < n_ev and ev_at[ev_i] <= t:
                while ev_i < n_ev and ev_at[ev_i] <= t:
                    link = ev_link[ev_i]
                    cap[link] = nominal[link] * ev_factor[ev_i]
                    if cap[link] == 0.0:
                        down.add(link)
                    else:
                        down.discard(link)
                    if link_flows[link]:
                        dirty.add(link)
                    events += 1
                    ev_i += 1
                epoch += 1
                if down and detour:
                    reroutes += self._reroute(t, epoch, down, link_flows, flow_links, rate,
                                              rem, tlast, tx_due, dirty)
            next_ev = ev_at[ev_i] if ev_i < n_ev else inf

        wall = time.perf_counter() - t0
        cpu = time.thread_time() - c0
        if progress is not None:
            progress(done, t)
        if done < n:
            raise BackendError(
                stuck_message(self.p, np.asarray(end, dtype=np.float64), flow_links, rate,
                              self.cap, done)
            )
        return FlowResult(
            start_ns=np.asarray(start, dtype=np.float64),
            end_ns=np.asarray(end, dtype=np.float64),
            stats={
                "wall_s": wall,
                "cpu_s": cpu,
                "events": events,
                "events_per_s": events / wall if wall > 0 else 0.0,
                "max_active_flows": max_active,
                "rate_recomputations": recomputes,
                "reroutes": reroutes,
            },
        )

    def _reroute(self, t: float, epoch: int, down: set[int], link_flows: list[set[int]],
                 flow_links: dict[int, list[int]], rate: list[float], rem: list[float],
                 tlast: list[float], tx_due: list[float], dirty: set[int]) -> int:
        """Move every transmitting flow over a down link that has an epoch-``epoch`` detour
        (in op order); returns how many moved. Its bytes left are settled at ``t`` and it
        waits for the re-solve at ``t`` on the detour's links."""
        n, detour, latency = self.n, self.detour, self.latency
        moved = 0
        for f in sorted({f for lk in down for f in link_flows[lk]}):
            got = detour.get(epoch * n + f)
            if got is None:
                continue
            old = rate[f]
            if old > 0.0:
                left = rem[f] - old * (t - tlast[f])
                rem[f] = left if left > 0.0 else 0.0
            tlast[f] = t
            rate[f] = 0.0
            tx_due[f] = -1.0  # its pending last byte is void; the re-solve schedules anew
            for lk in flow_links[f]:
                others = link_flows[lk]
                others.discard(f)
                if others:
                    dirty.add(lk)
            links, latency[f] = got
            flow_links[f] = links
            for lk in links:
                link_flows[lk].add(f)
            dirty.update(links)
            moved += 1
        return moved


def _describe(p: FlowProblem, op: int) -> str:
    return (
        f"op {op} ({KINDS[int(p.kind[op])]}, rank {int(p.rank[op])},"
        f" phase {PHASES[int(p.phase[op])]})"
    )


def stuck_message(
    p: FlowProblem, end: np.ndarray, flow_links: Mapping[int, Sequence[int]],
    rate: Mapping[int, float] | Sequence[float], cap: Sequence[float], done: int,
) -> str:
    """Why ``N - done`` ops never finished: flows stalled on failed links, or a cycle.

    ``end``: per-op end times (NaN: never ended); ``flow_links``: the flows still transmitting
    and their links; ``rate``: their rates (indexed by op id); ``cap``: link capacities at the
    end. Shared by both engines so their errors read the same.
    """
    n = len(p.kind)
    unfinished = np.flatnonzero(np.isnan(end)).tolist()
    head = f"flow: {n - done} of {n} ops never finished"
    parts = []
    stalled = sorted(f for f in flow_links if rate[f] == 0.0)
    if stalled:
        descr = []
        for f in stalled[:5]:
            dead = [lk for lk in flow_links[f] if cap[lk] == 0.0]
            names = ", ".join(
                f"link {lk} ({p.link_names[lk]})" if p.link_names else f"link {lk}"
                for lk in dead[:3]
            )
            descr.append(f"{_describe(p, f)} over failed {names}")
        parts.append(
            f"{len(stalled)} flows stalled on failed links with no restore: " + "; ".join(descr)
        )
    waiting = [i for i in unfinished if i not in flow_links]
    if waiting:
        reason = (
            "waiting on the stalled flows"
            if stalled
            else "waiting on each other: a dependency cycle"
        )
        parts.append(
            f"{len(waiting)} ops {reason}, first: "
            + "; ".join(_describe(p, i) for i in waiting[:5])
        )
    return head + ": " + " | ".join(parts)


def _components(
    seeds: set[int], link_flows: list[set[int]], flow_links: dict[int, list[int]]
) -> list[list[int]]:
    """The groups of active flows connected to links ``seeds`` through shared links.

    Each group (flows sorted by op id) is independent of the others, so each is solved on its
    own: a batch of simultaneous events mostly touches many small independent groups.
    """
    seen_links: set[int] = set()
    seen_flows: set[int] = set()
    groups = []
    for seed in seeds:
        if seed in seen_links or not link_flows[seed]:
            continue
        seen_links.add(seed)
        stack = [seed]
        comp: list[int] = []
        while stack:
            for f in link_flows[stack.pop()]:
                if f in seen_flows:
                    continue
                seen_flows.add(f)
                comp.append(f)
                for link in flow_links[f]:
                    if link not in seen_links:
                        seen_links.add(link)
                        stack.append(link)
        comp.sort()
        groups.append(comp)
    return groups
