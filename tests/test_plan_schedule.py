"""Plan fields of the schedules, overlap and recompute: errors, defaults, round trip, memory."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.plan import example

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.feasibility.memory import in_flight_micro_batches, stage_memory
from xsim_adapters.plan import plan_to_dict
from xsim_adapters.plan.model import OverlapSpec


def _training(**kw) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        d["training"].update(kw)

    return mutate


def _counts(*mbs: int) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        for rep, m in zip(d["replicas"], mbs, strict=True):
            rep["micro_batches"] = m

    return mutate


CASES = [
    (
        "virtual_stages without interleaving",
        [_training(virtual_stages=2)],
        "training.virtual_stages: must be 1 unless training.schedule is interleaved "
        "(schedule 1f1b) (got 2)",
    ),
    (
        "interleaved needs virtual_stages",
        [_training(schedule="interleaved")],
        "training.virtual_stages: required with training.schedule interleaved (got nothing)",
    ),
    (
        "interleaved with one chunk",
        [_training(schedule="interleaved", virtual_stages=1)],
        "training.virtual_stages: must be at least 2 with training.schedule interleaved (got 1)",
    ),
    (
        "virtual_stages not an integer",
        [_training(schedule="interleaved", virtual_stages="two")],
        "training.virtual_stages: expected a positive integer (got 'two')",
    ),
    (
        "micro-batches not a multiple of pp",
        [_training(schedule="interleaved", virtual_stages=2), _counts(61, 3)],
        "replicas[1].micro_batches: expected micro-batches a multiple of the replica's 2 "
        "pipeline stages with training.schedule interleaved (Megatron requires it) (got 3)",
    ),
    (
        "batch split gives a bad count",
        # 66 split by speed (177.28 vs 60.25, test_plan_layout): 49.26 / 16.74 -> 49 / 17
        [_training(schedule="interleaved", virtual_stages=2, global_batch=66)],
        "replicas[1]: expected micro-batches a multiple of the replica's 2 pipeline stages "
        "with training.schedule interleaved (Megatron requires it) (got the batch split gave "
        "it 17)",
    ),
    (
        "fewer layers than chunks",
        [_training(schedule="interleaved", virtual_stages=16), _counts(48, 16)],
        "replicas[1].stages[1].layers: expected at least training.virtual_stages = 16 layers "
        "per stage, one per model chunk (got 14 in [18, 32))",
    ),
    (
        "bad recompute",
        [_training(recompute="some")],
        "training.recompute: expected one of none, selective, full (got 'some')",
    ),
    (
        "unknown overlap key",
        [_training(overlap={"tp": True})],
        "training.overlap.tp: unknown key; expected one of tp_comm, dp_grad_reduce, param_gather",
    ),
    (
        "tp_comm needs sequence parallelism",
        [_training(overlap={"tp_comm": True})],
        "training.overlap.tp_comm: needs training.sequence_parallel: true (Megatron-Core overlaps "
        "only the sequence-parallel all-gather / reduce-scatter with the GEMMs) (got true)",
    ),
    (
        "overlap switch not a bool",
        [_training(overlap={"param_gather": 1})],
        "training.overlap.param_gather: expected true or false (got 1)",
    ),
]


@pytest.mark.parametrize(("mutations", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_schedule_fields(mutations, message) -> None:
    d = example()
    for mutate in mutations:
        mutate(d)
    with pytest.raises(PlanError) as info:
        plan_from_dict(d)
    assert str(info.value) == message


def test_defaults_and_old_spellings() -> None:
    t = plan_from_dict(example()).training
    assert (t.schedule, t.virtual_stages, t.recompute) == ("1f1b", 1, "none")
    assert t.overlap == OverlapSpec(tp_comm=False, dp_grad_reduce=True, param_gather=True)
    for old, new in ((True, "full"), (False, "none"), ("selective", "selective")):
        d = example()
        d["training"]["recompute"] = old
        assert plan_from_dict(d).training.recompute == new


def test_new_fields_round_trip() -> None:
    d = example()
    d["training"].update(
        schedule="interleaved", virtual_stages=2, recompute="selective", sequence_parallel=True,
        overlap={"tp_comm": True, "dp_grad_reduce": False, "param_gather": False},
    )
    _counts(48, 16)(d)  # multiples of pp (the split by speed gives 49 / 15)
    plan = plan_from_dict(d)
    assert plan_from_dict(plan_to_dict(plan)) == plan
    assert plan.training.overlap == OverlapSpec(True, False, False)


def test_in_flight_micro_batches() -> None:
    assert in_flight_micro_batches("1f1b", 1, 4, 8) == 3
    assert in_flight_micro_batches("gpipe", 1, 4, 8) == 8
    assert in_flight_micro_batches("zb_h1", 3, 4, 8) == 4  # deferred W passes: pp on every stage
    # interleaved stage 0: pp * (1 + (pp - 1)/(pp * v)) (Narayanan et al. SC21, Sec. 2.2.2)
    for pp, v in ((4, 2), (4, 4), (8, 2)):
        got = in_flight_micro_batches("interleaved", 0, pp, 4 * pp, v)
        assert got == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_selective_recompute_drops_the_attention_scores() -> None:
    def acts(**kw) -> float:
        d = example()
        d["training"].update(kw)
        return stage_memory(plan_from_dict(d, feasibility=False), 1, 0).activations

    no_flash = acts(flash_attention=False)
    selective = acts(flash_attention=False, recompute="selective")
    flash = acts(flash_attention=True)
    # the 5*a*s^2*b/t term of Korthikanti et al.: a = 32, s = 4096, b = 1, t = 4, on
    # replicas[1].stages[0] (18 layers, 2 micro-batches in flight of 1F1B with pp 2)
    scores = 5 * 32 * 4096 * 4096 * 1 / 4
    assert no_flash - selective == pytest.approx(2 * 18 * scores)
    assert selective == flash
    assert acts(flash_attention=True, recompute="selective") == flash  # nothing more to save
