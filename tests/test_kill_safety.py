"""Kills at any instant: `xsim run` over an existing OUT leaves the old run or the new one, whole;
no temporary survives the next run; children (sweep workers, the ns-3 worker) die with xsim.

Processes are scanned through /proc (Linux only), no psutil.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO
from test_output_paths import tiny_plans

from xsim_adapters import cli

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "plugins" / "ns3"), str(REPO / "plugins" / "htsim")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _xsim(*args: str, log: Path) -> subprocess.Popen:
    """``xsim ARGS`` in a subprocess; stdout and stderr go to ``log`` (a file, not a pipe: an
    orphaned child holding a pipe would make reading it hang instead of failing the test)."""
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "xsim_adapters.cli", *args], env=_env(),
                                stdout=fh, stderr=subprocess.STDOUT)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return None if state in ("Z", "X") else (state, int(ppid))


def _descendants(root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))):
            kids.setdefault(st[1], []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    alive = {p for p in pids if _stat(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {p for p in alive if _stat(p)}
    return alive


def _which_run(out: Path, plots: bool = True) -> str:
    """'tiny-a' or 'tiny-b' if OUT is one whole run of that plan; fails on any mix."""
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "trace" / "manifest.json").read_text())
    assert summary["plan_digest"] == manifest["plan_digest"], "summary and trace of two plans"
    assert summary["plan"] == manifest["plan_name"]
    assert summary["num_ops"] == manifest["num_ops"]
    assert len(pd.read_parquet(out / "timeline.parquet")) == manifest["num_ops"]
    assert len(pd.read_csv(out / "ranks.csv")) == summary["ranks"]
    stamp = json.loads((out / ".xsim-output").read_text())
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert sorted(stamp["files"] + [".xsim-output"]) == files, "files not of one run"
    assert ("timeline.png" in files and "timeline.perfetto.json" in files) == plots
    return summary["plan"]


def _tmp(parent: Path) -> Path | None:
    return next((n for n in parent.iterdir() if n.name.startswith(".xsim-tmp-")), None)


def _has(name: str):
    """A kill point: the run's temporary sibling holds ``name`` (a glob)."""
    return lambda parent: (t := _tmp(parent)) is not None and any(t.glob(name))


def _swapped(parent: Path) -> bool:
    """A kill point: the new run is in place (the old one may not be removed yet)."""
    try:
        return json.loads((parent / "out" / "summary.json").read_text())["plan"] == "tiny-b"
    except (OSError, ValueError, KeyError):
        return False


# (signal, kill point: when the predicate on the run's parent directory first holds; None:
# one second after start, while Python is still importing). The points cover the write
# window: nothing written, trace written, metrics written, last picture being written, and
# just after the swap.
KILLS = [
    (signal.SIGKILL, None),
    (signal.SIGTERM, _has("trace/manifest.json")),
    (signal.SIGINT, _has("summary.json")),
    (signal.SIGKILL, _has("timeline.png")),
    (signal.SIGKILL, _swapped),
]


