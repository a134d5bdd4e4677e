"""The trace on disk: atomic, deterministic writes and validating reads.

Layout (see :mod:`xsim_adapters.trace.schema`)::

    DIR/manifest.json
    DIR/groups/<device group>.parquet
    DIR/deps.parquet
    DIR/collectives.parquet

:func:`write_trace` writes everything into a temporary sibling directory (manifest last), then
renames it into place; an existing trace at ``DIR`` is replaced only once the new one is
complete, and a failure removes the temporary directory. Parquet files carry no timestamps, so
the same trace always gives the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import TraceError
from .schema import (
    COLLECTIVE_COLUMNS,
    DEP_COLUMNS,
    OP_COLUMNS,
    SCHEMA_VERSION,
    Trace,
)

SUPPORTED_SCHEMA_VERSIONS = (SCHEMA_VERSION,)
MANIFEST = "manifest.json"


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    # No pandas metadata: it is redundant with the schema and keeps files byte-stable.
    table = table.replace_schema_metadata(None)
    pq.write_table(table, str(path), compression="zstd")


def _group_of_ops(trace: Trace) -> tuple[list[str], np.ndarray]:
    """Group names and, per op, the index of the group file it goes to."""
    names = list(trace.manifest["groups"])
    rank_group = {r["rank"]: names.index(r["group"]) for r in trace.manifest["ranks"]}
    lookup = np.zeros(max(rank_group, default=-1) + 2, dtype=np.int64)
    for rank, gi in rank_group.items():
        lookup[rank] = gi
    ranks = trace.ops["rank"].to_numpy().astype(np.int64)
    # Ops with rank -1 (barriers with no owner) go to the first group.
    return names, np.where(ranks >= 0, lookup[np.maximum(ranks, 0)], 0)


def write_trace(
    trace: Trace,
    directory: str | os.PathLike[str],
    *,
    extra_files: Mapping[str, str | bytes] | None = None,
) -> Path:
    """Write ``trace`` to ``directory`` atomically; returns the directory path.

    ``extra_files`` (relative name -> text or bytes, e.g. ``{"plan.yaml": ...}``) are written
    into the same temporary directory, so they appear together with the trace or not at all.
    """
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        (tmp / "groups").mkdir()
        names, gidx = _group_of_ops(trace)
        for gi, name in enumerate(names):
            part = trace.ops[gidx == gi].reset_index(drop=True)
            _write_parquet(part, tmp / "groups" / f"{name}.parquet")
        _write_parquet(trace.deps.reset_index(drop=True), tmp / "deps.parquet")
        _write_parquet(trace.collectives.reset_index(drop=True), tmp / "collectives.parquet")
        for name, content in (extra_files or {}).items():
            dest = tmp / name
            if dest.resolve().parent != tmp.resolve() or name == MANIFEST:
                raise ValueError(f"extra_files: {name!r} must be a plain file name, not {MANIFEST}")
            if isinstance(content, bytes):
                dest.write_bytes(content)
            else:
                dest.write_text(content)
        text = json.dumps(trace.manifest, indent=1, sort_keys=True) + "\n"
        (tmp / MANIFEST).write_text(text)  # last: a directory without it is not a trace
        os.chmod(tmp, 0o755)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "trace")
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _read_parquet(path: Path, columns: dict[str, Any], what: str) -> pd.DataFrame:
    if not path.is_file():
        raise TraceError(f"{path}: missing ({what}); the trace directory is incomplete")
    try:
        df = pq.read_table(str(path)).to_pandas()
    except (OSError, pa.ArrowException) as e:
        raise TraceError(f"{path}: cannot read Parquet ({e})") from e
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: missing columns {', '.join(missing)}")
    for c, t in columns.items():
        want = np.dtype(t)
        if want == np.dtype(object):
            if not (pd.api.types.is_string_dtype(df[c]) or df[c].dtype == want):
                raise TraceError(f"{path}: column {c} has dtype {df[c].dtype}, expected strings")
            # pandas >= 3 reads Arrow strings as its str dtype; the schema says object
            df[c] = df[c].astype(object)
        elif df[c].dtype != want:
            raise TraceError(f"{path}: column {c} has dtype {df[c].dtype}, expected {want}")
    return df[list(columns)]


def read_trace(directory: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace directory written by :func:`write_trace`."""
    root = Path(directory)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise TraceError(f"{root}: not a trace directory (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as e:
        raise TraceError(f"{mpath}: not valid JSON ({e})") from e
    version = manifest.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
        raise TraceError(
            f"{root}: trace schema_version {version!r} is not supported; this xsim reads"
            f" schema_version {readable}. Regenerate the trace with `xsim trace PLAN -o {root}`"
            " or upgrade xsim-adapters to a version that reads it."
        )
    for key in ("groups", "ranks", "num_ops"):
        if key not in manifest:
            raise TraceError(f"{mpath}: manifest has no {key!r}")
    parts = [
        _read_parquet(root / "groups" / f"{g}.parquet", OP_COLUMNS, f"ops of group {g}")
        for g in manifest["groups"]
    ]
    ops = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(OP_COLUMNS))
    ops = ops.sort_values("op_id", kind="stable").reset_index(drop=True)
    ids = ops["op_id"].to_numpy()
    if len(ops) != manifest["num_ops"] or not np.array_equal(ids, np.arange(len(ops))):
        raise TraceError(
            f"{root}: op ids are not dense 0..{manifest['num_ops'] - 1}"
            f" ({len(ops)} ops across {len(parts)} group files)"
        )
    deps = _read_parquet(root / "deps.parquet", DEP_COLUMNS, "dependency edges")
    if len(deps) and (
        deps["pred"].min() < 0
        or deps["succ"].min() < 0
        or max(deps["pred"].max(), deps["succ"].max()) >= len(ops)
    ):
        raise TraceError(f"{root}/deps.parquet: an edge names an op id outside 0..{len(ops) - 1}")
    colls = _read_parquet(root / "collectives.parquet", COLLECTIVE_COLUMNS, "collectives")
    return Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest)
