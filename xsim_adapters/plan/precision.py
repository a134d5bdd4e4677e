"""``training.precision`` (the number format of the math) against ``model.dtype`` (the bytes of
weights, activations and gradients) and the device types that must run it (docs/plan.md,
"Precision and dtype").

A plan that states ``training.precision`` gets exactly that. A plan that does not (every plan
written before the field existed) computes in the precision its ``model.dtype`` names
(:data:`PRECISION_OF_DTYPE`): an fp16 model in fp16 mixed precision, an fp32 model in fp32, an
fp8 model with fp8 GEMMs. Where that differs from the documented default ``bf16`` (which such
plans silently got before), the loader says so once, in one line (:class:`PlanWarning`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import PlanError, PlanWarning
from .model import DeviceType, ModelSpec, TrainingSpec

# The math a model's dtype means when training.precision is not given. fp32 is IEEE fp32 GEMMs,
# not TF32: PyTorch's default since 1.12 (torch.backends.cuda.matmul.allow_tf32 = False).
PRECISION_OF_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8"}
DEFAULT_PRECISION = TrainingSpec.precision


def settle_precision(
    raw_training: Any, training: TrainingSpec, model: ModelSpec, used: Mapping[str, DeviceType]
) -> TrainingSpec:
    """``training`` with its precision settled: as written, else from ``model.dtype``; checked
    against every used device type (:func:`check_precision`). Warns (once per message) when the
    precision was taken from the dtype and differs from the default ``bf16``."""
    stated = isinstance(raw_training, Mapping) and "precision" in raw_training
    derived = None if stated else PRECISION_OF_DTYPE[model.dtype]
    if derived is not None and derived != training.precision:
        training = dataclasses.replace(training, precision=derived)  # type: ignore[arg-type]
    check_precision(training, used, from_dtype=derived is not None and
                    derived != DEFAULT_PRECISION)
    if derived is not None and derived != DEFAULT_PRECISION:
        warnings.warn(PlanWarning(
            f"training.precision: not given, so {derived} is taken from model.dtype "
            f"{model.dtype} (such plans computed in {DEFAULT_PRECISION} before); write "
            f"training.precision: {derived} to state it (docs/plan.md#precision-and-dtype)"
        ), stacklevel=1)  # one location, so Python shows each message once per process
    return training


def check_precision(
    training: TrainingSpec, used: Mapping[str, DeviceType], from_dtype: bool = False
) -> None:
    """Every device type the groups use must have a unit for ``training.precision``.

    fp8 needs ``fp8_tflops``; fp32 needs ``fp32_tflops``; tf32 needs ``tf32_tflops`` or
    ``fp32_tflops`` (parts without tf32 run it at the fp32 rate). bf16 on a part without bf16
    tensor cores runs as fp16 mixed precision (what frameworks do on V100/T4), so it is accepted.
    ``from_dtype``: the precision was taken from ``model.dtype`` (the message says so).
    """
    need = {
        "fp8": ("fp8_tflops",),
        "fp32": ("fp32_tflops",),
        "tf32": ("tf32_tflops", "fp32_tflops"),
    }
    keys = need.get(training.precision, ())
    what = (f"{training.precision} (not given, so taken from model.dtype)" if from_dtype
            else training.precision)
    for name, dt in sorted(used.items()):
        if keys and not any(getattr(dt, k) > 0 for k in keys):
            raise PlanError(
                "training.precision",
                f"{what} needs device_types.{name}.{keys[0]} > 0 "
                f"(device type {name} has none; got {training.precision!r})",
            )