@pytest.mark.slow  # 27 s on 2 cores (tests --durations, 2026-12-04): one run per instant
def test_kill_at_any_instant_leaves_the_old_or_the_new_run_whole(tmp_path):
    a, b = tiny_plans(tmp_path)
    root = tmp_path / "outs"
    root.mkdir()
    first = root / "out0"
    assert cli.main(["run", str(a), "-o", str(first)]) == 0
    import shutil

    outs = [first] + [root / f"out{i}" for i in range(1, len(KILLS))]
    for o in outs[1:]:
        shutil.copytree(first, o)
    # Each run writes beside its OUT in its own parent, so its temporary sibling is its own.
    parents = []
    for i, o in enumerate(outs):
        p = root / f"p{i}"
        p.mkdir()
        o.rename(p / "out")
        parents.append(p)
    results: list[tuple[int, int]] = [(0, 0)] * len(KILLS)

    def one(i: int) -> None:
        sig, point = KILLS[i]
        proc = _xsim("run", str(b), "-o", str(parents[i] / "out"), log=root / f"log{i}")
        if point is None:
            time.sleep(1.0)
        else:
            while proc.poll() is None and not point(parents[i]):
                time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(timeout=120)
        results[i] = (proc.pid, proc.returncode)

    # Meanwhile two runs of different plans race into one OUT: the last to finish wins whole.
    shared = root / "shared"
    racers = [_xsim("run", str(p), "--no-plots", "-o", str(shared), log=root / f"race{i}")
              for i, p in enumerate((a, b))]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(KILLS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = []
    for i, ((sig, point), (_, rc)) in enumerate(zip(KILLS, results, strict=True)):
        which = _which_run(parents[i] / "out")
        seen.append(which)
        if rc == 0:  # it finished before the signal
            assert which == "tiny-b"
        if point is None:  # killed while still starting: nothing written, the old run stays
            assert (rc, which) == (-signal.SIGKILL, "tiny-a")
        if point is _swapped:
            assert which == "tiny-b"
        if rc != 0:
            assert rc in (-signal.SIGKILL, -signal.SIGINT, -signal.SIGTERM, 130, 143), rc
        if sig != signal.SIGKILL:  # Ctrl-C and SIGTERM clean up at once
            assert not [n for n in parents[i].iterdir() if n.name.startswith(".xsim-tmp-")]
        assert not any(n.name.startswith(".xsim-tmp") for n in (parents[i] / "out").rglob("*"))
    # The next run beside a SIGKILLed one removes what it left.
    for p in parents:
        assert cli.main(["trace", str(a), "-o", str(p / "next")]) == 0
        assert not [n.name for n in p.iterdir() if n.name.startswith(".xsim-tmp-")]
    for r in racers:
        assert r.wait(timeout=120) == 0
    assert _which_run(shared, plots=False) in ("tiny-a", "tiny-b")
    assert not [n.name for n in root.iterdir() if n.name.startswith(".xsim-tmp-")]


# SIGKILL 32 s, SIGTERM 12 s on 2 cores (tests --durations, 2026-12-04)
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGKILL, marks=pytest.mark.slow),
                                 signal.SIGTERM])
def test_sweep_workers_die_with_a_killed_parent_and_rows_survive(tmp_path, sig):
    a, _ = tiny_plans(tmp_path)
    out = tmp_path / "sw"
    proc = _xsim("sweep", str(a), "--set", "training.global_batch=2,4,6,8", "--jobs",
                 "2", "-o", str(out), log=tmp_path / "log")
    rows = out / "sweep.rows.jsonl"
    workers: set[int] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        workers |= _descendants(proc.pid)
        if rows.exists() and rows.read_text().count("\n") >= 1 and len(workers) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, (tmp_path / "log").read_text()
    workers |= _descendants(proc.pid)
    assert any("multiprocessing" in _cmdline(w) for w in workers), workers
    proc.send_signal(sig)
    t0 = time.monotonic()
    rc = proc.wait()
    assert time.monotonic() - t0 < 5.0, "xsim sweep waited for running variants"
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 143)
    left = _wait_gone(workers, 5.0)
    for w in left:  # never leave a worker behind, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(w, signal.SIGKILL)
    assert not left, "sweep workers outlived their parent"
    kept = [json.loads(ln) for ln in rows.read_text().splitlines()]
    assert kept and all(r["row"]["error"] == "" for r in kept)
    if sig != signal.SIGKILL:
        return
    # --resume runs only the rest and says how many it skipped
    res = _xsim("sweep", str(a), "--set", "training.global_batch=2,4,6,8", "-o",
                str(out), "--resume", log=tmp_path / "log2")
    assert res.wait(timeout=120) == 0, (tmp_path / "log2").read_text()
    stdout = (tmp_path / "log2").read_text()
    assert f"skipped {len(kept)} variants already finished" in stdout
    frame = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    assert list(frame["training.global_batch"]) == [2, 4, 6, 8]
    assert (frame["error"] == "").all()
    lines = rows.read_text().splitlines()
    assert len(lines) == 4  # the skipped variants were not run again


