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
from .validate import check_manifest, validate_trace

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
        check_manifest(trace.manifest, "trace manifest")  # group names become file names
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


# Parquet compresses a column of zeros ~1000x: the row count in the file's metadata is
# checked against the manifest before a file is decompressed (a small file cannot hold a bomb).
MAX_EDGES_PER_OP = 64


def _read_parquet(
    path: Path, columns: dict[str, Any], what: str, max_rows: int | None = None
) -> pd.DataFrame:
    if not path.is_file():
        raise TraceError(f"{path}: missing ({what}); the trace directory is incomplete")
    try:
        if max_rows is not None:
            rows = pq.ParquetFile(str(path)).metadata.num_rows
            if rows > max_rows:
                raise TraceError(f"{path}: {rows:,} rows, more than the {max_rows:,} the "
                                 "manifest allows (num_ops)")
        df = pq.read_table(str(path)).to_pandas()
    except (OSError, ValueError, pa.ArrowException) as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"{path}: cannot read Parquet ({str(e)[:200]})") from None
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


MAX_MANIFEST_BYTES = 1 << 28  # 256 MiB; a 65,536-rank manifest is about 7 MB


def _read_manifest(root: Path) -> dict[str, Any]:
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise TraceError(f"{root}: not a trace directory (no {MANIFEST})")
    try:
        with open(mpath, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise TraceError(f"{mpath}: cannot read ({e.strerror or e})") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise TraceError(f"{mpath}: larger than {MAX_MANIFEST_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{mpath}: not UTF-8 text (byte offset {e.start})") from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"{mpath}: not valid JSON ({str(e)[:80]})") from None
    if not isinstance(manifest, dict):
        raise TraceError(f"{mpath}: expected a JSON object (got a {type(manifest).__name__})")
    version = manifest.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
        shown = repr(version) if len(repr(version)) <= 40 else repr(version)[:37] + "..."
        why = (" (version 1 carried NCCL's per-member latency as timed barriers; version 2"
               " puts it on each ring's first flows as a start latency)"
               if version == 1 else "")
        raise TraceError(
            f"{root}: trace schema_version {shown} is not supported{why}; this xsim reads"
            f" schema_version {readable}. Regenerate the trace with `xsim trace PLAN -o {root}`"
            " or upgrade xsim-adapters to a version that reads it."
        )
    check_manifest(manifest, str(mpath))
    return manifest


def read_trace(directory: str | os.PathLike[str]) -> Trace:
    """Read a trace directory written by :func:`write_trace` and validate it in full
    (:func:`xsim_adapters.trace.validate.validate_trace`); TraceError naming file and field."""
    root = Path(directory)
    manifest = _read_manifest(root)
    names = manifest["groups"]
    rank_group = np.array([names.index(r["group"]) for r in manifest["ranks"]], dtype=np.int64)
    parts = []
    for gi, g in enumerate(names):
        gpath = root / "groups" / f"{g}.parquet"  # g is a checked name: no separators
        part = _read_parquet(gpath, OP_COLUMNS, f"ops of group {g}", manifest["num_ops"])
        r = part["rank"].to_numpy().astype(np.int64)
        inside = (r >= 0) & (r < len(rank_group))
        wrong = inside & (rank_group[np.where(inside, r, 0)] != gi)
        if wrong.any():
            bad = int(r[np.flatnonzero(wrong)[0]])
            raise TraceError(f"{gpath}: column rank: rank {bad} belongs to group "
                             f"{names[rank_group[bad]]}, not {g}")
        parts.append(part)
    ops = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(OP_COLUMNS))
    ops = ops.astype(OP_COLUMNS).sort_values("op_id", kind="stable").reset_index(drop=True)
    deps = _read_parquet(root / "deps.parquet", DEP_COLUMNS, "dependency edges",
                         MAX_EDGES_PER_OP * max(len(ops), 1))
    colls = _read_parquet(root / "collectives.parquet", COLLECTIVE_COLUMNS, "collectives",
                          max(len(ops), 1))
    trace = Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest)
    validate_trace(trace, str(root))
    return trace
