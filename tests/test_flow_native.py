"""The compiled flow core (xsim_flowcore) against the Python reference executor.

Both engines must give the same timeline (within 1e-9 relative; by construction they do the
same floating-point operations, so in practice bit for bit) on random DAGs with congestion,
timed barriers and timed link events, and on every shipped plan. CI installs the core
(``.ci/run``), so ``test_native_core_is_installed`` fails there if the build is broken.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
from helpers import WORKLOADS, plan_params
from helpers.topo import TraceBuilder, make_plan

from xsim_adapters.backends.flow import FlowBackend, maxmin_rates
from xsim_adapters.backends.flow import native as native_mod
from xsim_adapters.backends.flow.backend import build_problem
from xsim_adapters.backends.flow.maxmin import SMALL_ENTRIES
from xsim_adapters.backends.flow.native import INSTALL_HINT, native_status, run_flows_native
from xsim_adapters.errors import BackendError, OptionError
from xsim_adapters.feasibility import load_plan
from xsim_adapters.plan.model import LinkEvent, ScaleOut
from xsim_adapters.testing.handmade import ring_all_reduce
from xsim_adapters.topology import build_topology
from xsim_adapters.trace import KIND_BARRIER
from xsim_adapters.workload import generate

HAVE_NATIVE, WHY_NOT = native_status()
needs_native = pytest.mark.skipif(not HAVE_NATIVE, reason=WHY_NOT)
REL = 1e-9  # the contract between the engines


def test_native_core_is_installed() -> None:
    """Fails (not skips) without the compiled core: CI installs it, so CI proves it builds."""
    assert HAVE_NATIVE, f"{WHY_NOT}\n(the README's install command installs it)"
    import xsim_flowcore

    assert xsim_flowcore.INTERFACE_VERSION == native_mod.INTERFACE_VERSION
    assert FlowBackend().run(*_tiny(), {}).stats["engine"] == "native"  # the default


def _tiny():
    topo = build_topology(make_plan([("h", "H100", 1, 4)]))
    tb = TraceBuilder(4)
    tb.flow(0, 1, 4_500_000, deps=[tb.compute(0, 1000)])
    return tb.build(), topo


def _same_timeline(trace, topo, **opts) -> tuple[dict, dict]:
    """Run both engines; assert the same timeline (or the same error); return both stats."""
    out = {}
    for engine in ("python", "native"):
        try:
            out[engine] = FlowBackend().run(trace, topo, {"engine": engine, **opts})
        except BackendError as e:
            out[engine] = str(e)
    py, nat = out["python"], out["native"]
    if isinstance(py, str) or isinstance(nat, str):
        assert py == nat  # the same error, word for word
        return {}, {}
    for col in ("start_ns", "end_ns"):
        a = py.frame[col].to_numpy()
        b = nat.frame[col].to_numpy()
        np.testing.assert_allclose(b, a, rtol=REL, atol=0.0, err_msg=col)
    for key in ("events", "rate_recomputations", "max_active_flows", "reroutes"):
        assert py.stats[key] == nat.stats[key], key
    assert py.stats["engine"] == "python" and nat.stats["engine"] == "native"
    return py.stats, nat.stats


def _random_case(seed: int):
    """A random DAG on a random small cluster: compute, flows (some 0-byte or same-rank, many
    contending for oversubscribed uplinks), plain and timed barriers, TP-style rings, and random
    degrade / fail / restore events on fabric and NIC links (failed fabric links reroute
    flows); about half the cases add interval compute slowdowns (trace/slowdowns.py), drawn
    from their own generator so the DAG and the events stay what they were."""
    rng = random.Random(seed)
    servers = rng.choice([2, 3, 4])
    gpn = rng.choice([2, 4])
    groups = [("h", "H100", servers, gpn)]
    if rng.random() < 0.5:
        groups.append(("a", "A100", rng.choice([1, 2]), gpn))
    scale_out = ScaleOut(nodes_per_leaf=rng.choice([1, 2]),
                         oversubscription=rng.choice([1.0, 2.0, 4.0]))
    plan = make_plan(groups, scale_out)
    topo = build_topology(plan)
    names = topo.nodes["name"].astype(str).to_numpy()
    lk = topo.links
    wires = [(names[s], names[d]) for s, d in zip(lk["src"], lk["dst"], strict=True)]
    events = []
    for _ in range(rng.choice([0, 0, 1, 3, 6])):
        src, dst = rng.choice(wires)
        at = rng.uniform(0, 400.0)
        kind = rng.choice(["degrade", "fail", "restore"])
        factor = rng.choice([0.25, 0.5]) if kind == "degrade" else 1.0
        events.append(LinkEvent(at_us=at, kind=kind, src=src, dst=dst, factor=factor))
        if kind == "fail" and rng.random() < 0.8:  # mostly restored, sometimes stuck
            events.append(LinkEvent(at_us=at + rng.uniform(1, 200), kind="restore",
                                    src=src, dst=dst))
    srng = random.Random(seed + 1_000_000)  # what-if draws: the ones above stay as they were
    fabric = [w for w, t in zip(wires, lk["tier"], strict=True) if t == "fabric"]
    if fabric and srng.random() < 0.5:  # a switch link that fails for good: flows reroute
        src, dst = srng.choice(fabric)
        events.append(LinkEvent(at_us=srng.uniform(0, 300.0), kind="fail", src=src, dst=dst))
    if events:
        topo = build_topology(make_plan(groups, scale_out, events=tuple(events)))
    n = topo.num_ranks
    tb = TraceBuilder(n)
    ops: list[int] = []
    for _ in range(rng.randint(20, 160)):
        deps = rng.sample(ops, k=min(len(ops), rng.choice([0, 1, 1, 2, 3])))
        r = rng.random()
        if r < 0.3:
            op = tb.compute(rng.randrange(n), rng.choice([0, 500, 1000, rng.randint(1, 90_000)]),
                            deps=deps)
        elif r < 0.75:
            src = rng.randrange(n)
            dst = src if rng.random() < 0.05 else rng.randrange(n)
            size = rng.choice([0, 1000, 1 << 20, rng.randint(1, 8 << 20)])
            op = tb.flow(src, dst, size, deps=deps)
        elif r < 0.9:
            delay = rng.choice([0, 0, 7000])  # plain join or a timed (NCCL-cost) barrier
            op = tb.add(KIND_BARRIER, -1, phase="dp", deps=deps, duration_ns=delay)
        else:
            ranks = rng.sample(range(n), k=rng.randint(2, min(n, 8)))
            ops.extend(ring_all_reduce(tb, ranks, rng.choice([1 << 16, 4 << 20]),
                                       ready=rng.choice(ops) if ops else ()))
            continue
        ops.append(op)
    trace = tb.build()
    if srng.random() < 0.5:  # throttling windows, some overlapping, some open-ended
        trace.manifest["compute_slowdowns"] = [
            {"ranks": srng.sample(range(n), k=srng.randint(1, n)),
             "factor": srng.choice([0.5, 1.5, 2.0, 3.0]),
             "from_ns": srng.uniform(0, 300_000.0), "until_ns": None}
            for _ in range(srng.randint(1, 3))
        ]
        for rec in trace.manifest["compute_slowdowns"]:
            if srng.random() < 0.7:
                rec["until_ns"] = rec["from_ns"] + srng.uniform(1.0, 200_000.0)
    return trace, topo


@functools.cache
def _random_outcome(seed: int) -> tuple[dict, dict]:
    return _same_timeline(*_random_case(seed))


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_random_dags_give_the_same_timeline(seed: int) -> None:
    _random_outcome(seed)


@needs_native
def test_random_cases_cover_stuck_runs_and_contention() -> None:
    """The random cases above are not all easy: some get stuck on a failed link (both engines
    must then raise the same message) and some solve groups of many flows."""
    stuck = contended = rerouted = slowed = 0
    for seed in range(40):
        py, _ = _random_outcome(seed)
        stuck += not py
        contended += bool(py) and py["max_active_flows"] >= 8
        rerouted += bool(py) and py["reroutes"] > 0
        slowed += "compute_slowdowns" in _random_case(seed)[0].manifest
    assert stuck >= 1 and contended >= 10 and rerouted >= 3 and slowed >= 10


def _flows_on_links(rng: np.random.Generator, n_links: int, n_flows: int, max_len: int):
    flows = [rng.choice(n_links, size=int(rng.integers(1, min(max_len, n_links) + 1)),
                        replace=False).tolist() for _ in range(n_flows)]
    off = np.zeros(n_flows + 1, dtype=np.int64)
    np.cumsum([len(f) for f in flows], out=off[1:])
    return flows, off, np.asarray([x for f in flows for x in f], dtype=np.int32)


@needs_native
def test_native_water_filling_matches_both_python_forms() -> None:
    """Small systems (the per-entry form) and big ones (the numpy form) alike: the same rates."""
    import xsim_flowcore

    rng = np.random.default_rng(11)
    big = 0
    for i in range(120):
        n_links = int(rng.integers(1, 40))
        cap = rng.choice([0.0, 1.0, 2.0, 3.5, 50.0], size=n_links)
        n_flows = int(rng.integers(1, 30)) if i % 3 else int(rng.integers(100, 200))
        flows, off, links = _flows_on_links(rng, n_links, n_flows, 4)
        big += len(links) > SMALL_ENTRIES
        ref = maxmin_rates(flows, cap.tolist())
        got = xsim_flowcore.maxmin(off, links, cap)
        np.testing.assert_allclose(got, ref, rtol=REL, atol=0.0)
    assert big >= 20  # the numpy form was exercised


@needs_native
def test_native_water_filling_textbook_and_bad_input() -> None:
    import xsim_flowcore

    rates = xsim_flowcore.maxmin(np.array([0, 1, 2, 4]), np.array([1, 2, 1, 2], np.int32),
                                 np.array([0.0, 1.0, 2.0]))
    assert rates.tolist() == [0.5, 1.5, 0.5]
    with pytest.raises(ValueError, match="link id out of range: 3"):
        xsim_flowcore.maxmin(np.array([0, 1]), np.array([3], np.int32), np.array([1.0]))


def _shipped(name: str):
    plan = load_plan(WORKLOADS / name)
    return generate(plan), build_topology(plan)


SMALL_PLANS = sorted(p.name for p in WORKLOADS.glob("*.yaml")
                     if p.name not in ("hetero-dp-h100-a100.yaml", "llama2-70b-1024gpu.yaml"))


@needs_native
@pytest.mark.parametrize("name", plan_params(SMALL_PLANS))
def test_shipped_plans_give_the_same_timeline(name: str) -> None:
    trace, topo = _shipped(name)
    py, nat = _same_timeline(trace, topo)
    assert py["events"] > trace.num_ops  # a real run, not an error
    assert nat["events_per_s"] > py["events_per_s"]


@needs_native
@pytest.mark.slow
def test_big_shipped_plan_gives_the_same_timeline() -> None:
    """880 k ops; the Python engine takes tens of seconds on the shared CI machine. The
    1,024-GPU plan is measured by benchmarks/bench_flow.py instead."""
    trace, topo = _shipped("hetero-dp-h100-a100.yaml")
    _same_timeline(trace, topo)


def test_every_small_shipped_plan_is_cross_checked() -> None:
    assert len(SMALL_PLANS) >= 6 and "congested-incast-slow-nic.yaml" in SMALL_PLANS


@needs_native
def test_native_progress_errors_and_dtype_flexibility() -> None:
    trace, topo = _tiny()
    calls: list[tuple[int, int]] = []
    tl = FlowBackend().run(trace, topo, {"engine": "native", "progress":
                                         lambda d, t: calls.append((d, t))})
    assert calls[-1] == (trace.num_ops, trace.num_ops) and tl.stats["sim_cpu_s"] >= 0
    # an exception in the callback stops the run and reaches the caller
    def boom(done: int, total: int) -> None:
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        FlowBackend().run(trace, topo, {"engine": "native", "progress": boom})
    problem, _ = build_problem(trace, topo)
    ref = run_flows_native(problem)
    problem.pred = problem.pred.astype(np.int32)  # narrow edge ids are taken as they are
    problem.succ = problem.succ.astype(np.int32)
    assert np.array_equal(run_flows_native(problem).end_ns, ref.end_ns)
    problem.succ = problem.succ.astype(np.int64) + 10
    with pytest.raises(BackendError, match=r"^flow: deps reference op 11 but the trace has 2 ops"):
        run_flows_native(problem)


def test_engine_option_is_checked_and_reported() -> None:
    trace, topo = _tiny()
    with pytest.raises(OptionError, match="engine: must be one of native, python"):
        FlowBackend().run(trace, topo, {"engine": "fast"})
    tl = FlowBackend().run(trace, topo, {"engine": "python"})
    assert tl.stats["engine"] == "python"
    # 4.5 MB over one 450 GB/s NVLink hop pair after 1 us of compute: 1000 + 10000 + 1000 ns
    assert float(tl.frame["end_ns"].iloc[1]) == pytest.approx(12_000.0, rel=1e-12)


def test_native_requested_without_the_core_is_a_one_line_error(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "xsim_flowcore", None)  # import fails as if not installed
    assert native_status()[0] is False
    trace, topo = _tiny()
    with pytest.raises(BackendError) as err:
        FlowBackend().run(trace, topo, {"engine": "native"})
    msg = str(err.value)
    assert msg.startswith("flow: engine native: the compiled flow core xsim_flowcore is not")
    assert INSTALL_HINT in msg and "\n" not in msg
    assert FlowBackend.available({"engine": "native"}) == (False, msg[len("flow: "):])
    assert FlowBackend.available({"engine": "python"}) == (True, "")
    # without the option the backend falls back to the reference and says so
    assert FlowBackend().run(trace, topo, {}).stats["engine"] == "python"


def test_readme_install_command_and_ci_install_the_core() -> None:
    root = WORKLOADS.parent
    install = [ln for ln in (root / "README.md").read_text().splitlines()
               if ln.startswith("python -m pip install -e \".[test")]
    ci = [ln for ln in (root / ".ci" / "run").read_text().splitlines() if "pip install" in ln]
    assert install and "./plugins/flowcore" in install[0].split("&&")[0]
    assert ci and "./plugins/flowcore" in ci[0]
    assert (root / "plugins" / "flowcore" / "pyproject.toml").read_text().count(
        "scikit_build_core.build") == 1
