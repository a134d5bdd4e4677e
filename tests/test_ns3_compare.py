"""`xsim compare --backends flow,ns3` on a shipped plan, with ns-3 at its defaults.

The plan tests in test_ns3_plans.py use paced UDP at a large MTU to stay fast; this one runs the
defaults a user gets (DCTCP with RED-ECN, MTU 9000, fluid scale-up) on the heterogeneous pipeline,
whose resharding (H100 TP 8 -> A100 TP 4) crosses the NICs in both directions.

Tolerance 5%: DCTCP's slow start, ACK traffic sharing the NIC links with data and the window
dynamics add a few percent over the flow backend's fluid ideal (measured +1.4% on
homogeneous-h100, +3.7% on an 8-rank ring at 100 Gb/s: docs/ns3.md); ns-3 must never be faster
than the fluid ideal by more than rounding, since the flow backend is a lower bound here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import WORKLOADS
from helpers.ns3 import needs_ns3

import xsim_adapters as xs
from xsim_adapters import cli
from xsim_adapters.backends.base import flow_totals

RESHARD = WORKLOADS / "hetero-pipeline-reshard.yaml"

pytestmark = [*needs_ns3, pytest.mark.slow]


def test_compare_flow_and_ns3_defaults_on_the_reshard_plan(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(RESHARD), "--backends", "flow,ns3", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ns3 vs flow: iteration time" in printed
    table = pd.read_csv(out / "compare.csv").set_index("metric")
    row = table.loc["iteration_time_ns"]
    assert (row["backend_a"], row["backend_b"]) == ("flow", "ns3")
    assert -1e-4 <= row["rel_diff"] <= 0.05, row.to_dict()
    # Resharding is where the two differ: it is the only traffic on the NICs. Its phase total is
    # rank-ns of busy time (per rank, the union of its reshard flows), which is not bounded below
    # by the flow backend's: two flows into one A100 NIC share it unfairly under DCTCP (measured
    # 129 us for one, 171-185 us for the other; the flow backend gives both 170 us), so their
    # busy times sum to less while the pair still ends no earlier. Measured ns-3/flow: 0.961.
    reshard = table.loc["phase_reshard_ns"]
    assert 0.90 * reshard["value_a"] <= reshard["value_b"] <= 1.05 * reshard["value_a"]
    # Compute is identical on both backends (same trace, compute is not simulated by the network).
    assert table.loc["phase_fwd_ns", "abs_diff"] == pytest.approx(0.0, abs=1.0)
    ranks = pd.read_csv(out / "compare_ranks.csv")
    assert len(ranks) == 12
    assert (out / "compare.png").is_file()
    # What each backend simulated: conserved flows and bytes, and ns-3's packets vs fluid
    # (issue 14 measured 99.9% of ns-3's bytes on this plan timed by the fluid scale-up model).
    info = pd.read_csv(out / "compare_runs.csv").set_index("backend")
    trace = xs.read_trace(out / "trace")
    flows, nbytes = flow_totals(trace)
    assert (info["packet_flows"] + info["fluid_flows"] == flows).all()
    assert (info["packet_bytes"] + info["fluid_bytes"] == nbytes).all()
    assert info.loc["flow", "packet_flows"] == 0
    assert info.loc["ns3", "packet_flows"] > 0 and info.loc["ns3", "fluid_bytes_pct"] > 90.0
    assert (info["startup_s"] > 0).all() and (info["replay_s"] > 0).all()
    assert (info["startup_s"] + info["replay_s"] <= info["wall_s"]).all()
    assert "ns3: packets " in printed and "start-up " in printed
    # one shortest path per GPU pair on this fabric: ns-3 routes every flow as the flow backend
    assert (info["off_route_flows"] == 0).all() and "other links" not in printed
