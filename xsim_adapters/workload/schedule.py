"""Pipeline schedules: the order in which one stage runs its forward and backward micro-batches."""

from __future__ import annotations

import numpy as np

from ..errors import PlanError


def stage_order(schedule: str, stage: int, pp: int, micro_batches: int) -> np.ndarray:
    """Run order of stage ``stage`` (0-based) of a ``pp``-deep pipeline with ``micro_batches``.

    Returns an int64 array of shape (2 * micro_batches, 2): rows (is_backward, micro_batch).

    - ``gpipe``: all forwards 0..m-1, then all backwards 0..m-1.
    - ``1f1b``: warm-up of min(pp - stage - 1, m) forwards, then steady one-forward-one-backward,
      then the cool-down backwards (Megatron's non-interleaved schedule).
    """
    m = micro_batches
    mbs = np.arange(m, dtype=np.int64)
    if schedule == "gpipe":
        kind = np.repeat(np.array([0, 1], dtype=np.int64), m)
        return np.stack([kind, np.concatenate([mbs, mbs])], axis=1)
    if schedule == "1f1b":
        w = min(pp - stage - 1, m)
        rows: list[tuple[int, int]] = [(0, i) for i in range(w)]
        for j in range(m - w):
            rows.append((0, w + j))
            rows.append((1, j))
        rows.extend((1, j) for j in range(m - w, m))
        return np.array(rows, dtype=np.int64).reshape(-1, 2)
    raise PlanError("training.schedule", f"expected one of gpipe, 1f1b (got {schedule!r})")
