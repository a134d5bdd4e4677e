"""Several training jobs on one fabric: place plans side by side, replay them together.

Each job is an ordinary plan with its own device groups, model, training and replicas. The
cluster is the concatenation of every job's device groups, in job order, under one network:
the first job's ``network:`` section (the others must leave theirs out or write the same one).
Job ``k``'s group ``g`` becomes cluster group ``j<k>-<g>``, its ranks follow those of the jobs
before it, so jobs sit on consecutive servers (under a leaf-spine, on consecutive leaves).

The jobs' traces are generated separately and concatenated with their op ids, ranks,
collective ids and edges shifted, so one backend run replays every job at once on the shared
links and the jobs interfere only through the network. The combined timeline is split back per
job, and each job's metrics are computed from its own trace, exactly as for a lone run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .errors import PlanError
from .plan.model import DeviceGroup, NetworkSpec, Plan
from .trace.schema import KINDS, PHASES, SCHEMA_VERSION, Trace
from .trace.slowdowns import MANIFEST_KEY as SLOWDOWNS_KEY
from .trace.slowdowns import remap
from .trace.timeline import Timeline

# Upper bound on jobs in one run: each is a whole plan; more is a mistake, not a study.
MAX_JOBS = 64


@dataclass(frozen=True)
class JobSet:
    """Plans placed on one cluster: ``cluster`` is the plan the topology is built from."""

    plans: tuple[Any, ...]  # Plan, or traffic.TrafficSpec for background traffic
    cluster: Plan
    rank_map: tuple[np.ndarray, ...]  # int64 per job: its rank -> global rank
    placement: str = "packed"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.plans)


PLACEMENTS = ("packed", "spread")


def place_jobs(plans: list[Any] | tuple[Any, ...], placement: str = "packed") -> JobSet:
    """Place ``plans`` side by side on one cluster (see the module docstring).

    Raises PlanError (naming the job) for fewer than two or more than MAX_JOBS plans,
    duplicate job names, or a job whose ``network:`` differs from the first job's.
    """
    plans = tuple(plans)
    if plans and not isinstance(plans[0], Plan):
        raise PlanError("", "the first job must be a training plan (its network: is the "
                            "cluster's); put traffic files after it")
    if not 2 <= len(plans) <= MAX_JOBS:
        raise PlanError("", f"expected 2..{MAX_JOBS} plans to place on one cluster "
                            f"(got {len(plans)})")
    seen: dict[str, int] = {}
    for k, p in enumerate(plans):
        if p.name in seen:
            raise PlanError("name", f"job {k}: every job needs its own plan name; "
                                    f"{p.name!r} is also job {seen[p.name]}'s")
        seen[p.name] = k
    net = plans[0].network
    for k, p in enumerate(plans[1:], start=1):
        if p.network not in (net, NetworkSpec()):
            raise PlanError("network", f"job {k} ({p.name}): the jobs share the first job's "
                                       f"network; leave this job's network: out or write the "
                                       f"same one")
    if placement not in PLACEMENTS:
        raise PlanError("", f"placement: expected one of {', '.join(PLACEMENTS)} "
                            f"(got {placement!r})")
    types: dict[str, Any] = {}
    # (job, group, first device, gpus) per server, in each job's own rank order
    servers: list[list[tuple[int, DeviceGroup, int, str]]] = []
    for k, p in enumerate(plans):
        mine = []
        for g in p.device_groups:
            dt = p.device_types[g.type]
            key = g.type
            if key in types and types[key] != dt:
                key = f"j{k}-{g.type}"  # same type name, different definition: keep both
            types[key] = dt
            mine += [(k, g, s * g.gpus_per_node, key) for s in range(g.nodes)]
        servers.append(mine)
    if placement == "packed":
        order = [srv for mine in servers for srv in mine]
    else:
        order = [mine[i] for i in range(max(map(len, servers)))
                 for mine in servers if i < len(mine)]
    maps = [np.zeros(p.num_ranks, dtype=np.int64) for p in plans]
    groups: list[DeviceGroup] = []
    base = 0
    for k, g, first, key in order:
        local0 = plans[k].group_rank_offset(g.name) + first
        maps[k][local0:local0 + g.gpus_per_node] = np.arange(base, base + g.gpus_per_node)
        base += g.gpus_per_node
        name = f"j{k}-{g.name}" if placement == "packed" else \
            f"j{k}-{g.name}-s{first // g.gpus_per_node}"
        if placement == "packed" and groups and groups[-1].name == name:
            groups[-1] = dataclasses.replace(groups[-1], nodes=groups[-1].nodes + 1)
        else:
            groups.append(dataclasses.replace(g, name=name, type=key, nodes=1))
    cluster = dataclasses.replace(
        plans[0], name="jobs", device_groups=tuple(groups), device_types=types,
        network=net,
    )
    return JobSet(plans=plans, cluster=cluster, rank_map=tuple(maps), placement=placement)


def cluster_ranks(jobs: JobSet) -> list[dict[str, Any]]:
    """The manifest's rank table of the whole cluster (every job's GPUs, busy or not)."""
    out = []
    rank = node = 0
    for g in jobs.cluster.device_groups:
        for d in range(g.num_devices):
            out.append({"rank": rank, "group": g.name, "node": node + d // g.gpus_per_node,
                        "device_type": g.type, "local": d % g.gpus_per_node})
            rank += 1
        node += g.nodes
    return out


_RANK = re.compile(r"\d+")


def remap_rank_list(text: str, rank_map: np.ndarray) -> str:
    """A collective's ``ranks`` cell with every rank ``r`` renamed ``rank_map[r]``, separators
    kept: ``"0,1,2"`` for a ring, ``"0,1;2,3"`` (the two stages' ranks) for a p2p or reshard."""
    return _RANK.sub(lambda m: str(int(rank_map[int(m.group())])), text)


def combine_traces(jobs: JobSet, traces: Sequence[Trace | None],
                   only: int | None = None) -> Trace:
    """One trace holding every job's ops (ids, ranks, collectives and edges shifted); with
    ``only``, just that job's ops, on the same cluster ranks (the job alone in its place).
    A ``None`` trace (a job not generated yet) contributes no ops."""
    ops_parts, dep_parts, coll_parts = [], [], []
    slowdowns: list[dict[str, Any]] = []
    op_off = coll_off = 0
    for k, (trace, rmap) in enumerate(zip(traces, jobs.rank_map, strict=True)):
        if trace is None or (only is not None and k != only):
            continue
        o = trace.ops.copy()
        o["op_id"] = o["op_id"] + op_off
        for c in ("rank", "dst"):
            v = o[c].to_numpy()
            o[c] = np.where(v >= 0, rmap[np.maximum(v, 0)], v).astype(v.dtype)
        v = o["collective"].to_numpy()
        o["collective"] = np.where(v >= 0, v + coll_off, v).astype(v.dtype)
        ops_parts.append(o)
        d = trace.deps + op_off
        dep_parts.append(d.astype(trace.deps.dtypes.to_dict()))
        c = trace.collectives.copy()
        if len(c):
            c["collective"] = (c["collective"] + coll_off).astype(c["collective"].dtype)
            c["ranks"] = [remap_rank_list(s, rmap) for s in c["ranks"].astype(str)]
            coll_off = int(c["collective"].max()) + 1
        coll_parts.append(c)
        slowdowns += remap(trace.manifest.get(SLOWDOWNS_KEY) or [], rmap)
        op_off += len(o)
    ranks = cluster_ranks(jobs)
    ops = pd.concat(ops_parts, ignore_index=True)
    deps = pd.concat(dep_parts, ignore_index=True)
    colls = pd.concat(coll_parts, ignore_index=True)
    kinds = np.bincount(ops["kind"].to_numpy(), minlength=len(KINDS))
    phases = np.bincount(ops["phase"].to_numpy(), minlength=len(PHASES))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "plan_name": "+".join(jobs.names),
        "plan_digest": "+".join(str(t.manifest.get("plan_digest", "")) for t in traces
                                if t is not None),
        "ranks": ranks,
        "groups": [g.name for g in jobs.cluster.device_groups],
        "num_ops": int(len(ops)),
        "num_deps": int(len(deps)),
        "op_counts": {"by_kind": {n: int(kinds[i]) for i, n in enumerate(KINDS)},
                      "by_phase": {n: int(phases[i]) for i, n in enumerate(PHASES)}},
        "jobs": [{"name": p.name, "ranks": [int(x) for x in m],
                  "num_ops": 0 if t is None or (only is not None and k != only)
                  else int(len(t.ops))}
                 for k, (p, t, m) in enumerate(zip(jobs.plans, traces, jobs.rank_map,
                                                   strict=True))],
    }
    if slowdowns:  # each job's interval slowdowns, on its cluster ranks
        manifest[SLOWDOWNS_KEY] = slowdowns
    return Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest)


