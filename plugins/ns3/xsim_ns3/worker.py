"""``python -m xsim_ns3.worker IN_DIR OUT_DIR``: one ns-3 replay in its own process.

A process per replay isolates ns-3's global simulator state, lets the parent enforce the wall
limit, and turns a crash into an error carrying ns-3's own stderr. IN_DIR holds ``input.npz``
and ``meta.json`` (see :mod:`xsim_ns3._prepare`); OUT_DIR receives ``result.npz`` and
``stats.json``, each written under a temporary name and renamed. Exit status 0 means the
simulator ran to its end (complete or not: the parent checks); anything else is a failure.

The working directory must be a small clean one: the wheel globs the current directory for
``*.so`` files, and another ns-3 build there breaks the import ("multiple build profiles").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m xsim_ns3.worker IN_DIR OUT_DIR", file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    meta = json.loads((src / "meta.json").read_text())
    with np.load(src / "input.npz") as z:
        arrays = {k: z[k] for k in z.files}
    from ._sim import replay

    start, end, stats = replay(arrays, meta)
    queues = {f"queue_{k}": v for k, v in stats.pop("queue_stats", {}).items()}
    tmp = dst / f".result.tmp{os.getpid()}.npz"
    np.savez(tmp, start_ns=start, end_ns=end, **queues)
    os.replace(tmp, dst / "result.npz")
    _atomic_write_bytes(dst / "stats.json", json.dumps(stats).encode())
    # Skip interpreter teardown: ns-3/cppyy global destructors can crash at exit, after the
    # results are safely on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
