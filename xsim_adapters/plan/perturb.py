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
      jitter: {sigma: 0.05}                   # per-kernel log-normal noise, mean 1, plan seed

Factors multiply: a rank named by two entries runs ``f1 x f2`` slower. The jitter of kernel
``k`` is ``exp(sigma * z_k - sigma**2 / 2)`` with ``z_k`` standard normal drawn from the plan's
``seed`` in op order, so its mean is exactly 1 and a run is reproducible (docs/whatif.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError
from . import _fields as f
from .model import DeviceGroup

PERTURB_KEYS = ("slow", "jitter")
SLOW_TARGET_KEYS = ("rank", "ranks", "group", "server")
SLOW_KEYS = (*SLOW_TARGET_KEYS, "devices", "factor")
# A factor outside [1/100, 100] is a typo, not a what-if (a GPU 100x slower would be dead).
MAX_SLOWDOWN_FACTOR = 100.0
# Log-normal sigma above 1 gives kernels 20x their mean at 3 sigma: not a jitter any more.
MAX_JITTER_SIGMA = 1.0


@dataclass(frozen=True)
class Slowdown:
    """Compute kernels of ``ranks`` (global) take ``factor`` x their modelled time."""

    ranks: tuple[int, ...]
    factor: float


@dataclass(frozen=True)
class PerturbSpec:
    slow: tuple[Slowdown, ...] = ()
    jitter_sigma: float = 0.0  # log-normal sigma of per-kernel noise (0: none)

    @property
    def active(self) -> bool:
        return bool(self.slow) or self.jitter_sigma > 0


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
    return Slowdown(ranks=tuple(sorted(ranks)), factor=factor)


def _group_ranks(m: Any, path: str, groups: Sequence[DeviceGroup]) -> tuple[int, ...]:
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
        out["slow"] = [{"ranks": list(s.ranks), "factor": s.factor} for s in spec.slow]
    if spec.jitter_sigma > 0:
        out["jitter"] = {"sigma": spec.jitter_sigma}
    return out