def split_timeline(traces: list[Trace] | tuple[Trace, ...], timeline: Timeline
                   ) -> list[Timeline]:
    """The combined run's timeline cut back into one Timeline per job (op ids of each job's
    own trace, times of the shared run)."""
    out = []
    f = timeline.frame.sort_values("op_id", kind="stable")
    off = 0
    for t in traces:
        n = len(t.ops)
        part = f.iloc[off:off + n][["op_id", "start_ns", "end_ns"]].copy()
        part["op_id"] = part["op_id"].to_numpy() - off
        part.index = pd.RangeIndex(n)
        out.append(Timeline(backend=timeline.backend, frame=part, stats=dict(timeline.stats)))
        off += n
    return out


@dataclass
class JobsResult:
    """One shared replay of several jobs: the combined trace and timeline, per-job results
    in job order (training jobs: their Metrics, from their own trace; traffic jobs: a dict of
    offered and achieved load) and per-link telemetry of the fabric."""

    jobs: JobSet
    trace: Trace
    timeline: Timeline
    results: list[Any]  # Metrics or dict per job
    links: pd.DataFrame
    alone_ns: list[int | None] | None = None  # training jobs alone in their place

    @property
    def metrics(self) -> list[Any]:
        """The training jobs' Metrics (traffic jobs left out), in job order."""
        return [r for r in self.results if not isinstance(r, dict)]

    def table(self) -> pd.DataFrame:
        """One row per job: name, ranks, iteration time, tokens/s, MFU, mean communication and
        exposed communication; alone_iteration_ns and slowdown_pct when measured; traffic jobs
        add pattern, offered_load and achieved_load."""
        rows = []
        for k, (p, r) in enumerate(zip(self.jobs.plans, self.results, strict=True)):
            if isinstance(r, dict):
                row = {**r}
            else:
                s = r.summary
                row = {"job": p.name, "ranks": s["ranks"],
                       "iteration_time_ns": s["iteration_time_ns"],
                       "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"],
                       "mean_comm_ns": s["means"]["comm_ns"],
                       "mean_exposed_comm_ns": s["means"]["exposed_comm_ns"]}
            if self.alone_ns is not None:
                alone = self.alone_ns[k]
                row["alone_iteration_ns"] = alone
                row["slowdown_pct"] = (100.0 * (row["iteration_time_ns"] / alone - 1.0)
                                       if alone else float("nan"))
            rows.append(row)
        return pd.DataFrame(rows)


