"""From YAML text or a plain dict to a validated :class:`Plan`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .bounded_yaml import parse_yaml
from .kinds import PLAN, check_kind
from .measured import check_sites
from .model import DeviceType, Plan
from .network import parse_network
from .parallel import check_fsdp
from .perturb import parse_perturb
from .precision import settle_precision
from .presets import _device_presets, _model_presets
from .replicas import parse_groups, parse_replicas
from .sections import (
    decode_utf8,
    parse_collectives,
    parse_device_type,
    parse_model,
    parse_training,
)

TOP_KEYS = (
    "name",
    "seed",
    "model",
    "training",
    "device_types",
    "device_groups",
    "network",
    "replicas",
    "collectives",
    "perturb",
)
REQUIRED_TOP_KEYS = ("name", "model", "training", "device_groups", "replicas")
OPTIONAL_SECTIONS = ("device_types", "network", "collectives", "perturb")


def read_plan_file(path: str | os.PathLike[str], *, stored: bool = False) -> str:
    """The text of a plan file: a regular file of at most MAX_PLAN_BYTES of UTF-8
    (MAX_STORED_PLAN_BYTES for a ``plan.yaml`` xsim wrote beside a trace: ``stored``)."""
    max_bytes = lim.MAX_STORED_PLAN_BYTES if stored else lim.MAX_PLAN_BYTES
    p = Path(path)
    if p.is_dir():
        raise PlanError(
            "", f"{f.text(str(p))} is a directory, not a plan file (expected a .yaml "
            "file; a trace directory is read by xsim run, compare and export)"
        )
    if not p.exists():
        raise PlanError("", f"plan file not found: {f.text(str(p))}")
    if not p.is_file():
        raise PlanError("", f"{f.text(str(p))}: not a regular file (expected a plan .yaml)")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise PlanError("", f"cannot read plan file {p}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise PlanError(
            "", f"{p}: the plan is larger than {max_bytes:,} bytes "
            "(MAX_PLAN_BYTES, docs/plan.md#limits)"
        )
    return decode_utf8(data, str(p), "", "plan file")


def is_stored_plan(path: Path) -> bool:
    """Whether ``path`` is the ``plan.yaml`` xsim wrote into a trace directory (beside the
    trace's ``manifest.json`` and the output stamp ``.xsim-output`` of the trace or of the run
    holding it), so that `xsim run OUT/trace/plan.yaml` reads back a plan of thousands of
    stages. Its limits stay bounded (MAX_STORED_PLAN_BYTES, MAX_STORED_YAML_NODES)."""
    d = path.parent
    return (path.name == "plan.yaml" and (d / "manifest.json").is_file()
            and ((d / ".xsim-output").is_file() or (d.parent / ".xsim-output").is_file()))


def parse_plan(path_or_text: str | os.PathLike[str], *, stored: bool = False) -> Plan:
    """Read a plan from a ``.yaml``/``.yml`` file path or from YAML text; validate its fields.

    Relative ``profile:`` paths resolve against the file's directory (the working directory for
    text). ``stored``: the file is a ``plan.yaml`` xsim wrote beside a trace (larger size
    limits, see :mod:`.limits`). The checks that need the generator or the topology (size,
    what-if events, memory) are not run here: :func:`xsim_adapters.feasibility.load_plan` runs
    them, and every command reads plans through it.
    """
    # A one-line string is a path if it names something on disk or looks like a file name
    # (a .yaml/.yml suffix, or no ':' as every one-line YAML mapping has); YAML text otherwise.
    is_path = isinstance(path_or_text, os.PathLike) or (
        "\n" not in path_or_text
        and path_or_text.strip() != ""
        and (
            path_or_text.strip().endswith((".yaml", ".yml"))
            or ":" not in path_or_text
            or os.path.exists(path_or_text)
        )
    )
    if is_path:
        p = Path(path_or_text)
        stored = stored or is_stored_plan(p)
        data = parse_yaml(read_plan_file(p, stored=stored), str(p), stored=stored)
        base_dir: str | None = str(p.resolve().parent)
        source: str | None = f.text(str(p))
    else:
        data = parse_yaml(str(path_or_text))
        base_dir = source = None
    return parse_plan_dict(data, base_dir=base_dir, source=source)


def parse_plan_dict(d: Any, base_dir: str | None = None, *, source: str | None = None) -> Plan:
    """A plan as plain data (what YAML gives) -> validated Plan; see docs/plan.md for the format.
    Fields only, as :func:`parse_plan` (:func:`xsim_adapters.feasibility.plan_from_dict` checks).

    ``base_dir`` resolves relative profile paths (default: the working directory). ``source``:
    the file the data came from, named when it is another kind of file (:mod:`.kinds`).
    """
    if d is None:
        raise PlanError(
            "",
            f"the plan is empty: expected a mapping with keys {', '.join(REQUIRED_TOP_KEYS)}"
            " (got nothing)",
        )
    if not isinstance(d, Mapping):
        raise PlanError(
            "", f"expected a mapping at the top level of the plan (got a {type(d).__name__})"
        )
    check_kind(d, PLAN, source)
    f.check_keys(d, "", TOP_KEYS, REQUIRED_TOP_KEYS)
    # An optional section written with nothing under it (`network:`) means all defaults.
    d = {k: ({} if v is None and k in OPTIONAL_SECTIONS else v) for k, v in d.items()}
    name = f.check_name(d["name"], "name", "plan name")
    seed = f.get_int(d, "seed", "", 0, minimum=0)
    model = parse_model(d["model"], "model", _model_presets())
    training = parse_training(d["training"], "training")
    defined = _parse_device_types(d.get("device_types", {}), base_dir)
    known = {**_device_presets(), **defined}
    groups = parse_groups(d["device_groups"], "device_groups", known)
    network = parse_network(d.get("network", {}), "network", base_dir)
    if network.measured is not None:
        check_sites(network.measured, groups, "network.measured")
    collectives = parse_collectives(d.get("collectives", {}), "collectives")
    perturb = parse_perturb(d.get("perturb", {}), "perturb", groups)
    used = {g.type: known[g.type] for g in groups}
    training = settle_precision(d["training"], training, model, used)
    device_types = {**used, **{k: v for k, v in defined.items() if k not in used}}
    replicas = parse_replicas(
        d["replicas"], "replicas", model, training, groups, known, network.scale_up
    )
    plan = Plan(
        name=name,
        model=model,
        training=training,
        device_types=device_types,
        device_groups=groups,
        network=network,
        replicas=replicas,
        collectives=collectives,
        seed=seed,
        perturb=perturb,
    )
    check_fsdp(plan)  # every replica reaches the per-unit gathers in one order
    return plan


def _parse_device_types(value: Any, base_dir: str | None) -> dict[str, DeviceType]:
    m = f.expect_mapping(value, "device_types")
    presets = _device_presets()
    out = {}
    for name, entry in m.items():
        path = f.join("device_types", name)
        f.check_name(name, path, "device type name")
        out[name] = parse_device_type(entry, path, name, presets.get(name), base_dir)
    return out
