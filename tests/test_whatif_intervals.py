"""Interval compute slowdowns (``perturb.slow`` with ``from_us`` / ``until_us``): the plan
section, the manifest record and the flow backend's two engines against closed forms. The
packet backends' closed forms are in test_whatif_packet.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_whatif_perturb import PLAN

from xsim_adapters import api
from xsim_adapters.errors import PlanError, TraceError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.testing import handmade
from xsim_adapters.trace.schema import KIND_COMPUTE
from xsim_adapters.trace.slowdowns import schedule, stretched_end
from xsim_adapters.trace.validate import validate_trace
from xsim_adapters.workload.generate import plan_digest

ENGINES = ("python", "native")


def _plan(slow):
    d = copy.deepcopy(PLAN)
    d["perturb"] = {"slow": slow}
    return d


def test_interval_entries_leave_the_ops_alone_and_go_to_the_manifest():
    plain = plan_from_dict(copy.deepcopy(PLAN))
    plan = plan_from_dict(_plan([{"rank": 2, "factor": 2.0, "from_us": 100, "until_us": 300},
                                 {"server": 0, "factor": 1.5, "from_us": 50}]))
    t0, t1 = api.generate(plain), api.generate(plan)
    assert t0.ops.equals(t1.ops) and t0.deps.equals(t1.deps)
    assert "compute_slowdowns" not in t0.manifest
    assert t1.manifest["compute_slowdowns"] == [
        {"ranks": [2], "factor": 2.0, "from_ns": 100_000.0, "until_ns": 300_000.0},
        {"ranks": [0, 1, 2, 3], "factor": 1.5, "from_ns": 50_000.0, "until_ns": None},
    ]
    assert plan_digest(plan) != plan_digest(plain)
    assert plan_from_dict(plan_to_dict(plan)) == plan  # round trip keeps the windows


def test_whole_iteration_entries_are_unchanged_by_the_new_keys():
    """A ``slow`` entry without a window is what it was: the same trace and digest."""
    a = plan_from_dict(_plan([{"rank": 3, "factor": 1.1}]))
    assert "from_us" not in plan_to_dict(a)["perturb"]["slow"][0]
    assert "compute_slowdowns" not in api.generate(a).manifest


@pytest.mark.parametrize(("entry", "where", "what"), [
    ({"rank": 0, "factor": 2, "from_us": -1}, "perturb.slow[0].from_us",
     "expected a number in [0, 1e+12] (got -1)"),
    ({"rank": 0, "factor": 2, "from_us": 10, "until_us": 10}, "perturb.slow[0].until_us",
     "expected a time after from_us (10 us) (got 10)"),
    ({"rank": 0, "factor": 2, "until_us": 0}, "perturb.slow[0].until_us",
     "expected a number in (0, 1e+12] (got 0)"),
    ({"rank": 0, "factor": 2, "from_us": "soon"}, "perturb.slow[0].from_us", "'soon'"),
])
def test_bad_windows_name_the_field(entry, where, what):
    with pytest.raises(PlanError) as e:
        plan_from_dict(_plan([entry]))
    assert str(e.value).startswith(where) and what in str(e.value)


def test_schedule_multiplies_overlaps_and_merges_equal_neighbours():
    m = {"compute_slowdowns": [
        {"ranks": [0], "factor": 2.0, "from_ns": 0.0, "until_ns": 200.0},
        {"ranks": [0, 1], "factor": 1.5, "from_ns": 50.0, "until_ns": 100.0},
        {"ranks": [1], "factor": 1.5, "from_ns": 100.0, "until_ns": None},
        {"ranks": [2], "factor": 2.0, "from_ns": 0.0, "until_ns": 10.0},
        {"ranks": [2], "factor": 0.5, "from_ns": 0.0, "until_ns": 10.0},  # cancels out
    ]}
    s = schedule(m, 3)
    assert s.offsets.tolist() == [0, 3, 4, 4]
    assert s.lo_ns.tolist() == [0.0, 50.0, 100.0, 50.0]
    assert s.hi_ns.tolist()[:3] == [50.0, 100.0, 200.0] and np.isinf(s.hi_ns[3])
    assert s.factor.tolist() == [2.0, 3.0, 2.0, 1.5]


def test_stretched_end_closed_forms():
    lo, hi, f = [50.0, 100.0], [100.0, 200.0], [2.0, 3.0]
    assert stretched_end(0.0, 40.0, lo, hi, f, 0, 2) == 40.0  # ends before the window
    assert stretched_end(0.0, 100.0, lo, hi, f, 0, 2) == 50.0 + 25.0 * 2 + 25.0 * 3
    # through both segments and out at full speed: 50 + 25 + 33.33 of work by t = 200
    assert stretched_end(0.0, 150.0, lo, hi, f, 0, 2) == pytest.approx(200.0 + 150 - 50
                                                                         - 25 - 100 / 3)
    assert stretched_end(300.0, 10.0, lo, hi, f, 0, 2) == 310.0  # after every window


def _one_rank_trace(durations):
    tb = handmade.TraceBuilder(1)
    prev = ()
    ids = []
    for d in durations:
        op = tb.compute(0, d, deps=prev)
        prev = (op,)
        ids.append(op)
    return tb.build(), ids


def _star1():
    from helpers.htsim import star

    return star(1, 100.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kernel_straddling_the_window_start_closed_form(engine):
    """100 us of work from t = 0 on a rank that runs at half speed from 50 us: 50 us at full
    speed, then 50 us of work at half speed, ending at 150 us; the next kernel (20 us, wholly
    inside the window) takes 40 us."""
    trace, (a, b) = _one_rank_trace([100_000, 20_000])
    trace.manifest["compute_slowdowns"] = [
        {"ranks": [0], "factor": 2.0, "from_ns": 50_000.0, "until_ns": 1_000_000.0}]
    validate_trace(trace)
    tl = api.run(trace, "flow", _star1(), {"engine": engine})
    end = tl.frame.set_index("op_id")["end_ns"]
    assert end[a] == 150_000.0 and end[b] == 190_000.0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kernel_outliving_a_short_window_and_overlaps_multiplying(engine):
    """Windows [0, 30 us) x3 and [10 us, 20 us) x2 (x6 where both hold): by 30 us the kernel
    has done 10/3 + 10/6 + 10/3 = 8.33 us of work; the rest of its 100 us runs at full speed,
    so it ends at 30 + 91.67 = 121.67 us. The rank's other ranks' kernels are untouched."""
    trace, (a,) = _one_rank_trace([100_000])
    trace.manifest["compute_slowdowns"] = [
        {"ranks": [0], "factor": 3.0, "from_ns": 0.0, "until_ns": 30_000.0},
        {"ranks": [0], "factor": 2.0, "from_ns": 10_000.0, "until_ns": 20_000.0}]
    tl = api.run(trace, "flow", _star1(), {"engine": engine})
    got = float(tl.frame.set_index("op_id")["end_ns"][a])
    assert got == pytest.approx(30_000 + 100_000 - 10_000 / 3 - 10_000 / 6 - 10_000 / 3,
                                rel=1e-12)


def test_timed_barriers_and_flows_are_not_stretched():
    from xsim_adapters.trace.schema import KIND_BARRIER

    tb = handmade.TraceBuilder(2)
    bar = tb.add(KIND_BARRIER, 0, phase="dp", duration_ns=10_000)
    fl = tb.flow(0, 1, 125_000, deps=[bar])  # 10 us at 100 Gb/s, + 1 us latency
    trace = tb.build()
    trace.manifest["compute_slowdowns"] = [
        {"ranks": [0, 1], "factor": 4.0, "from_ns": 0.0, "until_ns": None}]
    from helpers.htsim import star

    tl = api.run(trace, "flow", star(2, 100.0), {})
    end = tl.frame.set_index("op_id")["end_ns"]
    assert end[bar] == 10_000.0 and end[fl] == 10_000.0 + 10_000.0 + 2 * 500.0


def test_a_window_on_the_bottleneck_stage_costs_half_its_length():
    """On the 4-stage pipeline the last stage (it also runs the LM head) computes without a
    pause from long before 100 ms to long after 150 ms, and every kernel of it is on the
    critical path. At half speed over [100, 150) ms it does 25 ms of work in those 50 ms, so
    everything after moves 25 ms later: the iteration grows by exactly 25 ms (to the float
    rounding of the stretched ends), all of it rank 3's extra compute."""
    base = plan_from_dict(copy.deepcopy(PLAN))
    t0 = api.run(base, trace=api.generate(base)).makespan_ns
    plan = plan_from_dict(_plan([{"rank": 3, "factor": 2.0, "from_us": 100_000,
                                  "until_us": 150_000}]))
    trace = api.generate(plan)
    tl = api.run(plan, trace=trace)
    assert tl.makespan_ns - t0 == pytest.approx(25_000_000, abs=1e-3)
    met = api.metrics(trace, tl)
    pert = met.summary["perturbation"]
    assert pert["extra_compute_ns_by_rank"] == {"3": 25_000_000}
    assert met.summary["critical_path"]["top_ranks"][0]["rank"] == 3