def run_jobs(plans: list[Any] | tuple[Any, ...], backend: str = "flow",
             options: dict[str, Any] | None = None, placement: str = "packed",
             alone: bool = True) -> JobsResult:
    """Place ``plans`` (training plans, and traffic specs for background traffic) on one
    cluster (:func:`place_jobs`), replay them together on ``backend`` and compute each job's
    results and the fabric's per-link telemetry. With ``alone`` (the default), each training
    job is also replayed alone on the same servers, so :meth:`JobsResult.table` gives the
    slowdown the other jobs cause (one more backend run per training job). A traffic spec
    without ``duration_ms`` sends for as long as the longest training job takes alone."""
    jobs, topology, traces = _prepare(plans, placement)
    return _replay(jobs, topology, traces, backend, options, alone)


def compare_jobs(plans: list[Any] | tuple[Any, ...], backends: Sequence[str],
                 options: dict[str, dict[str, Any]] | None = None,
                 placement: str = "packed") -> tuple[dict[str, JobsResult], pd.DataFrame]:
    """The same placed jobs replayed on each of ``backends`` (the first is the reference):
    identical traces and topology, each job also alone on every backend. A traffic spec
    without ``duration_ms`` sends for as long as the longest training job takes alone on the
    reference, so every backend replays the same traffic. Returns the per-backend results and
    one row per job: ``job``, and per backend ``iteration_time_ns_<b>`` and
    ``slowdown_pct_<b>`` (training jobs) or ``achieved_load_<b>`` (traffic), and
    ``rel_diff_<b>`` (iteration time against the reference; traffic: achieved load)."""
    if len(set(backends)) < 2:
        raise PlanError("", f"expected at least two different backends (got {list(backends)})")
    jobs, topology, traces = _prepare(plans, placement)
    options = options or {}
    out: dict[str, JobsResult] = {}
    ref = backends[0]
    out[ref] = _replay(jobs, topology, list(traces), ref, options.get(ref), True)
    longest = max((a for a in out[ref].alone_ns or [] if a is not None), default=0)
    for b in backends[1:]:
        out[b] = _replay(jobs, topology, list(traces), b, options.get(b), True,
                         traffic_ns=float(longest))
    tables = {b: r.table() for b, r in out.items()}
    rows = []
    for k, p in enumerate(jobs.plans):
        row: dict[str, Any] = {"job": p.name}
        for b in backends:
            t = tables[b].iloc[k]
            if "achieved_load" in t and isinstance(t.get("pattern"), str):
                row[f"achieved_load_{b}"] = float(t["achieved_load"])
            else:
                row[f"iteration_time_ns_{b}"] = int(t["iteration_time_ns"])
                row[f"slowdown_pct_{b}"] = float(t["slowdown_pct"])
        key = "iteration_time_ns" if f"iteration_time_ns_{ref}" in row else "achieved_load"
        for b in backends[1:]:
            r0 = row[f"{key}_{ref}"]
            row[f"rel_diff_{b}"] = (row[f"{key}_{b}"] - r0) / r0 if r0 else float("nan")
        rows.append(row)
    return out, pd.DataFrame(rows)


