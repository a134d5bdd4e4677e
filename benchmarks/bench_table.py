"""The benchmark table of benchmarks/README.md: plans x backends, one fresh process per cell.

    python benchmarks/bench_table.py                     # shipped plans <= 16 GPUs, flow htsim ns3
    python benchmarks/bench_table.py --backends flow --plans workloads/llama2-70b-1024gpu.yaml

Per (plan, backend), in a child process: generate the trace (coarsening as ``auto``), build the
topology, run the backend, compute the metrics. Reported: ops, backend wall and CPU s (``run``
only; CPU includes the backend's child processes: the machine may be shared, CPU is the
steadier number), events per wall and per CPU second when the backend reports events, the
iteration time (ms), and memory: the child's peak RSS (VmHWM, MB) and bytes per op =
(peak RSS - RSS after the imports) / ops.
Backend options as bench_htsim.py (like for like): htsim ``scale_up=fluid``; ns-3 ``udp``,
MTU 9000, ``scale_up=fluid``, at most 900 s of wall time per ns-3 replay.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from pathlib import Path

def rss(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0

import xsim_adapters as xs
plan_path, name, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if name == "htsim":
    import xsim_htsim  # noqa: F401
if name == "ns3":
    import xsim_ns3  # noqa: F401
base = rss("VmRSS:")
plan = xs.load_plan(plan_path)
trace = xs.generate(plan)
topo = xs.build_topology(plan)
t0, c0 = time.perf_counter(), time.process_time()
tl = xs.run(trace, name, topo, opts)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
try:  # a backend's child process (ns-3 runs in-process; htsim's driver is a child)
    import resource
    cpu += resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
except Exception:
    pass
met = xs.metrics(trace, tl)
hwm = rss("VmHWM:")
ev = tl.stats.get("events")
print(json.dumps({"ops": trace.num_ops, "wall_s": wall, "cpu_s": cpu, "events": ev,
                  "events_per_s": (ev / wall) if ev else None,
                  "events_per_cpu_s": (ev / cpu) if ev and cpu > 0 else None,
                  "iteration_ms": met.summary["iteration_time_ns"] / 1e6,
                  "peak_rss_MB": hwm / 1e6, "bytes_per_op": (hwm - base) / trace.num_ops}))
"""

OPTIONS = {"flow": {}, "htsim": {"scale_up": "fluid"},
           "ns3": {"transport": "udp", "mtu": 9000, "scale_up": "fluid", "wall_limit_s": 900},
           # htsim's opt-in faster packets (docs/htsim.md "Faster packets"): 65000-byte
           # packets, one RoCE ACK per 4 packets
           "htsim-fast": {"scale_up": "fluid", "mtu": 65000, "ack_every": 4}}
BACKEND = {"htsim-fast": "htsim"}  # cells that run a backend under another name


def cell(plan: Path, backend: str) -> dict:
    """One (plan, backend) measurement in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(plan), BACKEND.get(backend, backend),
                        json.dumps(OPTIONS[backend])], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:100]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", nargs="*", default=None)
    ap.add_argument("--backends", default="flow,htsim,ns3")
    ap.add_argument("--max-gpus", type=int, default=16)
    a = ap.parse_args(argv)
    import xsim_adapters as xs

    plans = [Path(p) for p in a.plans] if a.plans else [
        p for p in sorted((REPO / "workloads").glob("*.yaml"))
        if xs.load_plan(p).num_ranks <= a.max_gpus]
    names = [b.strip() for b in a.backends.split(",") if b.strip()]
    print("| plan | backend | ops | wall s | CPU s | events/s | events/CPU s | iteration ms |"
          " peak RSS MB | bytes/op |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cells: dict[tuple[str, str], dict] = {}
    for p in plans:
        for b in names:
            c = cell(p, b)
            cells[(p.stem, b)] = c
            if "error" in c:
                print(f"| {p.stem} | {b} | | | | | | | | {c['error']} |", flush=True)
                continue
            eps = f"{c['events_per_s']:,.0f}" if c["events_per_s"] else "-"
            if c.get("events_per_cpu_s"):
                eps += f" | {c['events_per_cpu_s']:,.0f}"
            else:
                eps += " | -"
            print(f"| {p.stem} | {b} | {c['ops']:,} | {c['wall_s']:.2f} | {c['cpu_s']:.2f} | "
                  f"{eps} | {c['iteration_ms']:.3f} | {c['peak_rss_MB']:,.0f} | "
                  f"{c['bytes_per_op']:,.0f} |", flush=True)
    _ratios(plans, names, cells)
    return 0


def _ratios(plans: list[Path], names: list[str], cells: dict[tuple[str, str], dict]) -> None:
    """The issue's table: per plan the backends' CPU (wall) seconds side by side and ns-3's
    ratio to each other backend, in CPU seconds (the comparable number on a shared machine)."""
    if "ns3" not in names or len(names) < 2:
        return
    others = [b for b in names if b != "ns3"]
    print()
    print("| plan | ops | " + " | ".join(f"{b} CPU s (wall)" for b in names) + " | "
          + " | ".join(f"ns-3 / {b} (CPU)" for b in others) + " |")
    print("|---" * (2 + len(names) + len(others)) + "|")
    for p in plans:
        row = [cells.get((p.stem, b), {}) for b in names]
        ops = next((c["ops"] for c in row if "ops" in c), 0)
        times = [f"{c['cpu_s']:.2f} ({c['wall_s']:.2f})" if "cpu_s" in c else "-" for c in row]
        ns3 = cells.get((p.stem, "ns3"), {}).get("cpu_s")
        ratios = []
        for b in others:
            t = cells.get((p.stem, b), {}).get("cpu_s")
            ratios.append(f"{ns3 / t:.1f}x" if ns3 and t else "-")
        print(f"| {p.stem} | {ops:,} | " + " | ".join(times) + " | " + " | ".join(ratios)
              + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
