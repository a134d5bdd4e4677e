"""Per-stage MoE costs handed to the block builder (:func:`.blocks.stage_units`).

Kept apart from :mod:`.moe` (routing and kernels) so the block builder depends only on plain,
hashable data: a stage's blocks are cached by it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoELayerCost:
    """One MoE layer on one stage's local ranks, per micro-batch (ns, forward FLOPs)."""

    pre_fwd_ns: int
    post_fwd_ns: int
    pre_bwd_ns: int
    post_bwd_ns: int
    pre_flops: float
    expert_fwd_ns: tuple[int, ...]  # per local rank (ep 1: one value for all)
    expert_bwd_ns: tuple[int, ...]
    expert_flops: tuple[float, ...]


@dataclass(frozen=True)
class StageMoE:
    """The MoE layers of one stage: ``layers`` maps layer -> its cost (a frozen, hashable map)."""

    ep: int
    items: tuple[tuple[int, MoELayerCost], ...]

    @property
    def layers(self) -> dict[int, MoELayerCost]:
        return dict(self.items)
