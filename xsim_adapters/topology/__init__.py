"""The network graph of a plan and its deterministic ECMP routing."""

from .build import build_topology
from .model import Topology
from .routing import BUCKETS, Router, stable_hash

__all__ = ["BUCKETS", "Router", "Topology", "build_topology", "stable_hash"]
