"""The workload generator: ``generate(plan) -> Trace``, a pure function of the plan."""

from .generate import generate, plan_digest

__all__ = ["generate", "plan_digest"]
