"""benchmarks/doc_numbers.py finds the stale op counts in the docs' tables (issue 31)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dn():
    spec = importlib.util.spec_from_file_location("doc_numbers", REPO / "benchmarks" /
                                                  "doc_numbers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stale_counts_in_ops_columns_only(dn, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dn, "REPO", tmp_path)
    doc = tmp_path / "d.md"
    doc.write_text(
        "| plan | ops | events |\n|---|---|---|\n"
        "| uneven-layers | 50,428 | 114,480 |\n"          # right
        "| hetero-dp-h100-a100 (16) | 821,080 | 1,947,480 |\n"  # stale
        "| homogeneous-h100 | 59,000 (now 59,040) | 9 |\n"  # measured row, today's count right
        "\n| plan | events |\n|---|---|\n| uneven-layers | 99,999 |\n")  # no ops column
    ops = {"uneven-layers": 50_428, "hetero-dp-h100-a100": 859_040, "homogeneous-h100": 59_040}
    assert dn.stale_counts(doc, ops) == [
        "d.md:4: hetero-dp-h100-a100: quotes 821,080 ops, the trace has 859,040"]


def test_the_shipped_docs_quote_todays_counts(dn) -> None:
    # the plans of the docs' op-count tables (generation only: a few seconds each)
    import xsim_adapters as xs

    names = ("uneven-layers", "homogeneous-h100", "hetero-pipeline-reshard")
    ops = {n: xs.generate(xs.load_plan(REPO / "workloads" / f"{n}.yaml")).num_ops for n in names}
    stale = [s for d in dn.DOCS for s in dn.stale_counts(REPO / d, ops)]
    assert stale == []
