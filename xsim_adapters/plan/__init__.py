"""The deployment plan: YAML format, validation, presets, parameter counts (input only: the
checks that need the generator or the topology are :mod:`xsim_adapters.feasibility`).

Format reference: ``docs/plan.md``. Dataclasses: :mod:`xsim_adapters.plan.model`.
"""

from .layout import apportion, replica_speed, stage_speed
from .loader import parse_plan, parse_plan_dict, parse_yaml
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
from .params import embedding_params, head_params, layer_params, model_params
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
    "TrainingSpec",
    "apportion",
    "device_presets",
    "embedding_params",
    "head_params",
    "layer_params",
    "model_params",
    "model_presets",
    "parse_plan",
    "parse_plan_dict",
    "parse_yaml",
    "plan_to_dict",
    "plan_to_yaml",
    "replica_speed",
    "save_plan",
    "stage_speed",
]
