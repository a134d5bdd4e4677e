"""The validation framework: cases, running them, and the CSV / plot / Markdown outputs.

A *source* is a module of the ``validation`` package that defines ``SOURCE`` (a short name)
and ``cases() -> list[Case]``. A :class:`Case` is one published measurement: what was measured
(``metric``, ``measured``), how to predict it (``predict``, a callable that writes a plan or a
trace from the published configuration and simulates it), and whether it belongs to the fast
subset that CI runs. Nothing here is fitted: a case's prediction uses the shipped defaults.
"""

from __future__ import annotations

import csv
import functools
import importlib
import pkgutil
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
SKIP_MODULES = {"framework", "__main__"}


@dataclass(frozen=True)
class Case:
    """One published measurement and the recipe that predicts it."""

    source: str  # e.g. "megatron-sc21"
    label: str  # row label, unique within the source
    metric: str  # what is compared, with its unit (e.g. "iteration_time_s")
    measured: float
    predict: Callable[[], float]
    fast: bool = False  # part of the CI subset
    notes: str = ""
    heavy: bool = False  # too large for a default run (tens of millions of ops); --heavy


@dataclass(frozen=True)
class Result:
    """A case's outcome: predicted vs measured, relative error and wall time of the run."""

    source: str
    label: str
    metric: str
    measured: float
    predicted: float
    wall_s: float
    notes: str = ""

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: positive means predicted too high."""
        return self.predicted / self.measured - 1.0


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a source's data CSV, as dicts of strings."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def row_case(source: str, label: str, row: dict[str, Any],
             predict: Callable[[dict[str, Any]], float], **kw: Any) -> Case:
    """A case of a data row with ``metric`` and ``measured`` columns, predicted by
    ``predict(row)``; ``kw``: the other Case fields (``heavy``, ``fast``, ``notes``)."""
    return Case(source=source, label=label, metric=row["metric"],
                measured=float(row["measured"]), predict=functools.partial(predict, row), **kw)


def simulate_summary(plan: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(Plan, metrics summary) of a plan dict simulated whole on the flow backend.

    The memory check is skipped: these runs happened, so a stage the memory model finds too
    big (it keeps no allocator slack, but counts every buffer at its peak) still ran."""
    import xsim_adapters as xs
    from xsim_adapters.feasibility import plan_from_dict

    p = plan_from_dict(plan, feasibility=False)
    trace = xs.generate(p)
    tl = xs.run(trace, "flow", topology=xs.build_topology(p))
    return p, xs.metrics(trace, tl).summary


def discover() -> dict[str, Callable[[], list[Case]]]:
    """Every source module of the package: {SOURCE: cases function}."""
    out: dict[str, Callable[[], list[Case]]] = {}
    for info in pkgutil.iter_modules([str(HERE)]):
        if info.name in SKIP_MODULES or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"validation.{info.name}")
        if hasattr(mod, "SOURCE") and hasattr(mod, "cases"):
            out[mod.SOURCE] = mod.cases
    return dict(sorted(out.items()))


def select(
    sources: dict[str, Callable[[], list[Case]]],
    names: Sequence[str] | None = None,
    fast_only: bool = False,
    labels: Sequence[str] | None = None,
    heavy: bool = False,
) -> list[Case]:
    """The cases of the named sources (all if None), optionally only the fast subset or labels.

    Heavy cases are left out unless ``heavy`` or named by label.
    """
    unknown = sorted(set(names or ()) - set(sources))
    if unknown:
        raise ValueError(f"unknown source(s) {', '.join(unknown)}; known: {', '.join(sources)}")
    out = []
    for name, fn in sources.items():
        if names and name not in names:
            continue
        for c in fn():
            if fast_only and not c.fast:
                continue
            if labels and c.label not in labels:
                continue
            if c.heavy and not heavy and not labels:
                continue
            out.append(c)
    return out


def run_cases(cases: Iterable[Case], log: Callable[[str], None] = print,
              failures: list[tuple[Case, str]] | None = None) -> list[Result]:
    """Run every case in order; log one line per case as it finishes.

    With ``failures`` (a list), a case whose simulation raises is logged with its error,
    appended there and skipped, so the other cases still run (the caller reports them and
    fails); without it the error propagates."""
    results = []
    for c in cases:
        t0 = time.perf_counter()
        try:
            pred = float(c.predict())
        except Exception as e:  # noqa: BLE001 - any simulator or plan error of one case
            if failures is None:
                raise
            msg = f"{type(e).__name__}: {e}"
            log(f"{c.source:16s} {c.label:24s} FAILED {msg}")
            failures.append((c, msg))
            continue
        r = Result(c.source, c.label, c.metric, c.measured, pred, time.perf_counter() - t0, c.notes)
        log(
            f"{r.source:16s} {r.label:24s} measured {r.measured:10.4g} predicted "
            f"{r.predicted:10.4g} error {100 * r.error:+6.1f}%  ({r.wall_s:.1f} s)"
        )
        results.append(r)
    return results


