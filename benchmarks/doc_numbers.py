"""The op counts and flow-backend iteration times the docs quote for the shipped plans, from the
code as it is: print them, or check the docs' tables against them.

Usage::

    python benchmarks/doc_numbers.py                      # Markdown table of every shipped plan
    python benchmarks/doc_numbers.py --plans workloads/uneven-layers.yaml
    python benchmarks/doc_numbers.py --check              # stale op counts in the docs' tables
    python benchmarks/doc_numbers.py --check docs/flow.md docs/ns3.md
    python benchmarks/doc_numbers.py --searches workloads/search/h100-a100-16gpu.yaml

For each plan: the trace's op count (``xsim trace``), and its iteration time on the flow
backend (``xsim run``; deterministic, so the same on every machine). The scale plans (thousands
of GPUs, minutes each) are left out unless named with ``--plans``; no packet-level simulator is
run (ns-3 and htsim walls and event counts are measurements, dated where the docs quote them).

``--check`` reads each Markdown table row of the docs whose first cell names a shipped plan
(``| uneven-layers | 50,428 | ...`` or ``| uneven-layers (12) | ...``) and compares the first
cell that is an op count (an integer of five digits or more) with the plan's; it prints one
line per stale count (file:line, plan, quoted, now) and exits 1 if there is any; a row of
measurements keeps the count it was measured with and adds today's as ``821,080 (now
859,040)``, which is checked instead. It checks op
counts only where the row has an ``ops`` column (the header names it): other integers
(events, flows, bytes) are not op counts.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "workloads"
#: Plans of thousands of GPUs: minutes each (docs/scale.md); only when named.
SCALE_PLANS = frozenset({"megatron-1t-3072gpu", "llama3-405b-16k-h100", "llama3-405b-16k-hetero"})
#: The docs that quote op counts or flow-backend iteration times of shipped plans.
DOCS = ("README.md", "docs/flow.md", "docs/ns3.md", "docs/htsim.md", "docs/search.md")


def plan_numbers(path: Path) -> tuple[int, int]:
    """(op count, flow-backend iteration time in ns) of the shipped plan at ``path``."""
    import xsim_adapters as xs

    plan = xs.load_plan(path)
    trace = xs.generate(plan)
    tl = xs.run(plan, "flow", trace=trace)
    return trace.num_ops, int(tl.makespan_ns)


def search_best(path: Path) -> tuple[str, int]:
    """(best candidate's key, its flow-backend iteration time in ns) of the search spec at
    ``path`` (``xsim search`` with its defaults, baselines off: they do not change the best)."""
    from xsim_adapters.search import search

    res = search(path, baselines=False)
    best = res.summary["search"]
    return str(best["best"]), int(best["best_iteration_time_ns"])


def shipped(plans: list[str] | None) -> list[Path]:
    """The plan files to measure: ``plans`` as given, else every shipped plan but the scale
    ones."""
    if plans:
        return [Path(p) for p in plans]
    return sorted(p for p in WORKLOADS.glob("*.yaml") if p.stem not in SCALE_PLANS)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def stale_counts(doc: Path, ops: dict[str, int]) -> list[str]:
    """One line per table row of ``doc`` that quotes another op count than ``ops`` has."""
    out = []
    ops_col: int | None = None
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if not line.lstrip().startswith("|"):
            ops_col = None
            continue
        cells = _cells(line)
        low = [c.lower() for c in cells]
        if "ops" in low:  # a header row: where the op count is
            ops_col = low.index("ops")
            continue
        if ops_col is None or ops_col >= len(cells):
            continue
        name = re.sub(r"\s*\(.*\)$", "", cells[0].strip("`* "))
        # a measured row keeps the count it was measured with and says today's: "N (now M)"
        cell = re.sub(r"^.*\(now ([0-9,]+)\)$", r"\1", cells[ops_col].strip("* "))
        m = re.fullmatch(r"([0-9]{1,3}(?:,[0-9]{3})+|[0-9]{5,})", cell)
        if name in ops and m:
            quoted = int(m.group(1).replace(",", ""))
            if quoted != ops[name]:
                out.append(f"{doc.relative_to(REPO)}:{n}: {name}: quotes {quoted:,} ops, "
                           f"the trace has {ops[name]:,}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", nargs="*", help="plan files (default: every shipped plan but "
                    "the scale plans)")
    ap.add_argument("--check", nargs="*", metavar="DOC",
                    help=f"check these docs' tables (default: {', '.join(DOCS)})")
    ap.add_argument("--searches", nargs="*", metavar="SPEC",
                    help="also print the best plan of these search specs (none given: every "
                    "spec in workloads/search/), as docs/search.md quotes them")
    args = ap.parse_args(argv)
    if args.searches is not None:
        specs = ([Path(p) for p in args.searches] if args.searches
                 else sorted((WORKLOADS / "search").glob("*.yaml")))
        print("| search spec | best | flow iteration |")
        print("|---|---|---|")
        for spec in specs:
            key, it = search_best(spec)
            cell = key.replace("|", "\\|")  # a pipe inside a Markdown cell
            print(f"| {spec.name} | `{cell}` | {it / 1e6:,.1f} ms |")
        if not args.plans and args.check is None:
            return 0
    rows = {}
    for path in shipped(args.plans):
        rows[path.stem] = plan_numbers(path)
    if args.check is None:
        print("| plan | ops | flow iteration |")
        print("|---|---|---|")
        for name, (ops, it) in rows.items():
            print(f"| {name} | {ops:,} | {it / 1e6:.3f} ms |")
        return 0
    docs = [REPO / d for d in (args.check or DOCS)]
    bad = [s for d in docs for s in stale_counts(d, {k: v[0] for k, v in rows.items()})]
    for line in bad:
        print(line)
    print(f"{len(bad)} stale op count(s) in {len(docs)} doc(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
