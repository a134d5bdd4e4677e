"""Shipped model and device-type presets (``xsim_adapters/presets/*.yaml``, package data)."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from .model import DeviceType, ModelSpec
from .sections import parse_device_type, parse_model


def _load(filename: str) -> dict[str, Any]:
    text = resources.files("xsim_adapters").joinpath("presets", filename).read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"presets/{filename} must be a mapping"  # shipped data
    return data


@functools.cache
def _model_presets() -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for name, entry in _load("models.yaml").items():
        entry = {k: v for k, v in entry.items() if k != "source"}
        out[name] = parse_model({"name": name, **entry}, f"presets/models.yaml:{name}", {})
    return out


@functools.cache
def _device_presets() -> dict[str, DeviceType]:
    return {
        name: parse_device_type(entry, f"presets/devices.yaml:{name}", name, None, None)
        for name, entry in _load("devices.yaml").items()
    }


def model_presets() -> dict[str, ModelSpec]:
    """Shipped model shapes by name (a fresh dict; the specs are frozen)."""
    return dict(_model_presets())


def device_presets() -> dict[str, DeviceType]:
    """Shipped device types by name: peak dense bf16 TFLOP/s, HBM GB and GB/s, link speeds."""
    return dict(_device_presets())
