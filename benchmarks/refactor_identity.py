"""Byte identity of traces and flow timelines across a refactor.

``python benchmarks/refactor_identity.py record DIR`` writes, for every shipped plan of at most
``--max-gpus`` GPUs in ``workloads/`` (plans only: not ``search/`` or ``traffic/`` specs), the
SHA-256 of its trace (ops, deps and collectives frames, rows sorted, with column names and
dtypes; the manifest as sorted JSON) and of its flow-backend timeline (``op_id``, ``start_ns``,
``end_ns`` sorted by op id), the same for :data:`VARIANTS` (shipped plans with fields changed
to reach the other lowering paths; a variant that fails records its error, which must stay
the same), plus the traces of ``xsim bench-collective`` (every kind and algorithm at three
sizes on two fabrics), into ``DIR/hashes.json``.
``... compare DIR`` recomputes them with the code on ``PYTHONPATH`` and exits 1 naming every
plan whose trace or timeline differs in a single bit. Run ``record`` from the old code and
``compare`` from the new one (the issue 26 workload refactor was checked this way).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def frame_digest(frame: pd.DataFrame, sort: list[str]) -> str:
    """SHA-256 of ``frame``'s column names, dtypes and values, rows sorted by ``sort``."""
    f = frame.sort_values(sort, kind="stable").reset_index(drop=True) if len(frame) else frame
    h = hashlib.sha256()
    h.update(json.dumps([(c, str(f[c].dtype)) for c in f.columns]).encode())
    for c in f.columns:
        col = f[c]
        if col.dtype == object:
            h.update(json.dumps([repr(v) for v in col.tolist()]).encode())
        else:
            h.update(np.ascontiguousarray(col.to_numpy()).tobytes())
    return h.hexdigest()


def trace_digest(trace: Any) -> dict[str, str]:
    """Digests of one trace's ops, deps, collectives and manifest."""
    deps_sort = list(trace.deps.columns)
    coll_sort = list(trace.collectives.columns[:1])
    return {
        "ops": frame_digest(trace.ops, ["op_id"]),
        "deps": frame_digest(trace.deps, deps_sort),
        "collectives": frame_digest(trace.collectives, coll_sort) if coll_sort else "",
        "manifest": hashlib.sha256(json.dumps(trace.manifest, sort_keys=True,
                                              default=repr).encode()).hexdigest(),
        "num_ops": str(len(trace.ops)),
    }


def plans(max_gpus: int) -> list[Path]:
    """The shipped plans (workloads/*.yaml) of at most ``max_gpus`` GPUs."""
    import xsim_adapters as xs

    out = []
    for p in sorted((ROOT / "workloads").glob("*.yaml")):
        if xs.load_plan(p).num_ranks <= max_gpus:
            out.append(p)
    return out


# Variants of shipped plans that reach the lowering paths the shipped plans do not: trees (inner
# members keep a timed barrier), hierarchical all-to-all proxies, expert TP, ZeRO with and
# without the overlapped all-gather, zero-bubble and interleaved schedules, chunked rings,
# no NCCL cost. (plan stem, {dotted key: value}).
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("homogeneous-h100", {"collectives.algorithm": "tree"}),
    ("homogeneous-h100", {"collectives.algorithm": "hierarchical"}),
    ("homogeneous-h100", {"training.schedule": "zb_h1"}),
    ("homogeneous-h100", {"training.schedule": "interleaved", "training.virtual_stages": 2}),
    ("homogeneous-h100", {"training.zero_stage": 1}),
    ("homogeneous-h100", {"training.zero_stage": 1, "training.overlap.param_gather": False}),
    ("homogeneous-h100", {"collectives.granularity": "chunked", "collectives.chunks": 4}),
    ("homogeneous-h100", {"collectives.nccl_cost": False}),
    ("hetero-dp-h100-a100", {"collectives.algorithm": "tree", "training.zero_stage": 1}),
    ("moe-mixtral-8x7b-64xh100-ep8", {"model.moe.alltoall": "hierarchical"}),
    ("moe-mixtral-8x7b-64xh100-ep8", {"replicas.uniform.etp": 2}),
    ("moe-mixtral-8x7b-64xh100-ep8", {"collectives.nccl_cost": False,
                                      "replicas.uniform.etp": 2}),
    ("long-context-128k-cp4", {"collectives.nccl_cost": False}),
    ("long-context-128k-cp4", {"training.recompute": "full"}),
    ("homogeneous-h100", {"training.recompute": "full"}),
    ("homogeneous-h100", {"training.recompute": "selective", "training.schedule": "zb_h1"}),
    ("moe-mixtral-8x7b-64xh100-ep8", {"training.recompute": "full"}),
    ("moe-mixtral-8x7b-64xh100-ep8", {"training.schedule": "zb_h1"}),
]


