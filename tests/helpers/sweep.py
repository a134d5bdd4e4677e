"""Shared fixtures of the sweep tests: a tiny 8-GPU plan (tiny-gpt, TP 2, PP 2, DP 2)."""

from __future__ import annotations

from pathlib import Path

TINY_PLAN = """\
name: tiny-sweep
model: tiny-gpt
training: {global_batch: 8, micro_batch: 1, schedule: 1f1b}
device_groups:
  h100: {type: H100-80GB, nodes: 1, gpus_per_node: 8}
replicas:
  uniform: {group: h100, tp: 2, pp: 2, dp: 2}
"""


def write_tiny_plan(directory: Path, name: str = "tiny.yaml") -> Path:
    """The tiny plan as a file in ``directory``."""
    path = directory / name
    path.write_text(TINY_PLAN)
    return path
