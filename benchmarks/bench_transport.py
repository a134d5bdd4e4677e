"""Cost of the plan's network.transport on htsim: each plan without the section and with
``lossless: pfc, cc: dcqcn`` (defaults of docs/transport.md), one run each.

    python benchmarks/bench_transport.py --driver BIN [--before OLD_BIN] PLAN...

Per plan and case: iteration time (ms), driver events, the driver's replay wall seconds, the
driver process's CPU seconds (user + sys, RUSAGE_CHILDREN delta), and with the transport the
fabric's totals (PAUSE frames, paused ms, ECN marks, CNPs, drops). ``--before``: also run the
plan on another driver build without the section and check that this one's times file is
byte-identical to it (the section's absence changes nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import resource
import tempfile
from pathlib import Path

from xsim_htsim import HtsimBackend

from xsim_adapters import api
from xsim_adapters.plan.transport import EcnSpec, TransportSpec

PFC_DCQCN = TransportSpec(lossless="pfc", cc="dcqcn", ecn=EcnSpec())


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(trace, topo, driver: str, spec: TransportSpec | None, work: Path) -> dict:
    """Run once; the row of the table and the times file's sha256."""
    work.mkdir(parents=True, exist_ok=True)
    c0 = _cpu_children()
    tl = HtsimBackend().run(trace, dataclasses.replace(topo, transport=spec),
                            {"driver": driver, "work_dir": str(work)})
    row = {"iteration_ms": tl.makespan_ns / 1e6, "events": tl.stats["events"],
           "replay_s": tl.stats["replay_s"], "cpu_s": _cpu_children() - c0,
           "sha": hashlib.sha256((work / "times.bin").read_bytes()).hexdigest()}
    ls = tl.link_stats
    if spec is not None and ls is not None:
        row.update(pauses=int(ls["pause_sent"].sum()), paused_ms=ls["paused_ns"].sum() / 1e6,
                   marks=int(ls["ecn_marks"].sum()), cnps=int(ls["cnps"].sum()),
                   drops=int(ls["drops"].sum()))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", required=True)
    ap.add_argument("--before", default=None)
    ap.add_argument("plans", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        for p in a.plans:
            plan = api.load_plan(p)
            trace, topo = api.generate(plan), api.build_topology(plan)
            name = Path(p).stem
            rows = {}
            if a.before:
                rows["before"] = one(trace, topo, a.before, None, Path(tmp) / name / "before")
            rows["none"] = one(trace, topo, a.driver, None, Path(tmp) / name / "none")
            rows["pfc+dcqcn"] = one(trace, topo, a.driver, PFC_DCQCN, Path(tmp) / name / "pfc")
            if a.before and rows["before"]["sha"] != rows["none"]["sha"]:
                raise SystemExit(f"{name}: times differ without the section")
            for case, r in rows.items():
                extra = "".join(f" {k}={v:.3g}" if isinstance(v, float) else f" {k}={v}"
                                for k, v in r.items()
                                if k not in ("iteration_ms", "events", "replay_s", "cpu_s",
                                             "sha"))
                print(f"{name} {case}: iteration {r['iteration_ms']:.3f} ms, events"
                      f" {r['events']:,}, replay {r['replay_s']:.1f} s, CPU {r['cpu_s']:.1f} s,"
                      f" times {r['sha'][:12]}{extra}", flush=True)


if __name__ == "__main__":
    main()
