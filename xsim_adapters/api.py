"""The Python API, for notebooks and scripts: plan -> trace -> timeline -> metrics.

>>> import xsim_adapters as xs
>>> plan = xs.load_plan("workloads/hetero-dp-h100-a100.yaml")
>>> trace = xs.generate(plan)
>>> tl = xs.run(plan, backend="flow")             # or xs.run(trace, topology=...)
>>> m = xs.metrics(trace, tl); m.ranks, m.summary

The pipeline modules are imported when first used, so ``import xsim_adapters`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def load_plan(source: str | Path) -> Plan:
    """Validate a plan from a YAML file path or YAML text; raises PlanError naming the path."""
    from .plan import load_plan as _load_plan

    return _load_plan(source)


def generate(plan: Plan, coarsen: str = "auto") -> Trace:
    """The backend-agnostic trace of one training iteration of ``plan``.

    ``coarsen``: ``auto`` | ``on`` | ``off``: simulate one representative of each class of
    identical DP replicas, and only the first p + 8 micro-batches of a 1F1B pipeline whose
    steady state repeats (docs/scale.md); ``trace.manifest["coarsening"]`` says what was done.
    """
    from .workload import generate as _generate

    return _generate(plan, coarsen)


def build_topology(plan: Plan) -> Topology:
    """The network graph of ``plan`` (GPUs, switches, links in Gb/s and ns, ECMP routing)."""
    from .topology import build_topology as _build

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

    with output_dir(directory, "trace", force) as tmp:
        write_trace_files(trace, tmp, plan)
    return Path(directory)


def write_trace_files(trace: Trace, directory: Path, plan: Plan | None = None) -> None:
    """The trace's files (and ``plan.yaml``) into the existing directory ``directory``, which
    the caller owns (a temporary directory swapped in later)."""
    from .plan import plan_to_yaml
    from .trace import write_trace as _write_trace

    extra = {PLAN_FILE: plan_to_yaml(plan)} if plan is not None else None
    staged = _write_trace(trace, directory / ".trace-staging", extra_files=extra)
    for entry in staged.iterdir():
        entry.rename(directory / entry.name)
    staged.rmdir()


def read_trace(directory: str | Path) -> Trace:
    """Read a trace directory; raises TraceError if missing, damaged or of another version."""
    from .trace import read_trace as _read_trace

    return _read_trace(directory)


def load_trace_and_plan(directory: str | Path) -> tuple[Trace, Plan]:
    """A trace directory and the plan stored beside it (``plan.yaml``), for replays."""
    directory = Path(directory)
    trace = read_trace(directory)
    plan_path = directory / PLAN_FILE
    if not plan_path.is_file():
        raise TraceError(
            f"{directory}: no {PLAN_FILE} in the trace directory, so its network cannot be"
            " rebuilt; write traces with `xsim trace PLAN -o DIR` (which stores the plan) or"
            " pass the plan itself"
        )
    from .plan import load_plan as _load_plan

    plan = _load_plan(plan_path, stored=True)  # xsim wrote it: every stage is spelled out
    check_plan_digest(trace, plan, plan_path)
    return trace, plan


def check_plan_digest(trace: Trace, plan: Plan, plan_path: str | Path) -> None:
    """The trace was generated from ``plan``: its manifest's plan_digest equals the plan's
    digest; TraceError with both digests if not (e.g. ``plan.yaml`` edited after tracing)."""
    from .workload import plan_digest

    want, have = trace.manifest.get("plan_digest"), plan_digest(plan)
    if want != have:
        raise TraceError(
            f"{plan_path}: plan_digest: the trace was generated from a plan with digest "
            f"{str(want)[:64]}, but this plan.yaml has digest {have}; the plan was changed "
            "after tracing. Regenerate the trace with `xsim trace PLAN -o DIR`, or run the "
            "plan itself"
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
    plan: Plan | None = None
    if isinstance(plan_or_trace, str | Path):
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
    be = _backend(backend, options)
    # Every backend's options are checked here too, so a plugin that forgets to is still safe.
    check_options(backend, getattr(be, "options", COMMON_OPTIONS), options)
    timeline = be.run(trace, topology, dict(options or {}))
    if not isinstance(timeline, Timeline):
        raise BackendError(f"backend {backend!r} returned {type(timeline).__name__}, not a"
                           " Timeline")
    timeline.check_complete(trace)
    from .backends.base import check_run_info

    check_run_info(backend, trace, timeline.stats)  # packets vs fluid, start-up vs replay
    return timeline


def metrics(trace: Trace, timeline: Timeline) -> Metrics:
    """All metrics of one run: ``.timeline``, ``.ranks``, ``.stragglers``, ``.replicas``,
    ``.device_types`` (pandas frames, times in ns) and ``.summary`` (dict)."""
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

    if not isinstance(met, Metrics):
        raise XsimError(f"write_report needs the Metrics of xs.metrics(trace, timeline) "
                        f"(got {type(met).__name__})")
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


def search(spec: str | Path, jobs: int = 1, executor: str = "local",
           ray_address: str | None = None, **kwargs: Any) -> Any:
    """Search the plans a search spec (YAML path or text) allows for the best one on its
    cluster; returns a :class:`xsim_adapters.search.SearchResult` (``.best``, ``.summary``).
    ``jobs``/``executor``: where simulations run, as for sweeps. See docs/search.md; other
    keyword arguments go to :func:`xsim_adapters.search.search`."""
    from .search import search as _search
    from .sweep.runner import make_executor

    return _search(spec, make_executor(executor, jobs, ray_address), **kwargs)