def test_bad_manifest_records_are_trace_errors():
    trace, _ = _one_rank_trace([10])
    trace.manifest["compute_slowdowns"] = [{"ranks": [1], "factor": 2.0, "from_ns": 0.0,
                                            "until_ns": None}]
    with pytest.raises(TraceError, match=r"compute_slowdowns\[0\]\.ranks: expected a non-empty"):
        validate_trace(trace)
    trace.manifest["compute_slowdowns"] = [{"ranks": [0], "factor": 2.0, "from_ns": 5.0,
                                            "until_ns": 5.0}]
    with pytest.raises(TraceError, match=r"compute_slowdowns\[0\]\.until_ns"):
        validate_trace(trace)
    assert KIND_COMPUTE == 0


def test_exporters_refuse_a_trace_with_windows(tmp_path):
    """GOAL and Chakra hold fixed durations: exporting would drop the windows silently."""
    from xsim_adapters.errors import XsimError
    from xsim_adapters.trace.export_goal import export_goal

    trace, _ = _one_rank_trace([10])
    trace.manifest["compute_slowdowns"] = [{"ranks": [0], "factor": 2.0, "from_ns": 0.0,
                                            "until_ns": None}]
    with pytest.raises(XsimError, match=r"export goal: the trace has interval compute "
                                        r"slowdowns .* cannot express"):
        export_goal(trace, tmp_path / "t.goal")
    del trace.manifest["compute_slowdowns"]
    assert export_goal(trace, tmp_path / "t.goal").is_file()
