"""htsim backend without htsim: the input writer and output reader against golden files, and
the error paths around the driver (missing, crashing, partial output) with fake drivers."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from test_htsim_helpers import DATA, TraceBuilder, golden_case, star
from xsim_htsim import HtsimBackend, find_driver, read_times, write_input

from xsim_adapters.errors import BackendError, BackendUnavailable


def test_input_matches_golden_bytes(tmp_path: Path) -> None:
    trace, topo = golden_case()
    info = write_input(trace, topo, tmp_path / "in.txt")
    assert (tmp_path / "in.txt").read_bytes() == (DATA / "golden_input.txt").read_bytes()
    # edges: 15 outside the ring + 4 ranks x 5 later steps x 2 (forwarded chunk, own last send)
    assert (info.links, info.routes, info.ops, info.flows, info.edges) == (8, 8, 33, 26, 55)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, nothing left behind


def test_input_routes_are_the_topology_paths(tmp_path: Path) -> None:
    trace, topo = golden_case()
    write_input(trace, topo, tmp_path / "in.txt")
    lines = (tmp_path / "in.txt").read_text().splitlines()
    r0 = lines.index("routes 8")
    routes = [list(map(int, ln.split()[1:])) for ln in lines[r0 + 1 : r0 + 9]]
    o0 = lines.index("ops 33")
    for op in trace.flows().itertuples():
        fields = lines[o0 + 1 + op.op_id].split()
        assert fields[:4] == ["F", str(op.bytes), str(op.rank), str(op.dst)]
        fwd, rev = int(fields[4]), int(fields[5])
        if op.rank == op.dst:
            assert (fwd, rev) == (-1, -1)
            continue
        assert routes[fwd] == topo.path(op.rank, op.dst, op.op_id).tolist()
        assert routes[rev] == topo.path(op.dst, op.rank, op.op_id).tolist()


def test_input_units_are_picoseconds_and_bits_per_second(tmp_path: Path) -> None:
    tb = TraceBuilder(2)
    tb.compute(0, 1234)
    trace = tb.build()
    topo = star(2, 12.5, latency_ns=0.25)
    write_input(trace, topo, tmp_path / "in.txt")
    lines = (tmp_path / "in.txt").read_text().splitlines()
    assert lines[3] == "0 2 12500000000 250 1"  # GPU egress: from_gpu = 1
    assert lines[4] == "2 0 12500000000 250 0"
    assert "C 1234000" in lines
    assert lines[-3:] == ["succ 0", "0", "end"]


def test_input_rejects_zero_capacity_link(tmp_path: Path) -> None:
    trace, topo = golden_case()
    topo.links.loc[5, "gbps"] = 0.0
    with pytest.raises(BackendError, match=r"htsim: link 5 has capacity 0.0 Gb/s"):
        write_input(trace, topo, tmp_path / "in.txt")


@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_reader_on_golden_times(protocol: str) -> None:
    frame = read_times(DATA / f"golden_times_{protocol}.csv", 33)
    assert frame["op_id"].tolist() == list(range(33))
    raw = np.loadtxt(DATA / f"golden_times_{protocol}.csv", delimiter=",", skiprows=1,
                     dtype=np.int64)
    # ps -> ns is a division by 1000: exact to well under a picosecond
    assert np.array_equal(np.rint(frame["start_ns"].to_numpy() * 1000), raw[:, 1])
    assert np.array_equal(np.rint(frame["end_ns"].to_numpy() * 1000), raw[:, 2])
    # Closed-form facts of the golden case: rank 0 computes 0..10 us; the final 5 us computes
    # start together; the local flow takes no time, the empty one the path latency (2 x 500 ns).
    assert frame.loc[0, ["start_ns", "end_ns"]].tolist() == [0.0, 10_000.0]
    tail = frame.iloc[27:31]
    assert (tail["end_ns"] - tail["start_ns"] == 5_000.0).all()
    assert tail["start_ns"].nunique() == 1
    assert frame.loc[31, "end_ns"] == frame.loc[31, "start_ns"]
    assert frame.loc[32, "end_ns"] - frame.loc[32, "start_ns"] == 1_000.0
    # The ring's 6 steps are bounded by the 100 Gb/s NIC: 256 KiB each, at least 20.97 us.
    ring_ns = frame.loc[2, "end_ns"] - frame.loc[1, "start_ns"]
    assert ring_ns >= 6 * (1 << 18) * 8 / 100.0


def test_reader_rejects_partial_file(tmp_path: Path) -> None:
    lines = (DATA / "golden_times_roce.csv").read_text().splitlines()
    (tmp_path / "t.csv").write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(BackendError, match=r"times file has 31 ops, trace has 33 \(missing: "
                                           r"\[31, 32\]\); a partial timeline is not a result"):
        read_times(tmp_path / "t.csv", 33)


# ---- finding the driver ------------------------------------------------------------------

def test_missing_driver_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XSIM_HTSIM_DRIVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("xsim_htsim._driver.IN_TREE", tmp_path / "nowhere" / "xsim-htsim")
    ok, reason = HtsimBackend.available()
    assert not ok
    assert reason.startswith(
        "htsim driver not found: XSIM_HTSIM_DRIVER is not set, no 'xsim-htsim' on PATH, and no "
        f"{tmp_path / 'nowhere' / 'xsim-htsim'}; build it with `make -C plugins/htsim/driver "
        "HTSIM_DIR=/path/to/csg-htsim`"
    )
    trace, topo = golden_case()
    with pytest.raises(BackendUnavailable, match="htsim driver not found"):
        HtsimBackend().run(trace, topo, {})


def test_env_var_not_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XSIM_HTSIM_DRIVER", str(tmp_path / "missing"))
    path, reason = find_driver()
    assert path is None
    assert reason.startswith(f"htsim driver not found: XSIM_HTSIM_DRIVER={tmp_path / 'missing'}"
                             " is not an executable file; build it with")


# ---- fake drivers: the code around the simulator ----------------------------------------

def fake_driver(tmp_path: Path, body: str) -> Path:
    """A Python script standing in for the driver; ``body`` sees args/out/summary/golden."""
    p = tmp_path / "fake-xsim-htsim"
    p.write_text(
        f"#!{sys.executable}\n"
        "import json, os, signal, sys, time\n"
        "args = sys.argv[1:]\n"
        "out = args[args.index('--out') + 1]\n"
        "summary = args[args.index('--summary') + 1]\n"
        f"golden = open({str(DATA / 'golden_times_roce.csv')!r}).read()\n" + body
    )
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_fake_driver_complete_run(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, (
        "open(out, 'w').write(golden)\n"
        "json.dump({'events': 500, 'sim_wall_s': 0.25, 'flows': 18, 'sim_ps': 148894880},"
        " open(summary, 'w'))\n"
    ))
    trace, topo = golden_case()
    tl = HtsimBackend().run(trace, topo, {"driver": str(drv), "protocol": "ndp"})
    assert tl.backend == "htsim"
    assert tl.makespan_ns == 154096.32
    assert tl.stats["events"] == 500 and tl.stats["events_per_s"] == 2000.0
    # 26 flows: 24 cross the network with bytes, 6 of those on scale-up links only; under
    # scale_up=fluid the other 18 are packets (checked against the driver's count; the real
    # driver reports 18, and 24 with scale_up=packet)
    assert tl.stats["protocol"] == "ndp" and tl.stats["flows"] == 18
    assert (tl.stats["packet_flows"], tl.stats["fluid_flows"]) == (18, 8)
    assert tl.stats["wall_s"] > 0


def test_fake_driver_reporting_other_flow_counts_is_an_error(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, (
        "open(out, 'w').write(golden)\n"
        "json.dump({'events': 5, 'sim_wall_s': 0.0, 'flows': 24}, open(summary, 'w'))\n"
    ))
    trace, topo = golden_case()
    with pytest.raises(BackendError, match="the driver started 24 transport flows, but the"
                       " input has 18 packet flows"):
        HtsimBackend().run(trace, topo, {"driver": str(drv)})


def test_fake_driver_receives_the_options(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, "sys.stderr.write(' '.join(args[5:])); sys.exit(2)\n")
    trace, topo = golden_case()
    with pytest.raises(BackendError) as e:
        HtsimBackend().run(trace, topo, {"driver": str(drv), "protocol": "ndp", "mtu": 4096,
                                         "queue_bytes": 100000, "cwnd_pkts": 20, "seed": 7})
    assert str(e.value).startswith(
        "htsim: the driver failed (exit 2): --protocol ndp --scale-up fluid --mtu 4096 "
        "--queue-bytes 100000 --cwnd-pkts 20 --seed 7 --progress-s 0.1 --queues ")
    assert str(e.value).endswith("/queues.csv")


def test_driver_crash_carries_its_stderr(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, (
        "sys.stderr.write('roce.cpp:231: assertion failed\\n'); sys.stderr.flush()\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n"
    ))
    trace, topo = golden_case()
    with pytest.raises(BackendError) as e:
        HtsimBackend().run(trace, topo, {"driver": str(drv)})
    assert str(e.value) == "htsim: the driver crashed (SIGSEGV); it said: roce.cpp:231: " \
                           "assertion failed"


def test_driver_stuck_message_is_passed_on(tmp_path: Path) -> None:
    msg = ("xsim-htsim: simulation ran out of events at t=5 ps with 2 of 33 ops unfinished "
           "(first: 31 32)")
    drv = fake_driver(tmp_path, f"sys.stderr.write({msg!r}); sys.exit(4)\n")
    trace, topo = golden_case()
    with pytest.raises(BackendError) as e:
        HtsimBackend().run(trace, topo, {"driver": str(drv)})
    assert str(e.value) == f"htsim: the driver failed (exit 4): {msg}"


def test_driver_omitting_ops_is_an_error(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, (
        "open(out, 'w').write(''.join(golden.splitlines(True)[:-1]))\n"
        "json.dump({'events': 1}, open(summary, 'w'))\n"
    ))
    trace, topo = golden_case()
    with pytest.raises(BackendError, match=r"times file has 32 ops, trace has 33 "
                                           r"\(missing: \[32\]\)"):
        HtsimBackend().run(trace, topo, {"driver": str(drv)})


def test_driver_never_completing_op_is_an_error(tmp_path: Path) -> None:
    # A driver that reports an op ending before it started must not pass as complete.
    drv = fake_driver(tmp_path, (
        "lines = golden.splitlines(True)\n"
        "lines[5] = '4,900000,100\\n'\n"
        "open(out, 'w').write(''.join(lines))\n"
        "json.dump({'events': 1}, open(summary, 'w'))\n"
    ))
    trace, topo = golden_case()
    with pytest.raises(BackendError, match=r"htsim: 1 ops never completed \(first: \[4\]\)"):
        HtsimBackend().run(trace, topo, {"driver": str(drv)})


def test_wall_limit_stops_the_driver(tmp_path: Path) -> None:
    drv = fake_driver(tmp_path, "sys.stderr.write('xsim-htsim: progress: 10 s\\n"
                                "xsim-htsim: progress: 20 s\\n'); sys.stderr.flush(); "
                                "time.sleep(30)\n")
    trace, topo = golden_case()
    with pytest.raises(BackendError) as e:
        HtsimBackend().run(trace, topo, {"driver": str(drv), "wall_limit_s": 0.5})
    # only the last progress line: how far the run got
    assert str(e.value) == ("htsim: the driver exceeded the wall limit of 0.5 s and was stopped;"
                            " it said: xsim-htsim: progress: 20 s")


@pytest.mark.parametrize(("opts", "msg"), [
    ({"protocol": "tcp"}, "htsim: option protocol: must be one of roce, ndp, eqds (got 'tcp')"),
    ({"mtu": 100}, "htsim: option mtu: expected an integer >= 256 and <= 65535 (got 100)"),
    ({"scale_up": "nvlink"},
     "htsim: option scale_up: must be one of fluid, packet (got 'nvlink')"),
    ({"wall_limit_s": 0}, "htsim: option wall_limit_s: expected a number > 0 (got 0)"),
    ({"protcol": "ndp"}, "unknown option 'protcol' for backend htsim; did you mean 'protocol'?"
     " allowed: cwnd_pkts, driver, mtu, progress, protocol, queue_bytes, scale_up, seed,"
     " wall_limit_s, work_dir"),
    ({"seed": True}, "htsim: option seed: expected an integer >= 0 and <= 2147483647"
     " (got True)"),
])
def test_bad_options(tmp_path: Path, opts: dict, msg: str) -> None:
    drv = fake_driver(tmp_path, "sys.exit(9)\n")
    trace, topo = golden_case()
    with pytest.raises(BackendError) as e:
        HtsimBackend().run(trace, topo, {"driver": str(drv), **opts})
    assert str(e.value) == msg


def test_timed_link_events_are_written_in_time_order(tmp_path: Path) -> None:
    import pandas as pd

    trace, topo = golden_case()
    gbps = topo.links["gbps"].to_numpy()
    topo.events = pd.DataFrame({"at_ns": [2.5, 1.0, 7.0], "link_id": [3, 0, 3],
                                "factor": [0.0, 0.5, 1.0]})
    write_input(trace, topo, tmp_path / "in.txt")
    lines = (tmp_path / "in.txt").read_text().splitlines()
    assert lines[0] == "xsim-htsim 3"
    e = lines.index("events 3")
    assert e == 3 + len(topo.links)  # right after the links
    # ps, link, bps = round(gbps x factor x 1e9), sorted by time
    assert lines[e + 1:e + 4] == [
        f"1000 0 {round(gbps[0] * 0.5 * 1e9)}", "2500 3 0", f"7000 3 {round(gbps[3] * 1e9)}",
    ]


def test_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="xsim_adapters.backends")}
    assert eps.get("htsim") == "xsim_htsim:HtsimBackend"
    assert os.path.basename(str(DATA)) == "htsim"
