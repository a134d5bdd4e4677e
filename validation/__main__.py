"""``python -m validation``: run the validation suite and write its outputs.

Examples::

    python -m validation --fast                 # the CI subset (seconds)
    python -m validation                        # every case of every source (long: see docs)
    python -m validation --source megatron-sc21 --label "18.4B tp8 pp1 256gpu"
    python -m validation --write-docs           # also refresh the table in docs/validation.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from validation import framework as fw

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m validation",
        description="Reproduce published measurements from their configurations alone and "
        "report predicted vs measured (CSV, scatter plot, Markdown table).",
    )
    ap.add_argument("--source", action="append", help="only this source (repeatable)")
    ap.add_argument("--label", action="append", help="only the case with this label (repeatable)")
    ap.add_argument("--fast", action="store_true", help="only the fast subset that CI runs")
    ap.add_argument("--heavy", action="store_true",
                    help="include the heavy cases (tens of millions of ops; see docs)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--out", default="out/validation",
                    help="output directory (default %(default)s)")
    ap.add_argument("--from-csv", action="append", metavar="CSV",
                    help="do not run: rebuild the outputs from results.csv files of earlier runs "
                         "(later files win per source and label); repeatable")
    ap.add_argument("--write-docs", action="store_true",
                    help="replace the generated table in docs/validation.md")
    a = ap.parse_args(argv)
    if a.from_csv:
        merged: dict[tuple[str, str], fw.Result] = {}
        for f in a.from_csv:
            for r in fw.read_csv(Path(f)):
                merged[(r.source, r.label)] = r
        order = {(c.source, c.label): i for i, c in
                 enumerate(fw.select(fw.discover(), heavy=True))}
        rows = sorted(merged.values(), key=lambda r: order.get((r.source, r.label), 1 << 30))
        return _write(rows, a)
    sources = fw.discover()
    try:
        cases = fw.select(sources, a.source, a.fast, a.label, a.heavy or a.list)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.list:
        for c in cases:
            kind = "fast" if c.fast else "heavy" if c.heavy else ""
            print(f"{c.source:16s} {c.label:26s} {kind:5s} {c.metric}")
        return 0
    if not cases:
        print("error: no case matches", file=sys.stderr)
        return 2
    failures: list[tuple[fw.Case, str]] = []
    code = _write(fw.run_cases(cases, failures=failures), a)
    for c, msg in failures:  # every case that did not run, again at the end
        print(f"error: {c.source} {c.label}: {msg}", file=sys.stderr)
    return 1 if failures else code


def _write(results: list[fw.Result], a: argparse.Namespace) -> int:
    out = Path(a.out)
    fw.write_csv(results, out / "results.csv")
    fw.write_plot(results, out / "predicted_vs_measured.png")
    table = fw.markdown_table(results)
    (out / "table.md").write_text(table)
    print()
    print(table)
    print(f"wrote {out / 'results.csv'}, {out / 'predicted_vs_measured.png'}, {out / 'table.md'}")
    if a.write_docs:
        fw.update_doc(ROOT / "docs" / "validation.md", table)
        print("updated docs/validation.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