def summary(results: Sequence[Result]) -> dict[str, dict[str, float]]:
    """Per source (and 'all'): n, median |error|, worst |error| (signed), mean signed error."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.source, []).append(r)
    if len(groups) > 1:
        groups["all"] = list(results)
    out = {}
    for name, rs in groups.items():
        errs = [r.error for r in rs]
        worst = max(errs, key=abs)
        out[name] = {
            "n": len(rs),
            "median_abs_error": statistics.median(abs(e) for e in errs),
            "worst_error": worst,
            "mean_error": statistics.fmean(errs),
        }
    return out


CSV_COLUMNS = ("source", "label", "metric", "measured", "predicted", "error_pct", "wall_s", "notes")


def write_csv(results: Sequence[Result], path: Path) -> None:
    """One row per case (atomic: temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in results:
            w.writerow([r.source, r.label, r.metric, f"{r.measured:.6g}", f"{r.predicted:.6g}",
                        f"{100 * r.error:.2f}", f"{r.wall_s:.2f}", r.notes])
    tmp.replace(path)


def read_csv(path: Path) -> list[Result]:
    """Results written by :func:`write_csv` (to combine runs made separately)."""
    with open(path, newline="") as fh:
        return [
            Result(r["source"], r["label"], r["metric"], float(r["measured"]),
                   float(r["predicted"]), float(r["wall_s"]), r["notes"])
            for r in csv.DictReader(fh)
        ]


#: Axis label of each compared metric (its quantity and unit): one panel per metric, so
#: seconds, GB/s and TFLOP/s never share an axis.
METRIC_LABELS = {
    "iteration_time_s": "iteration time (s)",
    "busbw_GBps": "all-reduce bus bandwidth (GB/s)",
    "tflops_per_gpu": "achieved TFLOP/s per GPU",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
}


def write_plot(results: Sequence[Result], path: Path) -> None:
    """:func:`plot_figure` of ``results`` to PNG ``path`` (temporary sibling, then rename)."""
    import matplotlib.pyplot as plt

    fig = plot_figure(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def plot_figure(results: Sequence[Result]) -> Any:
    """Scatter of predicted vs measured (log-log over several decades), one panel per metric
    (so one unit per axis), one colour per source, with the y = x line and +-15% lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({r.metric for r in results}, key=lambda m: (m != "iteration_time_s", m))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 5), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        rows = [r for r in results if r.metric == metric]
        by_source: dict[str, list[Result]] = {}
        for r in rows:
            by_source.setdefault(r.source, []).append(r)
        lo = min(min(r.measured, r.predicted) for r in rows)
        hi = max(max(r.measured, r.predicted) for r in rows)
        xs = [lo / 1.2, hi * 1.2]
        ax.plot(xs, xs, color="grey", lw=1, ls="--", label="y = x")
        for f in (0.85, 1.15):
            ax.plot(xs, [x * f for x in xs], color="grey", lw=0.6, ls=":")
        ax.plot([], [], color="grey", lw=0.6, ls=":", label="±15%")
        for name, rs in by_source.items():
            ax.scatter([r.measured for r in rs], [r.predicted for r in rs], label=name, s=28)
        if hi / lo > 10:  # several decades: log-log; a narrow range keeps linear ticks
            ax.set_xscale("log")
            ax.set_yscale("log")
        label = METRIC_LABELS.get(metric, metric)
        ax.set_xlabel(f"measured (published): {label}")
        ax.set_ylabel(f"predicted (xsim, flow backend): {label}")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("xsim-adapters validation: predicted vs measured")
    fig.tight_layout()
    return fig


def markdown_table(results: Sequence[Result]) -> str:
    """The results and the per-source summary as Markdown (what docs/validation.md embeds)."""
    lines = [
        "| source | case | metric | measured | predicted | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.source} | {r.label} | {r.metric} | {r.measured:.4g} | "
                     f"{r.predicted:.4g} | {100 * r.error:+.1f}% |")
    lines += ["", "| source | cases | median abs error | worst error | mean error |",
              "|---|---|---|---|---|"]
    for name, s in summary(results).items():
        lines.append(f"| {name} | {int(s['n'])} | {100 * s['median_abs_error']:.1f}% | "
                     f"{100 * s['worst_error']:+.1f}% | {100 * s['mean_error']:+.1f}% |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"


def update_doc(doc: Path, table: str) -> None:
    """Replace the generated block between the markers of ``doc`` with ``table``."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(head + BEGIN + "\n" + table + END + tail)
    tmp.replace(doc)
