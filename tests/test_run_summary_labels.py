"""`xsim run`'s summary names which straggler wait and bubble overlap communication (issue 31)."""

from __future__ import annotations

from xsim_adapters.cli.run import print_summary


def _summary() -> dict:
    means = {
        "compute_ns": 500_000_000, "comm_ns": 300_000_000, "exposed_comm_ns": 100_000_000,
        "bubble_ns": 40_000_000, "straggler_wait_ns": 22_100_000, "idle_ns": 60_000_000,
        "breakdown_compute_ns": 500_000_000, "breakdown_exposed_comm_ns": 100_000_000,
        "breakdown_straggler_wait_ns": 2_900_000, "breakdown_bubble_ns": 30_000_000,
        "breakdown_other_ns": 27_100_000,
    }
    return {"backend": "flow", "iteration_time_ns": 660_000_000, "tokens_per_s": 1000.0,
            "mfu": 0.4, "device_types": {}, "means": means}


def test_each_figure_says_whether_it_includes_communication(capsys) -> None:
    print_summary(_summary())
    lines = capsys.readouterr().out.splitlines()
    per_rank = next(line for line in lines if "per rank (mean" in line)
    breakdown = next(line for line in lines if "time breakdown" in line)
    # the union-based figures (may overlap communication) on the first line ...
    assert "straggler wait incl. comm 22.100 ms" in per_rank
    assert "bubble incl. comm 40.000 ms" in per_rank
    assert "parts overlap" in per_rank
    # ... the disjoint breakdown that adds up to the iteration on the second
    assert "straggler wait excl. comm 2.900 ms" in breakdown
    assert "bubble excl. comm 30.000 ms" in breakdown
    assert "add up to the iteration" in breakdown
