"""The Megatron-Core MoE validation source writes the published configuration as a plan."""

from __future__ import annotations

from validation import framework as fw
from validation import megatron_core_moe as mc
from xsim_adapters.plan import plan_from_dict
from xsim_adapters.plan.memory import model_params
from xsim_adapters.plan.parallel import ep_ranks


def test_plan_is_the_readme_mapping() -> None:
    (row,) = mc.rows()
    assert float(row["measured_tflops_per_gpu"]) == 468.0
    plan = plan_from_dict(mc.plan_dict(row))  # feasible: the loader checks memory
    assert plan.num_ranks == 64 and plan.dp == 16
    assert {r.micro_batches for r in plan.replicas} == {16}  # GBS 256 / 16 replicas
    st = plan.replicas[0].stages[0]
    assert (st.tp, st.ep, plan.replicas[0].pp) == (1, 8, 4)
    assert len(ep_ranks(plan, 0, 0)) == 8
    assert round(model_params(plan.model) / 1e8) * 1e8 == 46.7e9
    assert mc.SOURCE in fw.discover()
