"""The ``perturb:`` section: injected compute slowdowns and per-kernel jitter (what-if runs).

A perturbation changes how long compute kernels take on chosen ranks; the network, the
schedule and the bytes moved are unchanged. It is applied to the trace by the generator
(:mod:`xsim_adapters.workload.perturb`), so every backend replays it unchanged::

    perturb:
      slow:                                   # whole-iteration slowdowns, applied in order
        - {rank: 5, factor: 1.15}             # one GPU 15% slower
        - {group: a100, devices: [0, 8], factor: 1.3}   # devices [0, 8) of a group
        - {server: 3, factor: 1.1}            # every GPU of global server 3
        - {ranks: [0, 9], factor: 0.9}        # a list of global ranks (10% faster)
        - {rank: 2, factor: 2, from_us: 100, until_us: 300}   # throttled for 200 us
      jitter: {sigma: 0.05}                   # per-kernel log-normal noise, mean 1, plan seed

Factors multiply: a rank named by two entries runs ``f1 x f2`` slower. The jitter of kernel
``k`` is ``exp(sigma * z_k - sigma**2 / 2)`` with ``z_k`` standard normal drawn from the plan's
``seed`` in op order, so its mean is exactly 1 and a run is reproducible (docs/whatif.md).

An entry with ``from_us`` and/or ``until_us`` is an *interval* slowdown (throttling): the ranks
compute at ``1 / factor`` of their speed from ``from_us`` (default 0) until ``until_us``
(default: the end of the run), in simulated time. The trace holds durations, not start times,
so interval entries do not change the trace's ops: they go to its manifest
(``compute_slowdowns``, :mod:`xsim_adapters.trace.slowdowns`) and every backend stretches the
kernels it runs inside the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .model import DeviceGroup

PERTURB_KEYS = ("slow", "jitter")
SLOW_TARGET_KEYS = ("rank", "ranks", "group", "server")
SLOW_KEYS = (*SLOW_TARGET_KEYS, "devices", "factor", "from_us", "until_us")
# A factor outside [1/100, 100] is a typo, not a what-if (a GPU 100x slower would be dead).
MAX_SLOWDOWN_FACTOR = 100.0
# Log-normal sigma above 1 gives kernels 20x their mean at 3 sigma: not a jitter any more.
MAX_JITTER_SIGMA = 1.0


@dataclass(frozen=True)
class Slowdown:
    """Compute kernels of ``ranks`` (global) take ``factor`` x their modelled time.

    With ``from_us`` or ``until_us`` set, only while simulated time is in
    ``[from_us, until_us)`` (``None``: from 0 / to the end of the run): an interval slowdown,
    applied by the backends (see the module docstring).
    """

    ranks: tuple[int, ...]
    factor: float
    from_us: float | None = None
    until_us: float | None = None

    @property
    def interval(self) -> bool:
        """Whether this entry holds only over a time window (applied by the backends)."""
        return self.from_us is not None or self.until_us is not None


@dataclass(frozen=True)
class PerturbSpec:
    slow: tuple[Slowdown, ...] = ()
    jitter_sigma: float = 0.0  # log-normal sigma of per-kernel noise (0: none)

    @property
    def active(self) -> bool:
        return bool(self.slow) or self.jitter_sigma > 0

    @property
    def whole(self) -> tuple[Slowdown, ...]:
        """The whole-iteration entries (applied to the trace's durations)."""
        return tuple(s for s in self.slow if not s.interval)

    @property
    def intervals(self) -> tuple[Slowdown, ...]:
        """The interval entries (applied by the backends, from the manifest)."""
        return tuple(s for s in self.slow if s.interval)


def parse_perturb(value: Any, path: str, groups: Sequence[DeviceGroup]) -> PerturbSpec:
    """The ``perturb:`` section -> PerturbSpec with targets resolved to global ranks."""
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, PERTURB_KEYS)
    slow = tuple(
        _parse_slowdown(x, f.join(f.join(path, "slow"), i), groups)
        for i, x in enumerate(f.expect_list(m.get("slow", []), f.join(path, "slow")))
    )
    sigma = 0.0
    if "jitter" in m:
        jpath = f.join(path, "jitter")
        j = f.expect_mapping(m["jitter"], jpath)
        f.check_keys(j, jpath, ("sigma",), ("sigma",))
        sigma = f.get_number(j, "sigma", jpath, positive=False, at_most=MAX_JITTER_SIGMA)
    return PerturbSpec(slow=slow, jitter_sigma=sigma)


