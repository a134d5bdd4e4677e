"""The workload generator: ``generate(plan) -> Trace``, a pure function of the plan.

Three layers (the map and the import rules are in docs/architecture.md):

- :mod:`.compute`: the compute model (kernel times, FLOPs, MoE routing): what an op costs;
- :mod:`.comm`: the communication lowering (NCCL's cost model, rings and other algorithms
  lowered to flows, resharding, the DP sweep line, EP/CP/ETP) and the typed emitter
  (:class:`.comm.emit.Emitter`) through which every collective enters the trace;
- the build, here: :mod:`.builder` (bulk op/edge accumulation, templates), :mod:`.schedule`
  (pipeline schedules), :mod:`.blocks` (a stage's block templates), :mod:`.generate` (stages,
  pipeline transfers), :mod:`.dp` (DP sync and optimizer), :mod:`.manifest`,
  :mod:`.coarsen` (which replicas and micro-batches are simulated), :mod:`.perturb` (what-if
  kernel slowdowns).
"""

from .generate import generate, plan_digest

__all__ = ["generate", "plan_digest"]