def _prepare(plans: list[Any] | tuple[Any, ...], placement: str
             ) -> tuple[JobSet, Any, list[Trace | None]]:
    """The placed jobs, the cluster's topology and the training jobs' traces (traffic: None)."""
    from .topology.build import build_topology
    from .traffic import TrafficSpec
    from .workload.coarsen import decide, full
    from .workload.generate import generate

    jobs = place_jobs(plans, placement)
    topology = build_topology(jobs.cluster)
    traces: list[Trace | None] = [None] * len(jobs.plans)
    for k, p in enumerate(jobs.plans):
        if isinstance(p, TrafficSpec):
            continue
        # other jobs share the fabric: a job's micro-batches need not repeat, and its replicas
        # meet the other jobs' traffic each in its own place, so neither axis is coarsened
        # (the replica axis's bound is measured on a fabric of its own: docs/scale.md)
        why = "jobs share the fabric"
        co = full(p, "auto", f"{why}: replicas meet the other jobs' traffic unalike") \
            if len(jobs.plans) > 1 else decide(p, "auto")
        traces[k] = generate(p, dataclasses.replace(co, microbatches=None,
                                                    microbatch_reason=why))
    return jobs, topology, traces


def _replay(jobs: JobSet, topology: Any, traces: list[Trace | None], backend: str,
            options: dict[str, Any] | None, alone: bool,
            traffic_ns: float | None = None) -> JobsResult:
    """One shared replay (and, with ``alone``, one per training job); ``traffic_ns``: how long
    traffic without ``duration_ms`` sends (default: the longest training job alone here)."""
    from . import api
    from .metrics.links import link_metrics
    from .traffic import TrafficSpec, generate_traffic, traffic_summary

    training = [k for k, p in enumerate(jobs.plans) if not isinstance(p, TrafficSpec)]
    alone_ns: list[int | None] | None = None
    needs_duration = traffic_ns is None and any(
        isinstance(p, TrafficSpec) and p.duration_ms is None for p in jobs.plans)
    if alone or needs_duration:
        alone_ns = [None] * len(jobs.plans)
        for k in training:
            solo = combine_traces(jobs, traces, only=k)
            alone_ns[k] = int(round(api.run(solo, backend, topology, options).makespan_ns))
    for k, p in enumerate(jobs.plans):
        if isinstance(p, TrafficSpec):
            dur = p.duration_ms * 1e6 if p.duration_ms is not None else (
                traffic_ns if traffic_ns is not None else max(
                    (a for a in (alone_ns or []) if a is not None), default=0))
            traces[k] = generate_traffic(p, float(dur))
    full = [t for t in traces if t is not None]
    trace = combine_traces(jobs, full)
    timeline = api.run(trace, backend, topology, options)
    parts = split_timeline(full, timeline)
    results: list[Any] = []
    for p, t, tl in zip(jobs.plans, full, parts, strict=True):
        if isinstance(p, TrafficSpec):
            results.append(traffic_summary(p, t, tl.frame))
        else:
            results.append(api.metrics(t, tl))
    return JobsResult(jobs=jobs, trace=trace, timeline=timeline, results=results,
                      links=link_metrics(trace, timeline, topology),
                      alone_ns=alone_ns if alone else None)
