"""The compute model: how long each compute op of the trace takes (no trace building here).

- :mod:`.gemm`: achieved rate of one kernel (roofline with a shape-dependent GEMM rate);
- :mod:`.kernels`: the kernels a framework runs for one layer block and their times;
- :mod:`.costs`: model FLOPs, per-layer block costs, profile tables, the optimizer step;
- :mod:`.passes`: the backward's B/W split and what selective recompute re-runs;
- :mod:`.routing`: MoE expert placement, routing counts and expert compute;
- :mod:`.moe_units`: per-stage MoE costs handed to the block builder.

Imports only :mod:`xsim_adapters.plan` (and itself); the communication lowering
(:mod:`..comm`) and the build (:mod:`..generate`) sit above it.
"""

from .costs import ADAM_BYTES_PER_PARAM, layer_costs, layer_flops, optimizer_time_ns, stage_params
from .moe_units import MoELayerCost, StageMoE

__all__ = [
    "ADAM_BYTES_PER_PARAM",
    "MoELayerCost",
    "StageMoE",
    "layer_costs",
    "layer_flops",
    "optimizer_time_ns",
    "stage_params",
]
