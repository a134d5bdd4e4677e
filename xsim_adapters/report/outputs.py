"""Write a run's output directory: timeline, per-rank metrics, summary, pictures.

Every file is written atomically (temporary sibling + ``os.replace``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from .._atomic import write_atomic, write_text_atomic
from ..errors import TraceError
from ..metrics.bundle import Metrics
from ..trace.timeline import Timeline
from .perfetto import write_perfetto
from .plot import plot_timeline


def _jsonable(v: Any) -> Any:
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and not isinstance(v, str):  # numpy scalars
        return _jsonable(v.item())
    return v


def write_json(path: str | Path, obj: Any) -> Path:
    """Pretty JSON, NaN as null, atomically."""
    return write_text_atomic(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


def write_csv(path: str | Path, frame: pd.DataFrame) -> Path:
    """CSV without the index, atomically; nanosecond columns of whole numbers are written as
    integers (:func:`xsim_adapters.metrics.frames.integer_ns`: values never change)."""
    from ..metrics.frames import integer_ns

    table = integer_ns(frame)
    return write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))


def write_timeline(path: str | Path, timeline: Timeline) -> Path:
    """The backend's frame (op_id, start_ns, end_ns) as Parquet; the backend name is stored
    in the file's metadata under ``xsim.backend``."""
    frame = timeline.frame[["op_id", "start_ns", "end_ns"]].copy()
    frame.attrs = {}

    def _w(tmp: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"xsim.backend"] = timeline.backend.encode()
        pq.write_table(table.replace_schema_metadata(meta), tmp)

    return write_atomic(path, _w)


def read_timeline(path: str | Path) -> Timeline:
    """Read a Parquet written by :func:`write_timeline`."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot read timeline: {exc}") from exc
    backend = (table.schema.metadata or {}).get(b"xsim.backend", b"unknown").decode()
    return Timeline(backend=backend, frame=table.to_pandas())


def write_run(out: str | Path, timeline: Timeline, met: Metrics, plots: bool = True,
              title: str = "") -> list[Path]:
    """Write ``timeline.parquet``, ``ranks.csv``, ``summary.json`` and, with ``plots``,
    ``timeline.png`` and ``timeline.perfetto.json`` into ``out`` (without, removes those of an
    earlier run there); returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        write_timeline(out / "timeline.parquet", timeline),
        write_csv(out / "ranks.csv", met.ranks),
        write_json(out / "summary.json", met.summary),
    ]
    if plots:
        paths.append(plot_timeline(out / "timeline.png", met.timeline, met.ranks, title,
                                   stragglers=met.stragglers))
        paths.append(write_perfetto(out / "timeline.perfetto.json", met.timeline, met.ranks))
    else:
        # Pictures of an earlier run in the same directory would contradict the new numbers.
        for stale in ("timeline.png", "timeline.perfetto.json"):
            (out / stale).unlink(missing_ok=True)
    return paths


def write_links(out: str | Path, links: pd.DataFrame, plots: bool = True, title: str = ""
                ) -> list[Path]:
    """Write ``links.csv`` (:func:`~xsim_adapters.metrics.links.link_metrics`) and, with
    ``plots``, ``links.png`` (the hottest links) into ``out``; returns the paths written."""
    from .plot_links import plot_links

    out = Path(out)
    paths = [write_csv(out / "links.csv", links)]
    if plots:
        paths.append(plot_links(out / "links.png", links, title))
    return paths
