"""``network.measured``: measured bandwidth and latency between sites (groups of device groups).

Two forms (docs/topology.md, "Measured matrix"):

- a mapping ``{groups: [...], gbps: [[...]], latency_us: [[...]]}``: one entry of ``groups`` per
  site, a device group name or a list of names; row i, column j of each matrix is from site i
  to site j; the diagonal is ``null`` or 0 (inside a site the scale-out fabric applies); an
  off-diagonal ``null`` means no direct path (traffic goes through another site);
  ``latency_us`` is optional (default: ``network.scale_out.latency_us`` for every pair);
- a path to a CSV file with the header ``src,dst,gbps,latency_us`` and one row per directed pair
  of device groups (every group its own site, in order of first appearance).

Whether every device group is in exactly one site is checked by :func:`check_sites`.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .model import DeviceGroup, MeasuredSpec

MEASURED_KEYS = ("groups", "gbps", "latency_us")
CSV_COLUMNS = ("src", "dst", "gbps", "latency_us")
MAX_MEASURED_CSV_BYTES = 1 << 20
# Sites of one matrix: each is at least one device group, and the matrix is sites^2 cells (256
# sites: 65,280 measured pairs, above the YAML form's 50,000-value limit).
MAX_MEASURED_SITES = 256


def parse_measured(
    value: Any, path: str, default_latency_us: float, base_dir: str | None
) -> MeasuredSpec:
    """``network.measured`` (mapping or CSV path) -> MeasuredSpec with full matrices."""
    if isinstance(value, str):
        return _from_csv(value, path, default_latency_us, base_dir)
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, MEASURED_KEYS, ("groups", "gbps"))
    gpath = f.join(path, "groups")
    sites: list[tuple[str, ...]] = []
    for i, entry in enumerate(f.expect_list(m["groups"], gpath)):
        names = entry if isinstance(entry, list) else [entry]
        if not names or not all(isinstance(x, str) and x for x in names):
            raise PlanError(
                f.join(gpath, i),
                f"expected a device group name or a non-empty list of names (got {f.got(entry)})",
            )
        sites.append(tuple(names))
    if not 2 <= len(sites) <= MAX_MEASURED_SITES:
        raise PlanError(gpath, f"expected 2 to {MAX_MEASURED_SITES} sites (MAX_MEASURED_SITES) "
                               f"(got {len(sites)})")
    n = len(sites)
    gbps = _matrix(m["gbps"], f.join(path, "gbps"), n, positive=True)
    if m.get("latency_us") is None:
        lat = tuple(tuple(None if i == j or gbps[i][j] is None else default_latency_us
                          for j in range(n)) for i in range(n))
    else:
        lat = _matrix(m["latency_us"], f.join(path, "latency_us"), n, positive=False)
        for i in range(n):
            for j in range(n):
                if (gbps[i][j] is None) != (lat[i][j] is None):
                    raise PlanError(
                        f"{path}.latency_us[{i}][{j}]",
                        f"expected a number exactly where gbps[{i}][{j}] has one (got "
                        f"{f.got(lat[i][j])} beside gbps {f.got(gbps[i][j])})",
                    )
    gap = _missing_path(gbps)
    if gap is not None:
        i, j = gap
        raise PlanError(f"{path}.gbps[{i}][{j}]", "expected a measured rate: "
                        f"{_no_path(i, j, [' + '.join(x) for x in sites])} (got null)")
    return MeasuredSpec(sites=tuple(sites), gbps=gbps, latency_us=lat)


def _missing_path(gbps: Sequence[Sequence[float | None]]) -> tuple[int, int] | None:
    """The first pair (i, j) of sites such that site i cannot reach site j over the measured
    links, directly or through other sites (a one-way or missing measurement), or None."""
    n = len(gbps)
    reach = np.array([[i == j or gbps[i][j] is not None for j in range(n)] for i in range(n)])
    for k in range(n):  # transitive closure (Warshall), n <= MAX_MEASURED_SITES
        reach |= reach[:, k:k + 1] & reach[k:k + 1, :]
    missing = np.argwhere(~reach)
    return (int(missing[0][0]), int(missing[0][1])) if len(missing) else None


def _no_path(i: int, j: int, names: Sequence[str]) -> str:
    return (f"site {i} ({f.text(names[i], 80)}) has no path to site {j} "
            f"({f.text(names[j], 80)}), directly or through another site")


def _matrix(
    value: Any, path: str, n: int, *, positive: bool
) -> tuple[tuple[float | None, ...], ...]:
    rows = f.expect_list(value, path)
    if len(rows) != n:
        raise PlanError(path, f"expected {n} rows, one per site (got {len(rows)})")
    out = []
    for i, row in enumerate(rows):
        rpath = f.join(path, i)
        cells = f.expect_list(row, rpath)
        if len(cells) != n:
            raise PlanError(rpath, f"expected {n} columns, one per site (got {len(cells)})")
        parsed: list[float | None] = []
        for j, v in enumerate(cells):
            if i == j:
                if v not in (None, 0):
                    raise PlanError(
                        f"{rpath}[{j}]",
                        "expected null or 0 on the diagonal (inside a site the scale-out "
                        f"fabric applies) (got {f.got(v)})",
                    )
                parsed.append(None)
            elif v is None:
                parsed.append(None)
            else:  # an int key: the message names the cell as rpath[j]
                cell: Any = {j: v}
                key: Any = j
                if positive:
                    parsed.append(f.get_number(cell, key, rpath, at_least=lim.MIN_RATE,
                                               at_most=lim.MAX_RATE))
                else:
                    parsed.append(f.get_number(cell, key, rpath, positive=False,
                                               at_most=lim.MAX_TIME_US))
        out.append(tuple(parsed))
    return tuple(out)


def _from_csv(
    given: str, path: str, default_latency_us: float, base_dir: str | None
) -> MeasuredSpec:
    from .sections import read_text_file  # late: sections imports this module

    resolved = os.path.abspath(os.path.join(base_dir or os.getcwd(), given))
    if not os.path.isfile(resolved):
        raise PlanError(path, f"measured CSV not found at {f.text(resolved)} (got {f.got(given)})")
    text = read_text_file(resolved, path, "measured CSV", MAX_MEASURED_CSV_BYTES)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in CSV_COLUMNS[:3] if c not in header]
    if missing:
        raise PlanError(
            path, f"expected CSV columns {', '.join(CSV_COLUMNS)} in the header line of "
            f"{resolved}; missing {', '.join(missing)}"
        )
    rows: list[tuple[str, str, float, float]] = []
    for row in reader:
        where = f"{path} ({resolved}, line {reader.line_num})"
        src, dst = (str(row.get(k) or "").strip() for k in ("src", "dst"))
        if not src or not dst or src == dst:
            raise PlanError(where, f"expected two different group names (got {f.got(src)}, "
                                   f"{f.got(dst)})")
        try:
            gbps = float(str(row.get("gbps") or "").strip())
            lat_text = str(row.get("latency_us") or "").strip()
            lat = float(lat_text) if lat_text else default_latency_us
        except ValueError:
            raise PlanError(where, "expected numbers in columns gbps and latency_us") from None
        if not lim.MIN_RATE <= gbps <= lim.MAX_RATE:
            raise PlanError(where, f"gbps: expected a number in [{lim.MIN_RATE:g}, "
                            f"{lim.MAX_RATE:g}] (got {gbps:g})")
        if not 0 <= lat <= lim.MAX_TIME_US:
            raise PlanError(where, f"latency_us: expected a number in [0, {lim.MAX_TIME_US:g}] "
                            f"(got {lat:g})")
        rows.append((src, dst, gbps, lat))
    names: list[str] = []
    index: dict[str, int] = {}
    for src, dst, _, _ in rows:
        for x in (src, dst):
            if x not in index:
                index[x] = len(names)
                names.append(x)
        if len(names) > MAX_MEASURED_SITES:
            raise PlanError(path, f"{resolved}: expected rows between at most "
                                  f"{MAX_MEASURED_SITES} groups (MAX_MEASURED_SITES) (got more)")
    if len(names) < 2:
        raise PlanError(path, f"{resolved}: expected rows between at least two groups")
    n = len(names)
    g: list[list[float | None]] = [[None] * n for _ in range(n)]
    lt: list[list[float | None]] = [[None] * n for _ in range(n)]
    for src, dst, gbps, lat in rows:
        i, j = index[src], index[dst]
        if g[i][j] is not None:
            raise PlanError(path, f"{resolved}: the pair {f.text(src, 80)} -> "
                                  f"{f.text(dst, 80)} is listed twice")
        g[i][j], lt[i][j] = gbps, lat
    gap = _missing_path(g)
    if gap is not None:
        i, j = gap
        raise PlanError(path, f"{resolved}: expected a row {f.text(names[i], 80)},"
                        f"{f.text(names[j], 80)}: {_no_path(i, j, names)} (got no such row)")
    return MeasuredSpec(
        sites=tuple((x,) for x in names),
        gbps=tuple(tuple(r) for r in g),
        latency_us=tuple(tuple(r) for r in lt),
    )


def check_sites(spec: MeasuredSpec, groups: Sequence[DeviceGroup], path: str) -> None:
    """Every device group is in exactly one site, and every site names known groups."""
    known = {g.name for g in groups}
    seen: dict[str, int] = {}
    for i, site in enumerate(spec.sites):
        for name in site:
            if name not in known:
                raise PlanError(
                    f"{path}.groups[{i}]",
                    f"unknown device group; expected one of {', '.join(sorted(known))} "
                    f"(got {f.got(name)})",
                )
            if name in seen:
                raise PlanError(
                    f"{path}.groups[{i}]",
                    f"device group {name} is already in site {seen[name]}",
                )
            seen[name] = i
    unlisted = [g.name for g in groups if g.name not in seen]
    if unlisted:
        raise PlanError(
            f"{path}.groups",
            f"every device group must be in one site; missing {', '.join(unlisted)}",
        )
