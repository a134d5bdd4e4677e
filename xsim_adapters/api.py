"""The Python API, for notebooks and scripts: plan -> trace -> timeline -> metrics.

>>> import xsim_adapters as xs
>>> plan = xs.load_plan("workloads/hetero-dp-h100-a100.yaml")
>>> trace = xs.generate(plan)
>>> tl = xs.run(plan, backend="flow")             # or xs.run(trace, topology=...)
>>> m = xs.metrics(trace, tl); m.ranks, m.summary

The pipeline modules are imported when first used, so ``import xsim_adapters`` stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._argcheck import PATH_TYPES, check_arg
from .errors import BackendError, TraceError, XsimError
from .metrics.bundle import Metrics, compute_metrics
from .metrics.compare import Comparison, compare_metrics
from .options import COMMON_OPTIONS, check_options
from .trace.schema import Trace
from .trace.timeline import Timeline

if TYPE_CHECKING:
    from .plan.model import Plan
    from .topology.model import Topology

PLAN_FILE = "plan.yaml"  # written into every trace directory the CLI/API writes
_PLAN = "a Plan (xs.load_plan(path))"
_TRACE = "a Trace (xs.generate(plan) or xs.read_trace(dir))"
_PATH = "a path (str or os.PathLike)"


def _check_plan(func: str, name: str, value: Any, optional: bool = False) -> None:
    from .plan.model import Plan

    check_arg(func, name, value, Plan, _PLAN, optional)


def _check_topology(func: str, value: Any) -> None:
    from .topology.model import Topology

    check_arg(func, "topology", value, Topology, "a Topology (xs.build_topology(plan))",
              optional=True)


def _check_options(func: str, value: Any) -> None:
    check_arg(func, "options", value, Mapping, "a mapping of backend options (e.g. "
              "{'seed': 1})", optional=True)


def load_plan(source: str | Path) -> Plan:
    """Validate a plan from a YAML file path or YAML text; raises PlanError naming the path."""
    from .feasibility import load_plan as _load_plan

    check_arg("load_plan", "source", source, PATH_TYPES, f"{_PATH} or YAML text")

    return _load_plan(source)


def generate(plan: Plan, coarsen: str = "auto") -> Trace:
    """The backend-agnostic trace of one training iteration of ``plan``.

    ``coarsen``: ``auto`` | ``on`` | ``off``: simulate one representative of each class of
    identical DP replicas, and only the first p + 8 micro-batches of a 1F1B pipeline whose
    steady state repeats (docs/scale.md); ``trace.manifest["coarsening"]`` says what was done.
    """
    from .workload import generate as _generate

    _check_plan("generate", "plan", plan)
    return _generate(plan, coarsen)


def build_topology(plan: Plan) -> Topology:
    """The network graph of ``plan`` (GPUs, switches, links in Gb/s and ns, ECMP routing)."""
    from .topology import build_topology as _build

    _check_plan("build_topology", "plan", plan)
    return _build(plan)


def write_trace(trace: Trace, directory: str | Path, plan: Plan | None = None,
                force: bool = False) -> Path:
    """Write ``trace`` to ``directory`` as one unit; with ``plan``, also ``plan.yaml`` inside it
    so the trace can be replayed later (the topology is rebuilt from that plan).

    ``directory`` must be absent, empty or an earlier xsim trace; ``force`` also replaces an
    earlier xsim output of another kind. A directory holding files xsim did not write is
    never replaced (OutputError). See docs/outputs.md.
    """
    from ._outdir import output_dir

    check_arg("write_trace", "trace", trace, Trace, _TRACE)
    check_arg("write_trace", "directory", directory, PATH_TYPES, _PATH)
    _check_plan("write_trace", "plan", plan, optional=True)
    check_arg("write_trace", "force", force, bool, "True or False")
    with output_dir(directory, "trace", force) as tmp:
        write_trace_files(trace, tmp, plan)
    return Path(directory)


def write_trace_files(trace: Trace, directory: Path, plan: Plan | None = None) -> None:
    """The trace's files (and ``plan.yaml``) into the existing directory ``directory``, which
    the caller owns (a temporary directory swapped in later)."""
    from .plan import plan_to_yaml
    from .trace import write_trace as _write_trace

    if plan is not None:  # the plan.yaml a replay rebuilds the network from: this trace's
        from .workload import plan_digest

        want, have = trace.manifest.get("plan_digest"), plan_digest(plan)
        if want != have:
            raise TraceError(f"write_trace(): plan: the trace was generated from another plan "
                             f"(plan_digest {str(want)[:64]}, this plan's {have}); pass the "
                             "plan the trace was generated from")
    extra = {PLAN_FILE: plan_to_yaml(plan)} if plan is not None else None
    staged = _write_trace(trace, directory / ".trace-staging", extra_files=extra)
    for entry in staged.iterdir():
        entry.rename(directory / entry.name)
    staged.rmdir()


def read_trace(directory: str | Path) -> Trace:
    """Read a trace directory; raises TraceError if missing, damaged or of another version."""
    from .trace import read_trace as _read_trace

    check_arg("read_trace", "directory", directory, PATH_TYPES, _PATH)
    return _read_trace(directory)


def load_trace_and_plan(directory: str | Path) -> tuple[Trace, Plan]:
    """A trace directory and the plan stored beside it (``plan.yaml``), for replays."""
    check_arg("load_trace_and_plan", "directory", directory, PATH_TYPES, _PATH)
    directory = Path(directory)
    trace = read_trace(directory)
    plan_path = directory / PLAN_FILE
    if not plan_path.is_file():
        raise TraceError(
            f"{directory}: no {PLAN_FILE} in the trace directory, so its network cannot be"
            " rebuilt; write traces with `xsim trace PLAN -o DIR` (which stores the plan) or"
            " pass the plan itself"
        )
    from .feasibility import load_plan as _load_plan

    plan = _load_plan(plan_path, stored=True)  # xsim wrote it: every stage is spelled out
    check_plan_digest(trace, plan, plan_path)
    return trace, plan


def check_plan_digest(trace: Trace, plan: Plan, plan_path: str | Path) -> None:
    """The trace was generated from ``plan``: its manifest's plan_digest equals the plan's
    digest, and what the manifest derives from the plan alone (``compute_slowdowns``, the
    interval slowdowns the backends apply) equals what the plan gives; TraceError with both
    if not (``plan.yaml`` or ``manifest.json`` edited after tracing)."""
    from .trace.slowdowns import MANIFEST_KEY
    from .workload import plan_digest
    from .workload.perturb import interval_slowdowns

    want, have = trace.manifest.get("plan_digest"), plan_digest(plan)
    if want != have:
        raise TraceError(
            f"{plan_path}: plan_digest: the trace was generated from a plan with digest "
            f"{str(want)[:64]}, but this plan.yaml has digest {have}; the plan was changed "
            "after tracing. Regenerate the trace with `xsim trace PLAN -o DIR`, or run the "
            "plan itself"
        )
    have_sl, want_sl = trace.manifest.get(MANIFEST_KEY) or [], interval_slowdowns(plan.perturb)
    if have_sl != want_sl:
        mpath = Path(plan_path).parent / "manifest.json"
        raise TraceError(
            f"{mpath}: {MANIFEST_KEY}: the manifest has {len(have_sl)} interval compute "
            f"slowdowns but {Path(plan_path).name} (perturb.slow with from_us/until_us) gives "
            f"{len(want_sl)}{'' if len(have_sl) != len(want_sl) else ', different ones'}; the "
            "manifest was changed after tracing. Regenerate the trace with `xsim trace PLAN "
            "-o DIR`, or run the plan itself"
        )


def _backend(name: str, options: Mapping[str, Any] | None = None):
    from .backends.registry import get_backend

    return get_backend(name, options)


def run(plan_or_trace: Plan | Trace | str | Path, backend: str = "flow",
        topology: Topology | None = None, options: Mapping[str, Any] | None = None,
        trace: Trace | None = None) -> Timeline:
    """Replay one iteration on ``backend``; returns a complete Timeline (times in ns).

    ``plan_or_trace``: a Plan (the trace is generated, the topology built), a Trace (then
    ``topology`` is required: a trace alone does not describe the network), a plan YAML path,
    or a trace directory holding ``plan.yaml``. ``trace`` reuses an already generated trace
    of the plan. ``options["progress"]``: a hook called during the replay (see
    :mod:`xsim_adapters.backends.base`). ``timeline.stats`` holds the run info of the contract
    (start-up vs replay seconds, packet vs fluid flows and bytes). Raises BackendUnavailable /
    BackendError from the backend, BackendContractError if the run info is missing or wrong.
    """
    from .plan.model import Plan as _Plan

    check_arg("run", "plan_or_trace", plan_or_trace, (_Plan, Trace, *PATH_TYPES),
              f"{_PLAN}, {_TRACE}, or {_PATH} of a plan file or trace directory")
    check_arg("run", "backend", backend, str, "a backend name (str, e.g. 'flow')")
    _check_topology("run", topology)
    _check_options("run", options)
    check_arg("run", "trace", trace, Trace, _TRACE, optional=True)
    plan: Plan | None = None
    if isinstance(plan_or_trace, str | os.PathLike):
        p = Path(plan_or_trace)
        if p.is_dir():
            trace, plan = load_trace_and_plan(p)
        else:
            plan = load_plan(p)
    elif isinstance(plan_or_trace, Trace):
        trace = plan_or_trace
        from .trace.validate import validate_trace

        validate_trace(trace)  # a caller's trace: checked once (a read trace already was)
    else:
        plan = plan_or_trace
        if trace is not None:  # the caller's trace of this plan: checked like any other
            from .trace.validate import validate_trace

            validate_trace(trace)
            check_plan_digest(trace, plan, "run(plan, trace=...)")
    if trace is None:
        assert plan is not None
        trace = generate(plan)
    if topology is None:
        if plan is None:
            raise XsimError(
                "run(trace): pass topology=build_topology(plan); a trace alone does not"
                " describe the network"
            )
        topology = build_topology(plan)
    from .backends.base import check_inputs, check_run_info

    check_inputs(trace, topology)  # the trace's ranks sit where the topology's GPUs are
    be = _backend(backend, options)
    # Every backend's options are checked here too, so a plugin that forgets to is still safe.
    check_options(backend, getattr(be, "options", COMMON_OPTIONS), options)
    timeline = be.run(trace, topology, dict(options or {}))
    if not isinstance(timeline, Timeline):
        raise BackendError(f"backend {backend!r} returned {type(timeline).__name__}, not a"
                           " Timeline")
    timeline.check_complete(trace)
    check_run_info(backend, trace, timeline.stats)  # packets vs fluid, start-up vs replay
    return timeline


def metrics(trace: Trace, timeline: Timeline) -> Metrics:
    """All metrics of one run: ``.timeline``, ``.ranks``, ``.stragglers``, ``.replicas``,
    ``.device_types`` (pandas frames, times in ns) and ``.summary`` (dict)."""
    check_arg("metrics", "trace", trace, Trace, _TRACE)
    check_arg("metrics", "timeline", timeline, Timeline, "a Timeline (xs.run(...))")
    return compute_metrics(trace, timeline)


@dataclass
class BackendComparison:
    """Several backends on one trace and topology. ``pairs[(a, b)]`` compares b against a
    (the first backend is the reference); ``table`` / ``ranks`` stack all pairs."""

    trace: Trace
    timelines: dict[str, Timeline]
    metrics: dict[str, Metrics]
    pairs: dict[tuple[str, str], Comparison] = field(default_factory=dict)

    @property
    def table(self):
        import pandas as pd

        return pd.concat([c.metrics for c in self.pairs.values()], ignore_index=True)

    @property
    def run_info(self):
        """One row per backend: packet vs fluid flows and bytes, start-up vs replay seconds
        (:func:`xsim_adapters.metrics.compare.run_info_frame`)."""
        from .metrics.compare import run_info_frame

        return run_info_frame(self.timelines)

    @property
    def ranks(self):
        import pandas as pd

        return pd.concat(
            [c.ranks.assign(backend_a=a, backend_b=b) for (a, b), c in self.pairs.items()],
            ignore_index=True,
        )


def write_report(met: Metrics, out_dir: str | Path, *, plots: bool = True, title: str = "",
                 force: bool = False) -> list[Path]:
    """Write the report of one run into ``out_dir``, exactly what ``xsim run`` writes beside
    its trace: ``timeline.parquet`` (the backend's start/end per op, ns), ``ranks.csv``
    (per-rank metrics and time breakdown, int ns), ``summary.json`` and, with ``plots``,
    ``timeline.png`` and ``timeline.perfetto.json``. Returns the paths written.

    ``met``: from :func:`metrics`. The safe output rules of ``xsim run`` apply
    (docs/outputs.md): ``out_dir`` must be absent, empty or an earlier xsim run output
    (``force``: an xsim output of another kind); a directory holding files xsim did not write
    is refused with OutputError and left as it was. The directory is written beside
    ``out_dir`` and swapped in whole.
    """
    from ._outdir import output_dir
    from .report.outputs import write_run

    check_arg("write_report", "met", met, Metrics, "the Metrics of xs.metrics(trace, timeline)")
    check_arg("write_report", "out_dir", out_dir, PATH_TYPES, _PATH)
    timeline = met.source
    if timeline is None:  # Metrics built by hand: the (integer-ns) frame is all there is
        timeline = Timeline(met.backend, met.timeline[["op_id", "start_ns", "end_ns"]]
                            .astype({"start_ns": "float64", "end_ns": "float64"})
                            .reset_index(drop=True))
    out = Path(out_dir)
    with output_dir(out, "run", force) as tmp:
        written = write_run(tmp, timeline, met, plots=plots,
                            title=title or f"{met.summary.get('plan')} on {met.backend}")
    return [out / p.relative_to(tmp) for p in written]


def compare_backends(plan: Plan, backends: Sequence[str] = ("flow", "ns3"),
                     options: Mapping[str, Mapping[str, Any]] | None = None,
                     trace: Trace | None = None, topology: Topology | None = None,
                     progress: Callable[[str], Callable[..., None] | None] | None = None,
                     ) -> BackendComparison:
    """Run every backend on the identical trace and topology of ``plan`` and compare each
    with the first. ``options`` maps a backend name to its options. ``progress(name)``, if
    given, is called as backend ``name`` starts and returns its progress hook (see
    :mod:`xsim_adapters.backends.base`; e.g. ``ProgressBar.replay_hook``) or None."""
    _check_plan("compare_backends", "plan", plan)
    check_arg("compare_backends", "backends", backends, (list, tuple),
              "a list of backend names (e.g. ['flow', 'ns3'])")
    for i, b in enumerate(backends):
        check_arg("compare_backends", f"backends[{i}]", b, str, "a backend name (str)")
    check_arg("compare_backends", "options", options, Mapping,
              "a mapping of backend name -> options", optional=True)
    for name, opts in (options or {}).items():
        check_arg("compare_backends", f"options[{name!r}]", opts, Mapping,
                  "a mapping of that backend's options", optional=True)
    check_arg("compare_backends", "trace", trace, Trace, _TRACE, optional=True)
    _check_topology("compare_backends", topology)
    names = list(dict.fromkeys(backends))
    if len(names) < 2:
        raise XsimError(f"compare needs at least two different backends (got {names})")
    trace = trace if trace is not None else generate(plan)
    topology = topology if topology is not None else build_topology(plan)
    tls: dict[str, Timeline] = {}
    mets: dict[str, Metrics] = {}
    for name in names:
        opts = dict((options or {}).get(name) or {})
        hook = progress(name) if progress is not None else None
        if hook is not None:
            opts["progress"] = hook
        tls[name] = run(trace, name, topology, opts)
        mets[name] = compute_metrics(trace, tls[name])
    ref = names[0]
    pairs = {(ref, b): compare_metrics(mets[ref], mets[b]) for b in names[1:]}
    return BackendComparison(trace, tls, mets, pairs)


def link_metrics(trace: Trace, timeline: Timeline, topology: Topology) -> Any:
    """Per-link telemetry of a run (bytes, busy time, peak concurrent flows, utilisation per
    directed link): :func:`xsim_adapters.metrics.links.link_metrics`."""
    from .metrics.links import link_metrics as _links
    from .topology.model import Topology as _Topology

    check_arg("link_metrics", "trace", trace, Trace, _TRACE)
    check_arg("link_metrics", "timeline", timeline, Timeline, "a Timeline (xs.run(...))")
    check_arg("link_metrics", "topology", topology, _Topology,
              "a Topology (xs.build_topology(plan))")
    return _links(trace, timeline, topology)


def add_perturbation_cost(met: Metrics, plan: Plan, backend: str = "flow",
                          options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replay ``plan`` without its ``perturb:`` section on ``backend`` and add what the
    perturbation cost to ``met.summary["perturbation"]``: ``baseline_iteration_ns``,
    ``cost_ns`` (perturbed minus baseline iteration time) and ``cost_pct``. Returns that dict.

    Raises XsimError when the plan has no perturbation (there is nothing to compare).
    """
    import dataclasses

    from .plan.perturb import PerturbSpec

    check_arg("add_perturbation_cost", "met", met, Metrics,
              "the Metrics of xs.metrics(trace, timeline)")
    _check_plan("add_perturbation_cost", "plan", plan)
    if not plan.perturb.active:
        raise XsimError("--baseline: the plan has no perturb: section, so there is no "
                        "perturbation to cost (docs/whatif.md)")
    base = dataclasses.replace(plan, perturb=PerturbSpec())
    tl = run(base, backend, options=options)
    it = int(met.summary["iteration_time_ns"])
    b = int(tl.makespan_ns)
    block = met.summary.setdefault("perturbation", {})
    block.update(
        baseline_iteration_ns=b,
        cost_ns=it - b,
        cost_pct=100.0 * (it - b) / b if b > 0 else 0.0,
    )
    return block

