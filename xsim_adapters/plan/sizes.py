"""Per-micro-batch sizes that are pure functions of the plan: one home for each.

``2 x cp`` divides ``seq_len`` (validated, :mod:`.parallel`), so ``b x (s / cp)`` is exact.
"""

from __future__ import annotations

from .model import ModelSpec


def tokens_per_microbatch(model: ModelSpec, micro_batch: int, cp: int = 1) -> int:
    """Tokens of one micro-batch on one rank of a CP group of ``cp``: ``b x s / cp``."""
    return micro_batch * (model.seq_len // cp)


def activation_bytes(model: ModelSpec, micro_batch: int, cp: int = 1) -> int:
    """Bytes of one micro-batch's activation on one CP rank (what a TP collective and a
    pipeline send carry): ``b x s / cp x hidden x dtype bytes``."""
    return tokens_per_microbatch(model, micro_batch, cp) * model.hidden * model.dtype_bytes


__all__ = ["activation_bytes", "tokens_per_microbatch"]
