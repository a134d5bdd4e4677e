"""The communication lowering: collectives as NCCL runs them, lowered to flows.

- :mod:`.nccl`, :mod:`.nccl_achieved`: NCCL's cost model (tuner, latencies, protocols) and what
  its kernels achieve beyond it; one home for every constant;
- :mod:`.rings`: ring orders, ring bandwidths, bytes per channel; :class:`.rings.RankInfo`;
- :mod:`.collectives` (rings), :mod:`.algorithms` (tree, NVLS, hierarchical),
  :mod:`.selection` (which algorithm, its template and delay): lowering to flows;
- :mod:`.latency`: NCCL's per-member delay as a start latency on the gate flows;
- :mod:`.emit`: the typed emitter (trace builder, per-rank tags, the built stages' op ids) and
  the one way to emit a lowered collective with its NCCL cost (TP, DP, EP, CP, ETP);
- :mod:`.reshard` (pipeline resharding between TP degrees), :mod:`.dpsync` (the layer-aware DP
  sweep line and its rings), :mod:`.alltoall` (EP all-to-all and the MoE planner),
  :mod:`.etp` (expert-TP rings), :mod:`.context` (CP ring attention).

Imports :mod:`xsim_adapters.plan`, :mod:`xsim_adapters.trace`, :mod:`..compute` and two leaf
modules of the build (:mod:`..builder`, :mod:`..schedule`); the build (:mod:`..generate`)
sits above it.
"""

from .collectives import RingFlows, num_steps, ring_flows
from .dpsetup import DPSetup
from .emit import Emitter, StageOps, emit_gated, emit_lowered
from .rings import RankInfo
from .selection import Choice, choose_algorithm

__all__ = [
    "Choice",
    "DPSetup",
    "Emitter",
    "RankInfo",
    "RingFlows",
    "StageOps",
    "choose_algorithm",
    "emit_gated",
    "emit_lowered",
    "num_steps",
    "ring_flows",
]
