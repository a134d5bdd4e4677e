"""The deployment plan: YAML format, validation, presets, memory feasibility.

Format reference: ``docs/plan.md``. Dataclasses: :mod:`xsim_adapters.plan.model`.
"""

from .layout import apportion, replica_speed, stage_speed
from .loader import load_plan, parse_yaml, plan_from_dict
from .memory import (
    StageMemory,
    check_feasible,
    embedding_params,
    head_params,
    in_flight_micro_batches,
    layer_params,
    memory_report,
    model_params,
    stage_memory,
)
from .model import (
    CollectivesSpec,
    DeviceGroup,
    DeviceType,
    ExplicitLink,
    LinkEvent,
    ModelSpec,
    NetworkSpec,
    OverlapSpec,
    Plan,
    Replica,
    ScaleOut,
    ScaleUp,
    Stage,
    TrainingSpec,
)
from .presets import device_presets, model_presets
from .serialize import plan_to_dict, plan_to_yaml, save_plan

__all__ = [
    "CollectivesSpec",
    "DeviceGroup",
    "DeviceType",
    "ExplicitLink",
    "LinkEvent",
    "ModelSpec",
    "NetworkSpec",
    "OverlapSpec",
    "Plan",
    "Replica",
    "ScaleOut",
    "ScaleUp",
    "Stage",
    "StageMemory",
    "TrainingSpec",
    "apportion",
    "check_feasible",
    "device_presets",
    "embedding_params",
    "head_params",
    "in_flight_micro_batches",
    "layer_params",
    "load_plan",
    "memory_report",
    "model_params",
    "model_presets",
    "parse_yaml",
    "plan_from_dict",
    "plan_to_dict",
    "plan_to_yaml",
    "replica_speed",
    "save_plan",
    "stage_memory",
    "stage_speed",
]
