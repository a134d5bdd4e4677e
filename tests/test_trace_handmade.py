"""The op-by-op trace builder and its ring lowering (used by the backend tests)."""

from __future__ import annotations

import numpy as np
import pytest

from xsim_adapters.testing.handmade import TraceBuilder, ring_all_reduce
from xsim_adapters.trace import KIND_BARRIER, KIND_FLOW


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_all_reduce_moves_2_n_minus_1_over_n_of_s_per_rank(n: int) -> None:
    s = 96 << 20
    tb = TraceBuilder(n)
    start = tb.barrier()
    last = ring_all_reduce(tb, list(range(n)), s, ready=start, collective=3)
    trace = tb.build()
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    assert len(flows) == 2 * (n - 1) * n
    sent = flows.groupby("rank")["bytes"].sum()
    assert (sent == 2 * (n - 1) * (s // n)).all()
    assert (flows["dst"] == (flows["rank"] + 1) % n).all()
    assert set(flows["collective"]) == {3}
    assert sorted(set(flows["step"])) == list(range(2 * (n - 1)))
    # The last flows into each rank are the final step's, one per rank.
    assert sorted(trace.ops.loc[last, "dst"]) == list(range(n))
    assert set(trace.ops.loc[last, "step"]) == {2 * n - 3}


def test_ring_step_waits_for_the_chunk_it_forwards_and_its_own_previous_send() -> None:
    tb = TraceBuilder(3)
    r0 = tb.compute(0, 10)
    r1 = tb.compute(1, 20)
    ring_all_reduce(tb, [0, 1, 2], 300, ready={0: r0, 1: r1})
    trace = tb.build()
    ops, deps = trace.ops, trace.deps
    preds = deps.groupby("succ")["pred"].apply(sorted).to_dict()
    f = ops[ops["kind"] == KIND_FLOW].set_index(["step", "rank"])["op_id"]
    assert preds[f[(0, 0)]] == [r0] and preds[f[(0, 1)]] == [r1]
    assert f[(0, 2)] not in preds  # rank 2 had nothing to wait for
    # Step 1 out of rank 1: the step-0 flow 0->1 and rank 1's own step-0 send.
    assert preds[f[(1, 1)]] == sorted([f[(0, 0)], f[(0, 1)]])


def test_build_gives_schema_dtypes_and_a_manifest_metrics_can_read() -> None:
    tb = TraceBuilder([("h", "H100"), ("a", "A100")], peak_tflops={"H100": 989, "A100": 312},
                      tokens_per_iteration=4096)
    c = tb.compute(0, 5, phase="bwd", flops=1e9)
    tb.barrier(deps=[c, tb.flow(1, 0, 8, phase="pp")])
    t = tb.build()
    assert list(t.ops["op_id"]) == [0, 1, 2]
    assert t.ops["kind"].tolist()[2] == KIND_BARRIER
    assert t.ops.dtypes["bytes"] == np.int64 and t.ops.dtypes["phase"] == np.int8
    assert t.ops["dst"].tolist() == [-1, 0, -1]
    assert t.manifest["groups"] == ["a", "h"]
    assert t.manifest["device_types"]["A100"]["peak_tflops"] == 312
    assert t.deps.values.tolist() == [[0, 2], [1, 2]]