def variant_plan(stem: str, sets: dict[str, Any]) -> Any:
    """The shipped plan ``stem`` with ``sets`` applied (dotted keys into its YAML)."""
    import yaml

    import xsim_adapters as xs

    d = yaml.safe_load((ROOT / "workloads" / f"{stem}.yaml").read_text())
    for key, value in sets.items():
        *parents, leaf = key.split(".")
        node = d
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return xs.load_plan(yaml.safe_dump(d))


def bench_cases() -> list[tuple[str, Any]]:
    """``xsim bench-collective`` traces: every kind x algorithm, three sizes, two fabrics."""
    from xsim_adapters.bench_collective import ALGORITHM_CHOICES, KINDS, bench_plan, lowered_trace

    out = []
    for dev, servers, gpn in (("H100-80GB", 2, 8), ("A100-80GB", 4, 4)):
        plan = bench_plan(dev, servers, gpn)
        for kind in KINDS:
            for alg in ALGORITHM_CHOICES:
                for nbytes in (1 << 12, 1 << 22, 1 << 30):
                    for nccl_cost in (True, False):
                        name = f"bench:{dev}:{servers}x{gpn}:{kind}:{alg}:{nbytes}:{nccl_cost}"
                        out.append((name, lambda p=plan, k=kind, b=nbytes, a=alg, c=nccl_cost:
                                    lowered_trace(p, k, b, nccl_cost=c, algorithm=a)))
    return out


def digests(max_gpus: int) -> dict[str, Any]:
    """Every digest this check compares, keyed by plan stem or bench case."""
    import xsim_adapters as xs

    res: dict[str, Any] = {}
    cases = [(p.stem, lambda p=p: xs.load_plan(p)) for p in plans(max_gpus)] + [
        (f"{stem}+{json.dumps(sets, sort_keys=True)}",
         lambda st=stem, se=sets: variant_plan(st, se)) for stem, sets in VARIANTS]
    for name, load in cases:
        t0 = time.time()
        plan = load()
        try:
            trace = xs.generate(plan)
        except Exception as e:  # noqa: BLE001 - a known failure must fail the same way
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: {res[name]['error']}", flush=True)
            continue
        tl = xs.run(plan, "flow", trace=trace)
        frame = tl.frame[["op_id", "start_ns", "end_ns"]]
        d = trace_digest(trace)
        d["timeline"] = frame_digest(frame, ["op_id"])
        d["makespan_ns"] = repr(tl.makespan_ns)
        res[name] = d
        print(f"{name}: {d['num_ops']} ops, makespan {d['makespan_ns']} ns,"
              f" {time.time() - t0:.1f} s", flush=True)
    from xsim_adapters.backends.registry import get_backend
    from xsim_adapters.topology import build_topology

    flow, topos = get_backend("flow"), {}
    for name, fn in bench_cases():
        trace, end_op, alg = fn()
        d = {f"trace_{k}": v for k, v in trace_digest(trace).items()}
        key = name.split(":")[1:3]
        plan = fn.__defaults__[0]  # type: ignore[index]
        if tuple(key) not in topos:
            topos[tuple(key)] = build_topology(plan)
        tl = flow.run(trace, topos[tuple(key)], {})
        # the bench's result: the closing barrier's time (what ``xsim bench-collective`` prints)
        d["time_ns"] = repr(float(tl.frame["end_ns"].iloc[end_op]))
        d["algorithm"] = alg
        res[name] = d
    print(f"{len(bench_cases())} bench-collective traces", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("record", "compare"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--ignore", action="append", default=[], metavar="PREFIX",
                    help="compare: skip fields starting with PREFIX (e.g. trace_: the bench"
                         " traces' op order, once their lowering changed; their times stay)")
    a = ap.parse_args(argv)
    now = digests(a.max_gpus)
    path = a.dir / "hashes.json"
    if a.mode == "record":
        a.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(now, indent=1, sort_keys=True))
        tmp.replace(path)
        print(f"recorded {len(now)} cases to {path}")
        return 0
    before = json.loads(path.read_text())
    bad = [f"{k}: {f}" for k in sorted(set(before) | set(now))
           for f in sorted(set(before.get(k, {})) | set(now.get(k, {})))
           if not any(f.startswith(x) for x in a.ignore)
           and before.get(k, {}).get(f) != now.get(k, {}).get(f)]
    for line in bad:
        print("DIFFERS", line)
    print(f"{len(now)} cases compared, {len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