def _parse_slowdown(value: Any, path: str, groups: Sequence[DeviceGroup]) -> Slowdown:
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, SLOW_KEYS, ("factor",))
    targets = [k for k in SLOW_TARGET_KEYS if k in m]
    if len(targets) != 1:
        raise PlanError(
            path, f"expected exactly one of {', '.join(SLOW_TARGET_KEYS)} "
            f"(got {', '.join(targets) if targets else 'none'})"
        )
    factor = f.get_number(
        m, "factor", path, at_least=1.0 / MAX_SLOWDOWN_FACTOR, at_most=MAX_SLOWDOWN_FACTOR
    )
    if "devices" in m and targets[0] != "group":
        raise PlanError(f.join(path, "devices"), "devices is allowed only with group")
    window = _parse_window(m, path)
    total = sum(g.num_devices for g in groups)
    key = targets[0]
    if key == "rank":
        ranks: tuple[int, ...] = (f.get_int(m, "rank", path, minimum=0, maximum=total - 1,
                                            limit="the plan's last global rank"),)
    elif key == "ranks":
        rpath = f.join(path, "ranks")
        items = f.expect_list(m["ranks"], rpath)
        if not items:
            raise PlanError(rpath, "expected at least one global rank (got [])")
        for i, x in enumerate(items):
            f.note(f.join(rpath, i), {"type": "integer", "minimum": 0})  # for the JSON Schema
            if not (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < total):
                raise PlanError(
                    f.join(rpath, i), f"expected a global rank in 0..{total - 1} (got {f.got(x)})"
                )
        ranks = tuple(int(x) for x in items)
        if len(set(ranks)) != len(ranks):
            raise PlanError(rpath, f"expected distinct ranks (got {f.got(items)})")
    elif key == "group":
        ranks = _group_ranks(m, path, groups)
    else:
        servers = sum(g.nodes for g in groups)
        s = f.get_int(m, "server", path, minimum=0, maximum=servers - 1,
                      limit="the plan's last global server index")
        ranks = _server_ranks(s, groups)
    return Slowdown(ranks=tuple(sorted(ranks)), factor=factor, from_us=window[0],
                    until_us=window[1])


def _parse_window(m: Any, path: str) -> tuple[float | None, float | None]:
    """``(from_us, until_us)`` of an entry, each None when absent; from < until."""
    lo = hi = None
    if "from_us" in m:
        lo = f.get_number(m, "from_us", path, positive=False, at_most=lim.MAX_TIME_US)
    if "until_us" in m:
        hi = f.get_number(m, "until_us", path, at_most=lim.MAX_TIME_US)
    if hi is not None and hi <= (lo or 0.0):
        raise PlanError(f.join(path, "until_us"),
                        f"expected a time after from_us ({lo or 0.0:g} us) (got {hi:g})")
    return lo, hi


def _group_ranks(m: Any, path: str, groups: Sequence[DeviceGroup]) -> tuple[int, ...]:
    f.note(f.join(path, "group"), {"type": "string"})  # a device_groups name
    name = m["group"]
    off = 0
    for g in groups:
        if g.name == name:
            lo, hi = (0, g.num_devices)
            if "devices" in m:
                lo, hi = f.get_range(m, "devices", path)
                if not lo < hi <= g.num_devices:
                    raise PlanError(
                        f.join(path, "devices"),
                        f"expected [start, stop) with start < stop <= {g.num_devices} "
                        f"(group {name} has {g.num_devices} devices) (got [{lo}, {hi}])",
                    )
            return tuple(range(off + lo, off + hi))
        off += g.num_devices
    raise PlanError(
        f.join(path, "group"),
        f"unknown device group; expected one of {', '.join(g.name for g in groups)} "
        f"(got {f.got(name)})",
    )


def _server_ranks(server: int, groups: Sequence[DeviceGroup]) -> tuple[int, ...]:
    off = node_off = 0
    for g in groups:
        if server < node_off + g.nodes:
            first = off + (server - node_off) * g.gpus_per_node
            return tuple(range(first, first + g.gpus_per_node))
        off += g.num_devices
        node_off += g.nodes
    raise AssertionError("server index checked against the plan's servers")


def perturb_to_dict(spec: PerturbSpec) -> dict[str, Any]:
    """The section as plan data (targets as global ``ranks``); loading it gives ``spec``."""
    out: dict[str, Any] = {}
    if spec.slow:
        out["slow"] = [slowdown_to_dict(s) for s in spec.slow]
    if spec.jitter_sigma > 0:
        out["jitter"] = {"sigma": spec.jitter_sigma}
    return out


def slowdown_to_dict(s: Slowdown) -> dict[str, Any]:
    """One ``slow`` entry as plan data (``from_us`` / ``until_us`` only when set)."""
    out: dict[str, Any] = {"ranks": list(s.ranks), "factor": s.factor}
    if s.from_us is not None:
        out["from_us"] = s.from_us
    if s.until_us is not None:
        out["until_us"] = s.until_us
    return out
