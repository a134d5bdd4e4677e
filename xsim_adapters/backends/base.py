"""The backend contract.

A backend is a class registered under the entry-point group ``xsim_adapters.backends`` with:

- ``name``: a class attribute, the name users type (``flow``, ``ns3``, ``htsim``);
- ``available() -> tuple[bool, str]``: whether it can run here, and if not, exactly what is
  missing (a reason that tells the user what to install or set);
- ``options``: a class attribute, the tuple of :class:`~xsim_adapters.options.Option` it
  accepts (default: ``seed`` and ``progress``); ``run`` checks its mapping with
  :func:`~xsim_adapters.options.check_options`, so unknown keys and bad values are errors;
- ``run(trace, topology, options) -> Timeline``: replay every op of ``trace`` on ``topology``
  (:class:`~xsim_adapters.trace.timeline.Timeline`, re-exported here for plugins).

Rules every backend keeps: every op of the trace appears in the timeline with ``start_ns`` and
``end_ns``; a flow that never completed, a stuck DAG or a simulator crash raises
:class:`~xsim_adapters.errors.BackendError` carrying the simulator's own message; a partial
timeline is never returned as if complete. Results are deterministic for a given trace,
topology and options (including ``seed``).

Progress: ``options["progress"]`` (None or a hook ``hook(done_ops, total_ops)``; a hook that
accepts a ``sim_ns`` keyword also gets the simulated time reached, in ns) is called by the
backend *during its replay*: once with ``done_ops = 0`` when the replay starts, as ops complete,
and once with ``done_ops = total_ops`` when it ends; ``done_ops`` never decreases. Wrap the hook
in :class:`ReplayProgress`, which keeps these rules and throttles the calls by wall time. A
backend whose replay runs in another process relays the child's reports (ns-3: a pipe from the
worker; htsim: the driver's stderr).

Run info: ``Timeline.stats`` holds, besides backend-specific facts, the keys of
:data:`RUN_INFO_KEYS`: ``wall_s`` (the whole ``run`` call), ``startup_s`` (importing the
simulator, building its network and loading the DAG) and ``replay_s`` (the simulated
replay itself), with ``startup_s + replay_s <= wall_s``; and what was simulated as packets
against what was timed by a fluid (rate) model: ``packet_flows`` / ``packet_bytes`` and
``fluid_flows`` / ``fluid_bytes``. Every flow op of the trace is counted once, so the two
flow counts sum to the trace's flow ops and the byte counts to its flow bytes (a flow with no
network time, zero bytes or a copy within one rank, counts as fluid: no packet carried it).
:func:`check_run_info` enforces this; :func:`xsim_adapters.api.run` calls it on every run.
"""

from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import BackendContractError, TraceError
from ..options import COMMON_OPTIONS, Option
from ..topology.model import Topology
from ..trace.schema import KIND_COMPUTE, KIND_FLOW, Trace
from ..trace.timeline import Timeline

__all__ = ["RUN_INFO_KEYS", "Backend", "ReplayProgress", "Timeline", "check_inputs",
           "check_run_info", "compute_bound_ns", "flow_totals"]

#: Keys every backend puts in ``Timeline.stats`` (see the module docstring).
RUN_INFO_KEYS = ("wall_s", "startup_s", "replay_s", "packet_flows", "packet_bytes",
                 "fluid_flows", "fluid_bytes")

#: Least wall time between two progress calls, in s: often enough for a bar to move smoothly,
#: rare enough to cost nothing next to a replay.
PROGRESS_INTERVAL_S = 0.1


