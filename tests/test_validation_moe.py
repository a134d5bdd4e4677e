"""The Megatron-Core MoE validation source writes the published configuration as a plan."""

from __future__ import annotations

from validation import framework as fw
from validation import megatron_core_moe as mc
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.parallel import ep_ranks
from xsim_adapters.plan.params import model_params


def _assert_megatron_placement(plan) -> None:
    """Megatron-Core's rank order (tp-cp-ep-dp-pp): the pipeline is outermost, so with TP 1 and
    EP 8 on 8-GPU servers every EP group is one server and stage s spans servers 2s, 2s + 1."""
    for r, rep in enumerate(plan.replicas):
        for s, st in enumerate(rep.stages):
            assert st.devices == (s * plan.dp + r, s * plan.dp + r + 1)
    for s in range(plan.replicas[0].pp):
        for block in range(0, plan.dp, 8):
            servers = {plan.replicas[r].stages[s].devices[0] // 8 for r in range(block, block + 8)}
            assert len(servers) == 1, (s, block, servers)


def test_plan_is_the_readme_mapping() -> None:
    (row,) = mc.rows()
    assert float(row["measured_tflops_per_gpu"]) == 468.0
    plan = plan_from_dict(mc.plan_dict(row))  # feasible: the loader checks memory
    assert plan.num_ranks == 64 and plan.dp == 16
    assert {r.micro_batches for r in plan.replicas} == {16}  # GBS 256 / 16 replicas
    st = plan.replicas[0].stages[0]
    assert (st.tp, st.ep, plan.replicas[0].pp) == (1, 8, 4)
    assert len(ep_ranks(plan, 0, 0)) == 8
    _assert_megatron_placement(plan)
    assert round(model_params(plan.model) / 1e8) * 1e8 == 46.7e9
    assert mc.SOURCE in fw.discover()


def test_megatron_bridge_rows_are_the_published_mapping() -> None:
    from validation import megatron_bridge_moe as mb

    rows = mb.rows()
    assert [float(r["measured"]) for r in rows] == [5824.0, 5993.0]
    for row in rows:
        assert "performance-summary.md" in row["source"] and "DGX-H100" in row["source"]
        plan = plan_from_dict(mb.plan_dict(row))  # feasible: the loader checks memory
        assert plan.num_ranks == 64 and plan.dp == 16 and plan.model.name == "gpt-oss-120b"
        assert {r.micro_batches for r in plan.replicas} == {80}  # GBS 1280 / 16 replicas
        st = plan.replicas[0].stages[0]
        assert (st.tp, st.ep, st.etp, plan.replicas[0].pp) == (1, 8, 1, 4)
        assert plan.model.moe is not None and plan.model.moe.routing == "balanced"
        _assert_megatron_placement(plan)
    assert mb.SOURCE in fw.discover()


def test_nemo_cp_rows_are_the_published_mapping() -> None:
    from validation import nemo_context_parallel as nc

    rows = nc.rows()
    assert len(rows) == 8
    for row in rows:
        d = nc.plan_dict(row)
        u = d["replicas"]["uniform"]
        cp, dp, tp, pp = (int(row[k]) for k in ("cp", "dp", "tp", "pp"))
        assert u["dp"] == dp * cp and u["cp"] == cp and cp >= 2
        assert tp * pp * cp * dp == int(row["gpus"])
        if int(row["gpus"]) < nc.HEAVY_GPUS:
            plan = plan_from_dict(d)  # fits without recompute
            assert plan.training.recompute == "none" and plan.training.precision == "fp8"
            assert sum(r.micro_batches for r in plan.replicas) == int(row["global_batch"]) * cp
    heavy = [c for c in nc.cases() if c.heavy]
    assert sorted(c.label.split()[1] for c in heavy) == ["1024k", "512k"]
