"""Progress: the backend hook (ReplayProgress), the tqdm bar, and the labels `xsim run` and
`xsim compare` show while a backend replays."""

from __future__ import annotations

import io
import re
import sys
import time
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
from helpers.topo import TraceBuilder, ring_allreduce
from test_flow_backend import two_servers

import xsim_adapters as xs
from xsim_adapters import cli
from xsim_adapters.backends import registry
from xsim_adapters.backends.base import ReplayProgress, flow_totals
from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.report import progress as progress_mod
from xsim_adapters.report.progress import ProgressBar

#: 8 GPUs on two servers (TP and PP inside a server, DP across): flows inside a server and
#: across the fabric, a few hundred ops.
TWO_NODE_PLAN = """\
name: tiny-two-nodes
model: tiny-gpt
training: {global_batch: 4, micro_batch: 1, schedule: 1f1b}
device_groups:
  h100: {type: H100-80GB, nodes: 2, gpus_per_node: 4}
network:
  scale_out: {topology: leaf_spine, link_gbps: 400, latency_us: 1.0}
replicas:
  uniform: {group: h100, tp: 2, pp: 2, dp: 2}
"""


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(TWO_NODE_PLAN)
    return p


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def frames(text: str) -> list[str]:
    """The successive drawings of a bar (tqdm redraws with a carriage return)."""
    return [f.rstrip() for f in re.split(r"[\r\n]", text) if f.strip()]


def labels(text: str) -> list[str]:
    """The distinct labels a bar showed, in order, without the simulated time."""
    shown = [re.sub(r", sim .*$", "", f.split("], ", 1)[1]) for f in frames(text) if "], " in f]
    return list(dict.fromkeys(shown))


def test_bar_silent_unless_tty_or_forced(monkeypatch) -> None:
    monkeypatch.delenv("XSIM_PROGRESS", raising=False)
    quiet = _Stream(tty=False)
    with ProgressBar(4, "run", stream=quiet) as bar:
        bar.step("a")
    assert quiet.getvalue() == "" and bar.labels == ["a", "done"]
    tty = _Stream(tty=True)
    with ProgressBar(2, "run", stream=tty) as bar:
        bar.step("first")
        bar.step("second")
        assert bar.render().startswith("run  50%|")
    last = frames(tty.getvalue())[-1]
    assert last.startswith("run 100%|") and "2.0/2 steps" in last and last.endswith(", done")
    assert tty.getvalue().endswith("\n")
    forced = _Stream(tty=False)
    with ProgressBar(1, "f", stream=forced, force=True):
        pass
    assert "f 100%|" in forced.getvalue()
    monkeypatch.setenv("XSIM_PROGRESS", "0")
    off = _Stream(tty=True)
    with ProgressBar(1, "f", stream=off):
        pass
    assert off.getvalue() == ""
    with ProgressBar(1, "f", stream=off, force=True):  # the flag wins over the environment
        pass
    assert off.getvalue() != ""


def test_labels_are_never_throttled_away_numbers_are() -> None:
    s = _Stream(tty=True)
    with ProgressBar(4, "x", stream=s, min_interval_s=1000.0) as bar:
        bar.step("loading")
        bar.set_label("generating")
        bar.step("building")
        hook = bar.replay_hook("flow")
        for d in range(0, 101):
            hook(d, 100, sim_ns=d * 1e6)
        bar.step("writing")
    shown = [f.split("], ", 1)[1] for f in frames(s.getvalue()) if "], " in f]
    order = ["loading", "generating", "building", "running flow",
             "running flow: 100/100 ops, sim 100 ms", "writing", "done"]
    assert [x for x in dict.fromkeys(shown)] == order
    # under a 1000 s throttle no intermediate count is drawn
    assert not any(re.search(r": [1-9]\d?/100 ops", f) for f in shown)
    assert bar.labels == ["loading", "generating", "building", "running flow", "writing", "done"]


def test_replay_hook_moves_inside_its_step() -> None:
    bar = ProgressBar(4, "x", force=False)
    bar.step("a")
    hook = bar.replay_hook("ns3")
    assert bar.done == 1.0
    hook(50, 200)
    assert bar.done == pytest.approx(1.25)
    hook(200, 200)
    assert bar.done == pytest.approx(2.0)
    bar.step("b")
    assert bar.done == 2.0
    bar.close()
    assert bar.done == 4.0


def test_replay_progress_throttles_but_keeps_start_end_and_order(monkeypatch) -> None:
    calls: list[tuple[int, int]] = []
    rp = ReplayProgress(lambda d, t: calls.append((d, t)), 10, interval_s=1000.0)
    rp.start()
    for d in (3, 2, 7):  # a decrease is clamped
        rp.update(d)
    rp.finish()
    rp.finish()  # only once
    assert calls == [(0, 10), (10, 10)]
    with_sim: list[tuple[int, int, float | None]] = []
    rp = ReplayProgress(lambda d, t, sim_ns=None: with_sim.append((d, t, sim_ns)), 4,
                        interval_s=0.0)
    rp.start()
    rp.update(3, 5.0)
    rp.update(1, 6.0)
    rp.update(4, 9.0)  # reaching the total ends it
    rp.finish(10.0)
    assert with_sim == [(0, 4, 0.0), (3, 4, 5.0), (3, 4, 6.0), (4, 4, 9.0)]
    ReplayProgress(None, 3).finish()  # no hook: nothing to do


