"""``xsim validate`` and ``xsim schema``: the commands about plan files themselves."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .args import check_input, common_args
from .fmt import runs, span


def add_schema_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim schema``."""
    sp.add_argument("-o", "--output", default=None, metavar="FILE",
                    help="The file to write (default: print to standard output).")
    common_args(sp, force=False, progress=False)


def cmd_schema(args: argparse.Namespace) -> int:
    """``xsim schema``: the JSON Schema of plan files, generated from the plan loader."""
    from ..plan.schema import schema_text

    text = schema_text()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from .._atomic import write_text_atomic
    from .._outdir import check_output_file

    target = check_output_file(args.output, "plan JSON Schema", _is_schema_file)
    print(f"wrote the plan JSON Schema to {write_text_atomic(target, text)}")
    return 0


def _is_schema_file(path: Path) -> bool:
    """Whether ``path`` holds a plan schema ``xsim schema`` wrote (its title and description
    name it): the only non-empty file ``xsim schema -o`` replaces."""
    import json

    from .._outdir import read_small_file
    from ..plan.schema import plan_schema

    data, _ = read_small_file(path, 16 << 20)
    try:
        doc = json.loads(data or b"")
    except (ValueError, RecursionError):
        return False
    ours = plan_schema()
    return (isinstance(doc, dict) and doc.get("title") == ours["title"]
            and doc.get("description") == ours["description"])


def add_validate_arguments(sp: argparse.ArgumentParser) -> None:
    """The options of ``xsim validate``."""
    sp.add_argument("plan", metavar="PLAN", help="The plan YAML file to check.")
    common_args(sp, force=False, progress=False)


def cmd_validate(args: argparse.Namespace) -> int:
    """``xsim validate``: check a plan; print its ranks, replicas and memory per stage."""
    from .. import api

    check_input(args.plan, trace_ok=False)
    plan = api.load_plan(args.plan)
    tr = plan.training
    print(f"plan {plan.name!r}: valid")
    print(f"  {plan.num_ranks} ranks on {plan.num_nodes} servers in "
          f"{len(plan.device_groups)} device groups; model {plan.model.name} "
          f"({plan.model.layers} layers, hidden {plan.model.hidden}, seq {plan.model.seq_len})")
    print(f"  training: global batch {tr.global_batch}, micro-batch {tr.micro_batch}, "
          f"schedule {tr.schedule}, ZeRO {tr.zero_stage}, recompute {tr.recompute}")
    print(f"  {plan.dp} replicas:")
    descs = []
    for rep in plan.replicas:
        tps = ",".join(str(s.tp) for s in rep.stages)
        layers = " ".join(f"[{s.layers[0]},{s.layers[1]})" for s in rep.stages)
        groups = ",".join(dict.fromkeys(s.group for s in rep.stages))
        descs.append(f"pp {rep.pp}, tp [{tps}], {rep.micro_batches} micro-batches, "
                     f"layers {layers}, on {groups}")
    for ids, text in runs(descs):
        print(f"    {span('replica', ids)}: {text}")
    from ..feasibility.memory import memory_report

    mem = memory_report(plan)
    print("  memory per device (GB): replicas, stage, type, tp: total / capacity")
    lines = [
        (int(r.replica), f"stage {r.stage} {r.device_type} tp {r.tp}: {r.total_GB:.2f} / "
         f"{r.capacity_GB:.2f} (weights {r.weights_GB:.2f}, grads {r.gradients_GB:.2f}, "
         f"optimizer {r.optimizer_GB:.2f}, activations {r.activations_GB:.2f})")
        for r in mem.itertuples()
    ]
    by_text: dict[str, list[int]] = {}
    for rep_id, text in lines:
        by_text.setdefault(text, []).append(rep_id)
    for text, ids in by_text.items():
        print(f"    {span('replica', ids)} {text}")
    return 0