class ReplayProgress:
    """A backend's side of the progress hook: ``rp = ReplayProgress(options["progress"], n)``,
    ``rp.start()``, ``rp.update(done_ops, sim_ns)`` as often as convenient, ``rp.finish()``.

    Calls the hook at most every ``interval_s`` seconds of wall time, except the first call
    (``start``) and the last (``finish``, or an update reaching ``total_ops``), which are
    always made. ``done_ops`` and ``sim_ns`` are clamped so they never decrease.
    ``tick()`` repeats the last values (a heartbeat, so a bar's elapsed clock moves while a
    simulator completes nothing for a while). ``expected_sim_ns`` (e.g. :func:`compute_bound_ns`)
    is passed to hooks that take it, so a bar can count simulated time, which advances while a
    packet-level replay's last few large flows hold the op count still.
    A None hook makes every method a no-op.
    """

    def __init__(self, hook: Callable[..., Any] | None, total_ops: int,
                 interval_s: float = PROGRESS_INTERVAL_S,
                 expected_sim_ns: float | None = None) -> None:
        self.hook = hook
        self.total_ops = int(total_ops)
        self.interval_s = interval_s
        self.expected_sim_ns = expected_sim_ns
        self.done_ops = 0
        self.sim_ns: float | None = None
        self.calls = 0
        self._last = -float("inf")
        self._ended = False
        self._with_sim = hook is not None and _accepts(hook, "sim_ns")
        self._with_expected = hook is not None and _accepts(hook, "expected_sim_ns")

    def start(self) -> None:
        """The replay starts: ``hook(0, total_ops)``."""
        self._call(0, 0.0, force=True)

    def update(self, done_ops: int, sim_ns: float | None = None) -> None:
        """``done_ops`` ops have completed, the simulated clock is at ``sim_ns``."""
        done = min(max(int(done_ops), self.done_ops), self.total_ops)
        self._call(done, sim_ns, force=done >= self.total_ops)

    def finish(self, sim_ns: float | None = None) -> None:
        """The replay ended with every op done: ``hook(total_ops, total_ops)`` (once)."""
        self._call(self.total_ops, sim_ns, force=True)

    def tick(self) -> None:
        """Nothing new: call the hook again with the last values if ``interval_s`` has passed
        (backends call this while they wait on a simulator that reports nothing). Before the
        first report it does nothing: the first call stays the simulator's own."""
        if self.calls:
            self._call(self.done_ops, self.sim_ns, force=False)

    def _call(self, done: int, sim_ns: float | None, force: bool) -> None:
        if self.hook is None or self._ended:
            return
        if sim_ns is not None and self.sim_ns is not None:
            sim_ns = max(sim_ns, self.sim_ns)
        self.done_ops, self.sim_ns = done, sim_ns if sim_ns is not None else self.sim_ns
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self.calls += 1
        if done >= self.total_ops:
            self._ended = True
        kw: dict[str, Any] = {}
        if self._with_sim:
            kw["sim_ns"] = self.sim_ns
        if self._with_expected:
            kw["expected_sim_ns"] = self.expected_sim_ns
        self.hook(done, self.total_ops, **kw)


def _accepts(hook: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind == p.VAR_KEYWORD for p in params)


def compute_bound_ns(trace: Trace) -> float:
    """The busiest rank's compute time in ns (sum of its compute ops' ``duration_ns``): a lower
    bound of the iteration, since a rank runs its compute ops one after another. Progress bars
    measure a packet-level replay's simulated time against it."""
    ops = trace.ops
    comp = (ops["kind"] == KIND_COMPUTE).to_numpy()
    if not comp.any():
        return 0.0
    rank = ops["rank"].to_numpy()[comp].astype(np.int64)
    return float(np.bincount(rank, weights=ops["duration_ns"].to_numpy()[comp]).max())


def flow_totals(trace: Trace) -> tuple[int, int]:
    """(flow ops, their bytes) of ``trace``: what packet + fluid counts must sum to."""
    ops = trace.ops
    is_flow = ops["kind"].to_numpy() == KIND_FLOW
    return int(is_flow.sum()), int(ops["bytes"].to_numpy(dtype=np.int64)[is_flow].sum())


