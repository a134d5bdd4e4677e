"""The embedded flow-level backend: the trace's DAG with max-min fair bandwidth sharing."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ...backend_api import (
    COMMON_OPTIONS,
    KIND_FLOW,
    Backend,
    BackendError,
    Option,
    ReplayProgress,
    Timeline,
    Topology,
    Trace,
    cap_paths,
    check_options,
    detours,
    epochs,
    flow_totals,
    is_dense_ids,
    no_detours,
    slowdown_schedule,
)
from .executor import FlowProblem, run_flows
from .native import native_status, run_flows_native

#: Which executor runs the DAG: the compiled core (xsim_flowcore) or the Python reference.
ENGINE = Option("engine", "str", None,
                "native (compiled xsim_flowcore; the default when installed) or python (the"
                " reference executor); both give the same timeline",
                choices=("native", "python"))


class FlowBackend(Backend):
    """Event-driven DAG executor; flows share links max-min fairly (progressive filling).

    Options (:data:`~xsim_adapters.options.COMMON_OPTIONS`): ``seed`` (accepted; the model has
    no randomness), ``progress`` (the hook of the contract in :mod:`..base`, checked about every
    1% of ops, with the simulated time reached on the Python engine), ``engine`` (``native``:
    the compiled core :mod:`xsim_flowcore`, the default when it is installed; ``python``: the
    reference executor; an error if ``native`` is asked for and the core is missing). Any
    other key is an error.
    ``Timeline.stats``: the run info of the contract (every flow is fluid: ``packet_flows`` and
    ``packet_bytes`` are 0; ``startup_s`` is routing and array building, ``replay_s`` the event
    loop), ``engine`` (which executor ran), ``wall_s`` (whole run, s), ``sim_wall_s`` (event
    loop only, s), ``sim_cpu_s`` (the same in CPU time of the running thread, s: steadier than
    wall time on a shared machine),
    ``routing_s`` (ECMP paths of every flow, s), ``events`` (op ends, flow transmission ends and
    link events processed), ``events_per_s`` (events / ``sim_wall_s``), ``max_active_flows``
    (most flows transmitting at once), ``rate_recomputations`` (independent groups of flows
    whose max-min rates were re-solved), ``reroutes`` (flows moved to, or started on, a detour
    around a failed link: docs/whatif.md).
    """

    name = "flow"
    options = (*COMMON_OPTIONS, ENGINE)

    @classmethod
    def available(cls, options: Mapping[str, Any] | None = None) -> tuple[bool, str]:
        """Always, except when ``engine: native`` is asked for and the core is missing (then
        the reason carries the install command, so the run stops before any work)."""
        if (options or {}).get("engine") == "native":
            ok, why = native_status()
            if not ok:
                return False, f"engine native: {why}"
        return True, ""

    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        opts = check_options(self.name, self.options, options)
        t0 = time.perf_counter()
        ok, why = native_status()
        engine = opts["engine"] or ("native" if ok else "python")
        if engine == "native" and not ok:
            # before any work: the one-line reason carries the install command
            raise BackendError(f"flow: engine native: {why}")
        problem, routing_s = build_problem(trace, topology)
        startup_s = time.perf_counter() - t0
        rp = ReplayProgress(opts["progress"], trace.num_ops)
        rp.start()
        if engine == "native":  # the core reports (ops done, ops total): no simulated time
            # the last report (all done) comes from finish(), with the simulated end time
            result = run_flows_native(
                problem, lambda done, total: rp.update(done) if done < total else None)
        else:
            result = run_flows(problem, lambda done, sim_ns: rp.update(done, sim_ns))
        del problem  # its arrays (paths, edges) are not needed for the timeline
        rp.finish(float(result.end_ns.max()) if len(result.end_ns) else 0.0)
        frame = pd.DataFrame(
            {
                "op_id": np.arange(trace.num_ops, dtype=np.int64),
                "start_ns": result.start_ns,
                "end_ns": result.end_ns,
            },
            copy=False,  # no consolidated copy of the two time columns
        )
        stats = {"engine": engine, **result.stats}
        stats["sim_wall_s"] = stats["wall_s"]
        stats["sim_cpu_s"] = stats.pop("cpu_s")
        stats["routing_s"] = routing_s
        stats["wall_s"] = time.perf_counter() - t0
        flows, nbytes = flow_totals(trace)
        stats.update(startup_s=startup_s, replay_s=stats["sim_wall_s"], packet_flows=0,
                     packet_bytes=0, fluid_flows=flows, fluid_bytes=nbytes)
        timeline = Timeline(backend=self.name, frame=frame, stats=stats)
        timeline.check_complete(trace)
        return timeline


def build_problem(trace: Trace, topology: Topology) -> tuple[FlowProblem, float]:
    """Plain arrays for the executor, with every flow routed; and the routing time in s."""
    ops = trace.ops
    n = len(ops)
    if not is_dense_ids(ops["op_id"].to_numpy()):
        raise BackendError("flow: trace ops must have dense op_id 0..N-1 equal to the row index")
    kind = ops["kind"].to_numpy(dtype=np.int8)
    rank = ops["rank"].to_numpy(dtype=np.int32)
    dst = ops["dst"].to_numpy(dtype=np.int32)
    for col, bad_mask, what in (
        ("kind", (kind < 0) | (kind > 2), "a kind index 0, 1 or 2"),
        ("duration_ns", ops["duration_ns"].to_numpy() < 0, "a duration >= 0"),
        ("bytes", ops["bytes"].to_numpy() < 0, "bytes >= 0"),
    ):
        bad = np.flatnonzero(bad_mask)
        if len(bad):
            op = int(bad[0])
            raise BackendError(
                f"flow: op {op} has {col} {ops[col].iloc[op]}; expected {what}"
                f" ({len(bad)} such ops)"
            )
    is_flow = kind == KIND_FLOW
    flow_ids = np.flatnonzero(is_flow)
    nr = topology.num_ranks
    for col, arr in (("rank", rank), ("dst", dst)):
        bad = np.flatnonzero(is_flow & ((arr < 0) | (arr >= nr)))
        if len(bad):
            op = int(bad[0])
            raise BackendError(
                f"flow: op {op} is a flow with {col} {int(arr[op])}, but the topology has"
                f" {nr} ranks"
            )
    t0 = time.perf_counter()
    offsets, links = topology.paths_of_rows(ops, flow_ids)
    lk = topology.links
    # network.per_flow_gbps: one virtual link per NCCL connection between servers
    phys = (offsets, links)  # detours look at physical links only
    offsets, links, conn_gbps = cap_paths(
        topology.connection_limit, ops, flow_ids, offsets, links,
        lk["tier"].astype(str).to_numpy(), len(lk))
    del flow_ids
    routing_s = time.perf_counter() - t0
    names = topology.nodes["name"].astype(str).to_numpy()
    link_names = [
        f"{a}->{b}"
        for a, b in zip(
            names[lk["src"].to_numpy()], names[lk["dst"].to_numpy()], strict=True
        )
    ] + [f"connection{k} (per_flow_gbps)" for k in range(len(conn_gbps))]
    ev = topology.events
    has_events = len(ev) > 0
    sched = slowdown_schedule(trace.manifest, nr)
    ep = epochs(topology)
    det = (detours(topology, rank, dst, topology.ecmp_keys(ops, np.arange(n)), *phys, ep)
           if ep.any_down else no_detours(n))
    problem = FlowProblem(
        kind=kind,
        duration_ns=ops["duration_ns"].to_numpy(dtype=np.int64),
        nbytes=ops["bytes"].to_numpy(dtype=np.int64),
        rank=rank,
        phase=ops["phase"].to_numpy(dtype=np.int8),
        pred=trace.deps["pred"].to_numpy(),  # int32 (the core takes either width)
        succ=trace.deps["succ"].to_numpy(),
        path_offsets=offsets,
        path_links=links,
        link_gbps=np.concatenate([lk["gbps"].to_numpy(dtype=np.float64), conn_gbps]),
        link_latency_ns=np.concatenate([lk["latency_ns"].to_numpy(dtype=np.float64),
                                        np.zeros(len(conn_gbps))]),
        link_names=link_names,
        events_at_ns=ev["at_ns"].to_numpy(dtype=np.float64) if has_events else np.zeros(0),
        events_link=ev["link_id"].to_numpy(dtype=np.int64) if has_events else np.zeros(0, int),
        events_factor=ev["factor"].to_numpy(dtype=np.float64) if has_events else np.zeros(0),
        reroute_key=det.key,
        reroute_offsets=det.offsets,
        reroute_links=det.links,
    )
    if sched is not None:
        problem.slow_offsets = sched.offsets
        problem.slow_lo_ns, problem.slow_hi_ns = sched.lo_ns, sched.hi_ns
        problem.slow_factor = sched.factor
    return problem, routing_s
