"""All-reduce bus bandwidth on one 8-GPU server: simulated vs nccl-tests measurements.

Reproduces ``nccl_allreduce_busbw_8gpu_azure.csv`` (Azure ND A100 v4 / H100 v5 / H200 v5,
nccl-tests ``all_reduce_perf`` in-place busbw; see the shared validation README) with
``xsim bench-collective`` on the flow backend, from the configurations alone (device preset,
one server of 8, the algorithm the measurement ran: NVLS on H100 / H200, whose harness set
``NCCL_ALGO=NVLS``, the tuner's choice (``auto``) on A100; the generator's lowering of it and
NCCL's cost model; nothing fitted to it).

    python validation/nccl_allreduce.py [--measured CSV] [-o OUT]

Also a source of the validation suite (``python -m validation``: SOURCE ``nccl-allreduce``,
one case per device and size, the A100 bandwidth and latency points in the fast subset). It
writes OUT/nccl_allreduce.csv (size, device, measured, simulated, error) and
OUT/nccl_allreduce.png, and prints the median and worst error per device and size band.
H100/H200 were measured with ``NCCL_ALGO=NVLS`` (NVLink SHARP at every size; a ring alone
reaches ~370 GB/s, nccl-tests #212).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import pandas as pd

from xsim_adapters.bench_collective import bench, bench_plan

try:  # as part of the validation package (python -m validation) or as a script
    from validation.framework import DATA, Case
except ImportError:  # pragma: no cover - run as a plain script from validation/
    from framework import DATA, Case  # type: ignore[no-redef]

SOURCE = "nccl-allreduce"
MEASURED = DATA / "nccl_allreduce_busbw_8gpu_azure.csv"  # copy of the shared validation CSV
DEVICES = {  # measured column -> device preset
    "A100_SXM4_80GB_ND_A100_v4_GBps": "A100-80GB",
    "H100_80GB_ND_H100_v5_GBps": "H100-80GB",
    "H200_ND_H200_v5_GBps": "H200",
}
# What the harness ran (Azure/AI-benchmarking-guide Benchmarks/NVIDIA/NCCLBandwidth.py:
# ``NCCL_ALGO=NVLS all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40``; the H100 / H200 result pages
# say "NVLS algorithm"): NVLS at every size where the GPUs have it. NVLS is impossible on A100
# (NCCL 2.18.5 finds no algorithm under NCCL_ALGO=NVLS there), and its curve has the ring's
# protocol steps, so A100 is compared with the tuner's own choice.
ALGORITHM = {"A100-80GB": "auto", "H100-80GB": "nvls", "H200": "nvls"}
BANDS = (("latency (< 1 MiB)", 0, 1 << 20), ("middle (1-16 MiB)", 1 << 20, 16 << 20),
         ("bandwidth (>= 16 MiB)", 16 << 20, 1 << 40))


def compare(measured_csv: Path = MEASURED, devices: dict[str, str] | None = None,
            sizes: list[int] | None = None) -> pd.DataFrame:
    """One row per (device, size): measured and simulated busbw (GB/s), relative error."""
    m = pd.read_csv(measured_csv)
    rows = []
    for col, dev in (devices or DEVICES).items():
        sel = m if sizes is None else m[m["bytes"].isin(sizes)]
        sim = bench(bench_plan(dev, 1, 8), "all_reduce", sel["bytes"].tolist(),
                    algorithm=ALGORITHM[dev])
        for (_, r), s in zip(sel.iterrows(), sim["busbw"], strict=True):
            rows.append({"device": dev, "size": int(r["bytes"]), "measured": r[col],
                         "simulated": s, "error": s / r[col] - 1.0})
    return pd.DataFrame(rows)


FAST_SIZES = {1 << 10, 16 << 20, 256 << 20, 8 << 30}


def _predict(device: str, size: int) -> float:
    return float(bench(bench_plan(device, 1, 8), "all_reduce", [size],
                       algorithm=ALGORITHM[device])["busbw"].iloc[0])


def cases() -> list[Case]:
    """One case per device and size of the measured curves (busbw, GB/s); a few are fast."""
    m = pd.read_csv(MEASURED)
    out = []
    for col, dev in DEVICES.items():
        for r in m.itertuples():
            size = int(r.bytes)
            out.append(Case(
                source=SOURCE, label=f"{dev} {r.size_label}", metric="busbw_GBps",
                measured=float(getattr(r, col)),
                predict=functools.partial(_predict, dev, size),
                fast=dev == "A100-80GB" and size in FAST_SIZES,
                notes="NVLS (NCCL_ALGO=NVLS, as measured)" if dev != "A100-80GB"
                else "auto (NCCL tuner rule)",
            ))
    return out


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and worst |error| per device and size band."""
    out = []
    for dev, g in frame.groupby("device"):
        for name, lo, hi in BANDS:
            b = g[(g["size"] >= lo) & (g["size"] < hi)]["error"].abs()
            out.append({"device": dev, "band": name, "median_abs_error": b.median(),
                        "max_abs_error": b.max()})
    return pd.DataFrame(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", type=Path, default=MEASURED)
    ap.add_argument("-o", "--output", type=Path, default=Path("validation/out"))
    args = ap.parse_args()
    frame = compare(args.measured)
    args.output.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.output / "nccl_allreduce.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for dev, g in frame.groupby("device"):
        line = ax.plot(g["size"], g["simulated"], "-", label=f"{dev} simulated")[0]
        ax.plot(g["size"], g["measured"], "o--", color=line.get_color(), ms=3,
                label=f"{dev} measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("all-reduce busbw (GB/s)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output / "nccl_allreduce.png", dpi=110)
    pd.set_option("display.width", 120)
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(summary(frame).to_string(index=False, float_format=lambda x: f"{x:.1%}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