def check_run_info(name: str, trace: Trace, stats: Mapping[str, Any]) -> None:
    """Raise BackendContractError unless ``stats`` holds the run info of the contract: every
    key of :data:`RUN_INFO_KEYS`, non-negative times with ``startup_s + replay_s <= wall_s``,
    and packet + fluid flows and bytes equal to the trace's flow ops and bytes."""
    missing = [k for k in RUN_INFO_KEYS if k not in stats]
    if missing:
        raise BackendContractError(
            f"backend {name!r}: Timeline.stats lacks the run info {', '.join(missing)} (the"
            " contract in xsim_adapters/backends/base.py)"
        )
    times = {k: float(stats[k]) for k in ("wall_s", "startup_s", "replay_s")}
    if min(times.values()) < 0 or times["startup_s"] + times["replay_s"] > times["wall_s"] * (
            1 + 1e-9) + 1e-6:
        raise BackendContractError(
            f"backend {name!r}: run info times must be >= 0 with startup_s + replay_s <= wall_s"
            f" (got startup_s={times['startup_s']:.6g}, replay_s={times['replay_s']:.6g},"
            f" wall_s={times['wall_s']:.6g})"
        )
    flows, nbytes = flow_totals(trace)
    got_flows = int(stats["packet_flows"]) + int(stats["fluid_flows"])
    got_bytes = int(stats["packet_bytes"]) + int(stats["fluid_bytes"])
    if (got_flows, got_bytes) != (flows, nbytes):
        raise BackendContractError(
            f"backend {name!r}: packet + fluid flows and bytes must be the trace's {flows} flows"
            f" and {nbytes} bytes (got {got_flows} flows, {got_bytes} bytes)"
        )


def check_inputs(trace: Trace, topology: Topology) -> None:
    """Raise TraceError unless ``trace`` and ``topology`` describe the same cluster: as many
    GPUs in the topology as ranks in the manifest, and, for every rank record that says where
    its rank sits (``node``: traces of the generator and of ``--job`` runs; hand-made traces
    record labels only), the same server and, where the topology records it, the same device
    type. :func:`xsim_adapters.api.run` calls it before every backend, so no backend replays
    a trace on another plan's network."""
    ranks = trace.manifest["ranks"]
    fix = ("build the topology from the plan the trace was generated from "
           "(xs.build_topology(plan)), or replay the trace directory, whose plan.yaml is used")
    if topology.num_ranks != len(ranks):
        raise TraceError(f"run: the trace has {len(ranks)} ranks (manifest ranks) but the "
                         f"topology has {topology.num_ranks} GPUs; {fix}")
    placed = [i for i, r in enumerate(ranks) if "node" in r]
    if not placed:
        return
    idx = np.asarray(placed, dtype=np.int64)
    want = np.asarray([ranks[i]["node"] for i in placed], dtype=np.int64)
    server = topology.nodes["server"].to_numpy()[np.asarray(topology.rank_node)[idx]]
    bad = np.flatnonzero(server != want)
    if len(bad):
        r = int(idx[bad[0]])
        raise TraceError(f"run: manifest ranks[{r}].node: the trace puts rank {r} on server "
                         f"{int(want[bad[0]])}, the topology on server {int(server[bad[0]])} "
                         f"({len(bad)} ranks differ); {fix}")
    types = topology.rank_device_types
    if types is None:
        return
    want_types = [types[i] for i in placed]
    have_types = [ranks[i].get("device_type", t) for i, t in zip(placed, want_types, strict=True)]
    if have_types != want_types:  # one C-level comparison; the loop only to name the first
        k = next(k for k, (h, w) in enumerate(zip(have_types, want_types, strict=True)) if h != w)
        i = placed[k]
        raise TraceError(f"run: manifest ranks[{i}].device_type: the trace has "
                         f"{str(have_types[k])[:64]!r} on rank {i}, the topology "
                         f"{want_types[k]!r}; {fix}")


class Backend(ABC):
    """Base class of backends. Implement ``available`` and ``run``; set ``name`` and ``options``."""

    name: str = ""
    options: tuple[Option, ...] = COMMON_OPTIONS

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") if this backend can run here, else (False, what is missing).

        A backend whose availability depends on an option may accept the run's options as an
        optional argument, ``available(cls, options=None)``; the registry passes them when the
        caller has them (htsim: ``driver``).
        """

    @abstractmethod
    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology``; return a complete Timeline or raise BackendError.

        Call ``options["progress"]`` during the replay (through :class:`ReplayProgress`) and
        put the run info of :data:`RUN_INFO_KEYS` in ``Timeline.stats``.
        """
