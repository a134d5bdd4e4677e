"""The ns-3 backend: prepares the replay, runs it in a worker process, reads the timeline back."""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from xsim_adapters.backend_api import (
    KINDS,
    PHASES,
    Backend,
    BackendError,
    BackendUnavailable,
    ReplayProgress,
    Timeline,
    Topology,
    Trace,
    child_preexec,
    compute_bound_ns,
    flow_totals,
    owned_tempdir,
    refuse_connection_limit,
)

from ._options import OPTIONS, parse_options
from ._prepare import prepare
from ._queues import queue_frame
from ._sim import PROGRESS_FD_ENV

INSTALL_HINT = "install the official ns-3 wheel with `pip install ns3` (ns-3 3.44 or later)"
# Lines cppyy prints on every import of the wheel; they are not errors.
_NOISE = ("[runStaticInitializersOnce]",)
TMP_PREFIX = "xsim-ns3-"  # temporary directories: <tmp>/xsim-ns3-<pid>-XXXXXXXX
_STDERR_TAIL = 2000  # characters of the worker's stderr carried into an error message


def _ns_import_problem() -> str | None:
    """Why ``ns`` (the ns-3 wheel) and ``cppyy`` cannot be imported, or None if they can.

    Uses module specs only: really importing ns-3 takes ~10 s and loads 500 MB of libraries,
    which the parent process never needs (the worker imports it).
    """
    for name in ("ns", "cppyy"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if spec is None:
            return f"ModuleNotFoundError: No module named '{name}'"
    return None


def _stderr_text(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(_NOISE)]
    # After a crash cppyy prints a long gdb backtrace; ns-3's own message (an NS_ASSERT or
    # NS_FATAL line) comes before it. Without one, keep the signal and the named frames.
    for i, ln in enumerate(lines):
        if "*** Break ***" in ln:
            frames = [f.split(" in ", 1)[-1] for f in lines[i:] if "ns3::" in f or "xsim" in f]
            lines = lines[:i] + [ln.strip()] + frames[:6]
            break
    return "\n".join(lines)[-_STDERR_TAIL:]


def describe_ops(trace: Trace, op_ids: np.ndarray, limit: int = 5) -> str:
    """``op 12 (flow rank 3->4, phase dp, 1048576 B)``-style descriptions of the first ops."""
    ops = trace.ops
    parts = []
    for op in op_ids[:limit]:
        r = ops.iloc[int(op)]
        kind = KINDS[int(r["kind"])]
        phase = PHASES[int(r["phase"])] if 0 <= int(r["phase"]) < len(PHASES) else r["phase"]
        if kind == "flow":
            what = f"flow rank {int(r['rank'])}->{int(r['dst'])}, {int(r['bytes'])} B"
        elif kind == "compute":
            what = f"compute rank {int(r['rank'])}, {int(r['duration_ns'])} ns"
        else:
            what = f"barrier rank {int(r['rank'])}"
        parts.append(f"op {int(op)} ({what}, phase {phase})")
    more = len(op_ids) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class Ns3Backend(Backend):
    """Packet-level replay on the official ns-3 wheel (options: ``_options.OPTIONS``, listed by
    ``xsim backends``; see docs/ns3.md)."""

    name = "ns3"
    options = OPTIONS

    @classmethod
    def available(cls) -> tuple[bool, str]:
        problem = _ns_import_problem()
        if problem is None:
            return True, ""
        return False, f"ns3 backend: the ns-3 Python wheel is not importable ({problem}); " + (
            INSTALL_HINT
        )

    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology`` in ns-3; times in ns; raise BackendError on failure."""
        opts = parse_options(options)
        refuse_connection_limit(self.name, topology.connection_limit)
        if getattr(topology, "transport", None) is not None:
            # not silently ignored: ns-3's RoCE NIC / PFC model is issue 28 item 3
            raise BackendError("ns3: network.transport (PFC, ECN, DCQCN, HPCC) is not modelled"
                               " on this backend yet; run htsim, or remove the section"
                               " (docs/transport.md)")
        ok, why = self.available()
        if not ok:
            raise BackendUnavailable(why)
        t0 = time.perf_counter()
        rin = prepare(trace, topology, opts)
        prepare_s = time.perf_counter() - t0
        # Named with this pid and stamped: one left by a SIGKILLed run is removed next time.
        with owned_tempdir(TMP_PREFIX) as work:
            (work / "in").mkdir()
            (work / "out").mkdir()
            (work / "cwd").mkdir()  # clean directory for the wheel's *.so glob
            np.savez(work / "in" / "input.npz", allow_pickle=True, **rin.arrays)  # numpy's default
            (work / "in" / "meta.json").write_text(json.dumps(rin.meta))
            # simulated time against the busiest GPU's compute: it keeps moving while the
            # last large flows hold the op count still (issue 31: 94% of ops after 18 s, then
            # minutes without a change)
            rp = ReplayProgress((options or {}).get("progress"), trace.num_ops,
                                expected_sim_ns=compute_bound_ns(trace))
            stats, replay_started = self._spawn(work, opts.wall_limit_s, rp)
            with np.load(work / "out" / "result.npz") as z:
                start, end = z["start_ns"], z["end_ns"]
                queues = {k[len("queue_"):]: z[k] for k in z.files if k.startswith("queue_")}
        unfinished = np.flatnonzero(~np.isfinite(end))
        if stats.get("engine_error"):
            raise BackendError(f"ns3: {stats['engine_error']}")
        if len(unfinished):
            limit = opts.sim_limit_ns
            cause = (
                f"the simulated-time limit sim_limit_ns={limit:g} was reached"
                if limit and stats["sim_time_ns"] >= limit
                else "the event queue ran dry (lost packets with transport=udp, which never"
                " resends them: a queue overflow, or a link that failed with packets on it;"
                " or a dependency cycle)"
            )
            raise BackendError(
                f"ns3: replay stalled at t={stats['sim_time_ns']} ns: {len(unfinished)} of"
                f" {len(end)} ops never completed; {cause}; first: "
                + describe_ops(trace, unfinished)
            )
        frame = pd.DataFrame(
            {"op_id": np.arange(len(end), dtype=np.int64), "start_ns": start, "end_ns": end}
        )
        rp.finish(float(stats["sim_time_ns"]))
        wall = time.perf_counter() - t0
        stats.update(rin.meta)
        stats.pop("options", None)
        # Start-up: preparing the arrays, starting the worker, loading ns-3 (~2.3 CPU s for
        # the engine's modules), building the network and loading the DAG, up to the engine's
        # first progress line; replay: the engine's Simulator::Run, timed in the worker.
        if replay_started is not None:
            startup = replay_started - t0
        else:  # no line arrived (a replay of no ops): the parts the worker timed
            startup = prepare_s + float(stats["import_s"]) + float(stats["build_s"])
        stats.update(
            wall_s=wall,
            prepare_s=prepare_s,
            startup_s=min(startup, wall - float(stats["run_s"])),
            replay_s=float(stats["run_s"]),
            transport=opts.transport,
            scale_up=opts.scale_up,
        )
        flows, nbytes = flow_totals(trace)
        if (stats["packet_flows"] + stats["fluid_flows"], stats["packet_bytes"]
                + stats["fluid_bytes"]) != (flows, nbytes):
            raise BackendError(f"ns3: packet and fluid flows do not add up to the trace's"
                               f" {flows} flows and {nbytes} bytes (internal error)")
        tl = Timeline(backend=self.name, frame=frame, stats=stats,
                      link_stats=queue_frame(rin.arrays, queues))
        tl.check_complete(trace)
        return tl

    @staticmethod
    def _spawn(work: Path, wall_limit_s: float, rp: ReplayProgress) -> tuple[dict[str, Any],
                                                                             float | None]:
        """Run the worker, relaying its progress lines to ``rp``; return its stats and the
        ``time.perf_counter()`` at which its replay started (its first progress line; None if
        it sent none), or raise BackendError with its own message."""
        err_path = work / "stderr.txt"
        env = dict(os.environ)
        # The worker must import this package and the core from anywhere.
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "xsim_ns3.worker", str(work / "in"), str(work / "out")]
        # The engine writes "progress <done> <n> <sim ns>" lines into this pipe during the run.
        r, w = os.pipe()
        env[PROGRESS_FD_ENV] = str(w)
        started: float | None = None
        with open(err_path, "wb") as err, open(work / "stdout.txt", "wb") as out:
            try:
                # Own process group (killed whole on timeout), SIGKILL when this process dies.
                proc = subprocess.Popen(
                    cmd, cwd=work / "cwd", stdout=out, stderr=err, env=env,
                    start_new_session=True, preexec_fn=child_preexec(), pass_fds=(w,),
                )
            finally:
                os.close(w)
            try:
                with os.fdopen(r, "rb", buffering=0) as pipe:
                    started = _relay_progress(pipe, proc, time.monotonic() + wall_limit_s, rp)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise BackendError(
                    f"ns3: replay exceeded wall_limit_s={wall_limit_s:g} s and was stopped; no"
                    " partial timeline is returned (raise wall_limit_s, use transport=udp or"
                    " scale_up=fluid to make it cheaper)"
                ) from None
            except BaseException:  # Ctrl-C, SIGTERM: the worker must not run on
                _kill_group(proc)
                raise
        if rc != 0:
            how = f"exited with status {rc}"
            if rc < 0:
                how = f"was killed by {signal.Signals(-rc).name}"
            msg = _stderr_text(err_path) or "(no message on stderr)"
            raise BackendError(f"ns3: the ns-3 worker {how}: {msg}")
        stats_path = work / "out" / "stats.json"
        if not stats_path.exists():
            raise BackendError(
                "ns3: the ns-3 worker exited without writing results: "
                + (_stderr_text(err_path) or "(no message on stderr)")
            )
        return json.loads(stats_path.read_text()), started


def _relay_progress(pipe: Any, proc: subprocess.Popen, deadline: float,
                    rp: ReplayProgress) -> float | None:
    """Read progress lines from ``pipe`` until the worker closes it, calling ``rp.update``;
    then wait for the worker. Returns the perf_counter time of the first line (the replay's
    start) or None. Raises subprocess.TimeoutExpired at ``deadline`` (time.monotonic)."""
    started: float | None = None
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            if not sel.select(timeout=min(left, 1.0)):
                rp.tick()  # nothing new for 1 s: redraw, so the bar's elapsed clock moves
                continue
            chunk = pipe.read(65536)
            if not chunk:  # the worker exited (or closed its end)
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                parts = line.split()
                if len(parts) == 4 and parts[0] == b"progress":
                    if started is None:
                        started = time.perf_counter()
                    rp.update(int(parts[1]), float(parts[3]))
    proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
    return started