HAVE_NS3 = cli is not None and __import__("importlib").util.find_spec("ns") is not None


@pytest.mark.ns3
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
def test_ns3_worker_dies_with_a_sigkilled_parent_and_its_tempdir_goes(tmp_path):
    import tempfile

    from xsim_adapters._proc import clean_stale_tempdirs

    a, _ = tiny_plans(tmp_path)
    proc = _xsim("run", str(a), "--backend", "ns3", "-o", str(tmp_path / "o"),
                 log=tmp_path / "log")
    worker = None
    deadline = time.monotonic() + 90
    while worker is None and time.monotonic() < deadline and proc.poll() is None:
        worker = next((p for p in _descendants(proc.pid) if "xsim_ns3.worker" in _cmdline(p)),
                      None)
        time.sleep(0.05)
    assert worker is not None, (tmp_path / "log").read_text()
    work = Path(_cmdline(worker).split()[-1]).parent
    assert work.name.startswith(f"xsim-ns3-{proc.pid}-") and work.is_dir()
    proc.kill()
    proc.wait()
    try:
        assert not _wait_gone({worker}, 5.0), "the ns-3 worker outlived its parent"
    finally:  # never leave a worker behind, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
    assert work.is_dir()  # SIGKILL gives no chance to clean; the next run does
    assert clean_stale_tempdirs("xsim-ns3-", tempfile.gettempdir()) >= 1
    assert not work.exists()
    assert not (tmp_path / "o").exists()


def test_htsim_driver_dies_with_a_sigkilled_parent(tmp_path):
    """The driver is started with the parent-death signal (a stand-in binary: the kernel
    mechanism does not depend on what the driver computes)."""
    code = ("import sys; from xsim_htsim._driver import run_driver; "
            "run_driver(['/bin/sleep', '120'], None)")
    with open(tmp_path / "log", "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=fh,
                                stderr=subprocess.STDOUT)
    driver = None
    deadline = time.monotonic() + 30
    while driver is None and time.monotonic() < deadline and proc.poll() is None:
        driver = next((p for p in _descendants(proc.pid) if "sleep 120" in _cmdline(p)), None)
        time.sleep(0.02)
    assert driver is not None, (tmp_path / "log").read_text()
    proc.kill()
    proc.wait()
    try:
        assert not _wait_gone({driver}, 5.0), "the htsim driver outlived its parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(driver, signal.SIGKILL)


@pytest.mark.ns3
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
def test_ctrl_c_stops_the_ns3_worker_and_removes_its_tempdir(tmp_path):
    if (signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            or signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])):
        # e.g. pytest started as a background job of a non-interactive shell: xsim inherits
        # SIGINT ignored (Python then installs no Ctrl-C handler), so there is no Ctrl-C to test
        pytest.skip("SIGINT is ignored or blocked in this process, and xsim would inherit it")
    a, _ = tiny_plans(tmp_path)
    proc = _xsim("run", str(a), "--backend", "ns3", "-o", str(tmp_path / "o"),
                 log=tmp_path / "log")
    worker = None
    deadline = time.monotonic() + 90
    while worker is None and time.monotonic() < deadline and proc.poll() is None:
        worker = next((p for p in _descendants(proc.pid) if "xsim_ns3.worker" in _cmdline(p)),
                      None)
        time.sleep(0.05)
    assert worker is not None, (tmp_path / "log").read_text()
    work = Path(_cmdline(worker).split()[-1]).parent
    proc.send_signal(signal.SIGINT)  # the worker is in its own session: xsim must stop it
    try:
        assert proc.wait(timeout=30) == 130
        assert not _wait_gone({worker}, 2.0), "the ns-3 worker outlived Ctrl-C"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
    assert not work.exists()
    assert "xsim: interrupted" in (tmp_path / "log").read_text()