@pytest.mark.parametrize("engine", ["python", "native"])
def test_flow_backend_reports_monotone_progress_reaching_total(engine: str) -> None:
    tb = TraceBuilder(8)
    ring_allreduce(tb, list(range(8)), 8_000_000)
    trace = tb.build()
    calls: list[tuple[int, int, float]] = []
    tl = FlowBackend().run(trace, two_servers(), {
        "engine": engine, "progress": lambda d, t, sim_ns=None: calls.append((d, t, sim_ns))})
    done = [c[0] for c in calls]
    # the compiled core reports ops only; the simulated time comes with the last call
    sims = [c[2] for c in calls if c[2] is not None]
    assert engine == "native" or len(sims) == len(calls)
    assert calls[0][:2] == (0, trace.num_ops)
    assert calls[-1][:2] == (trace.num_ops, trace.num_ops)
    assert done == sorted(done) and sims == sorted(sims)
    assert all(t == trace.num_ops for _, t, _ in calls)
    assert calls[-1][2] == pytest.approx(tl.makespan_ns)
    # run info: the flow backend times every flow with its fluid model
    flows, nbytes = flow_totals(trace)
    assert flows == 8 * 2 * 7 and nbytes == 8 * 2 * 7 * 1_000_000
    assert (tl.stats["fluid_flows"], tl.stats["fluid_bytes"]) == (flows, nbytes)
    assert (tl.stats["packet_flows"], tl.stats["packet_bytes"]) == (0, 0)
    st = tl.stats
    assert st["startup_s"] > 0 and st["replay_s"] > 0
    assert st["startup_s"] + st["replay_s"] <= st["wall_s"]


class Chatty(FlowBackend):
    """The flow backend under another name, reporting through the hook with no throttle."""

    name = "chatty"

    def run(self, trace, topology, options):
        hook = options.get("progress")
        rp = ReplayProgress(hook, trace.num_ops, interval_s=0.0)
        rp.start()
        for k in (1, 2, 3):
            rp.update(k * trace.num_ops // 4, sim_ns=k * 1e6)
            time.sleep(0.01)
        tl = super().run(trace, topology, {**options, "progress": None})
        rp.finish(tl.makespan_ns)
        return tl


@pytest.fixture
def fake_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xsim_test_chatty", sys.modules[__name__])
    eps = metadata.EntryPoints([
        metadata.EntryPoint("flow", "xsim_adapters.backends.flow:FlowBackend", registry.GROUP),
        metadata.EntryPoint("chatty", "xsim_test_chatty:Chatty", registry.GROUP),
    ])
    monkeypatch.setattr(registry.metadata, "entry_points", lambda **kw: eps)


def test_run_shows_every_label_in_order_despite_the_throttle(
        fake_backends, monkeypatch, tmp_path: Path, plan_file: Path, capsys) -> None:
    monkeypatch.setattr(progress_mod, "MIN_INTERVAL_S", 1000.0)  # numbers would never redraw
    out = tmp_path / "out"
    assert cli.main(["run", str(plan_file), "--backend", "chatty", "-o", str(out), "--no-plots",
                     "--progress"]) == 0
    shown = labels(capsys.readouterr().err)
    n = xs.read_trace(out / "trace").num_ops
    want = ["loading the input", "generating the trace", "building the topology",
            "running chatty", f"running chatty: {n:,}/{n:,} ops", "computing metrics",
            "writing outputs", "done"]
    assert shown == want


def test_quiet_draws_nothing(fake_backends, tmp_path: Path, plan_file: Path, capsys) -> None:
    assert cli.main(["run", str(plan_file), "--backend", "chatty", "-o", str(tmp_path / "o"),
                     "--no-plots", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_compare_moves_through_each_backend_and_reports_run_info(
        fake_backends, tmp_path: Path, plan_file: Path, capsys) -> None:
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(plan_file), "--backends", "flow,chatty", "-o", str(out),
                     "--progress"]) == 0
    cap = capsys.readouterr()
    shown = labels(cap.err)
    trace = xs.read_trace(out / "trace")
    n = trace.num_ops
    for label in ("running flow", f"running flow: {n:,}/{n:,} ops", "running chatty",
                  f"running chatty: {n:,}/{n:,} ops", "writing outputs", "done"):
        assert label in shown
    assert shown.index("running flow") < shown.index("running chatty") < shown.index("done")
    # the bar is at 3/5 steps after flow's replay and 4/5 after chatty's: one step each
    steps = [re.search(r"(\d\.\d)/5 steps\s*\[[^]]*\], (.*?)(, sim .*)?$", f)
             for f in frames(cap.err)]
    at = {m.group(2): float(m.group(1)) for m in steps if m}
    assert at[f"running flow: {n:,}/{n:,} ops"] == 3.0
    assert at[f"running chatty: {n:,}/{n:,} ops"] == 4.0
    # packets vs fluid, start-up vs replay: written and printed, conserving the trace's totals
    info = pd.read_csv(out / "compare_runs.csv")
    flows, nbytes = flow_totals(trace)
    assert list(info["backend"]) == ["flow", "chatty"]
    assert (info["packet_flows"] + info["fluid_flows"] == flows).all()
    assert (info["packet_bytes"] + info["fluid_bytes"] == nbytes).all()
    assert (info["fluid_bytes_pct"] == 100.0).all()
    assert (info["startup_s"] > 0).all() and (info["replay_s"] > 0).all()
    assert (info["startup_s"] + info["replay_s"] <= info["wall_s"]).all()
    assert f"flow: packets 0 of {flows:,} flows, 0 B; fluid {flows:,} flows" in cap.out
