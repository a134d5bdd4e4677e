"""GOAL export: every op appears, messages match, dependencies only name local labels."""

from __future__ import annotations

import re
from collections import Counter

from helpers.gen import A100, H100, make_plan

from xsim_adapters.trace.export_goal import export_goal
from xsim_adapters.trace.schema import KIND_FLOW
from xsim_adapters.workload import generate

VERTEX = re.compile(r"^l(\d+): (calc|send|recv) (\d+)b?(?: (?:to|from) (\d+) tag (\d+))?$")
REQUIRES = re.compile(r"^l(\d+) requires l(\d+)$")


def _parse(text: str):
    ranks: dict[int, list[str]] = {}
    cur = None
    lines = text.splitlines()
    assert lines[0].startswith("num_ranks ")
    for line in lines[1:]:
        if m := re.match(r"^rank (\d+) \{$", line):
            cur = int(m.group(1))
            ranks[cur] = []
        elif line == "}":
            cur = None
        elif line:
            assert cur is not None, line
            ranks[cur].append(line)
    return int(lines[0].split()[1]), ranks


def test_goal_export_is_complete_and_consistent(tmp_path) -> None:
    plan = make_plan(
        [
            [("h100", 0, 4, 0, 1), ("a100", 0, 2, 1, 3), ("a100", 2, 8, 3, 4)],
            [("h100", 8, 10, 0, 2), ("h100", 10, 12, 2, 4)],
        ],
        groups=[("h100", H100, 2, 8), ("a100", A100, 1, 8)],
        micro_batches=[3, 2],
        collectives={"resharding": "gather_p2p_scatter"},
    )
    trace = generate(plan)
    path = export_goal(trace, tmp_path / "t.goal")
    num_ranks, ranks = _parse(path.read_text())
    assert num_ranks == plan.num_ranks
    sends, recvs = Counter(), Counter()
    calcs = 0
    for r, lines in ranks.items():
        labels = set()
        for line in lines:
            if m := VERTEX.match(line):
                assert m.group(1) not in labels
                labels.add(m.group(1))
                if m.group(2) == "calc":
                    calcs += 1
                elif m.group(2) == "send":
                    sends[(r, int(m.group(4)), int(m.group(5)), int(m.group(3)))] += 1
                else:
                    recvs[(int(m.group(4)), r, int(m.group(5)), int(m.group(3)))] += 1
        for line in lines:
            if m := REQUIRES.match(line):
                assert m.group(1) in labels and m.group(2) in labels, (r, line)
            else:
                assert VERTEX.match(line), line
    assert sends == recvs  # every message is received once with the same size and tag
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    data = {k for k in sends if k[2] < 1 << 40}
    assert len(data) == len(flows)
    assert sum(k[3] for k in data) == int(flows["bytes"].sum())
    # every compute op and barrier is a calc, and so is every flow's start latency
    assert calcs == trace.num_ops - len(flows) + int((flows["duration_ns"] > 0).sum())
    assert (flows["duration_ns"] > 0).any()  # the plan's rings carry NCCL's delay
