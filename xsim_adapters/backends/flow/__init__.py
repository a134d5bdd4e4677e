"""The embedded flow-level backend (the default): max-min fair flows over the plan's topology."""

from .backend import FlowBackend
from .maxmin import maxmin_rates

__all__ = ["FlowBackend", "maxmin_rates"]
