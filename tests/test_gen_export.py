"""GOAL export: every op appears, messages match, dependencies only name local labels."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from test_gen_helpers import A100, H100, make_plan

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
    assert calcs == trace.num_ops - len(flows)


def test_chakra_export_matches_the_trace(tmp_path) -> None:
    import json

    from xsim_adapters.trace.export_chakra import export_chakra

    plan = make_plan([[("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)], [("h100", 8, 12, 0, 4)]])
    trace = generate(plan)
    paths = export_chakra(trace, tmp_path / "et")
    assert [p.name for p in paths] == [f"et.{r}.json" for r in range(16)]
    docs = [json.loads(p.read_text()) for p in paths]
    nodes = [n for d in docs for n in d["nodes"]]
    sends = [n for n in nodes if n["type"] == "COMM_SEND_NODE" and n["attrs"]["op_id"] >= 0]
    recvs = [n for n in nodes if n["type"] == "COMM_RECV_NODE" and n["attrs"]["op_id"] >= 0]
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    assert len(sends) == len(recvs) == len(flows)
    assert sum(n["attrs"]["comm_size"] for n in sends) == int(flows["bytes"].sum())
    comp = [n for n in nodes if n["type"] == "COMP_NODE"]
    assert len(comp) == trace.num_ops - len(flows)
    total_us = sum(n["duration_micros"] for n in comp)
    assert abs(total_us - trace.ops["duration_ns"].sum() / 1000) < 1e-6 * total_us
    assert sum(n["attrs"]["num_ops"] for n in comp) == pytest.approx(trace.ops["flops"].sum())
    for d in docs:  # dependencies stay within the rank's own nodes
        ids = {n["id"] for n in d["nodes"]}
        assert all(set(n["data_deps"]) <= ids for n in d["nodes"])
    # ranks 4..7 and 12..15 hold no stage: empty but present
    assert docs[5]["nodes"] == [] and docs[0]["num_ranks"] == 16
