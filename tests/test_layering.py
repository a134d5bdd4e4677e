"""The layering contract of DESIGN.md ("Layering"), checked on the source with ``ast``.

Every module of ``xsim_adapters/`` and of the three plugins is parsed; every import counts,
at module level, inside functions, under ``if TYPE_CHECKING:`` and as
``importlib.import_module("constant")``; relative imports are resolved against the importing
module's package. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg`` (its ``__init__``). The rules:

- ``up``: a module imports only its own layer or layers below it (:data:`LAYERS`).
- ``metrics/report``: metrics and report never import backends, plugins or a generator
  (``workload/``, :mod:`xsim_adapters.traffic`), whatever the layer order says.
- ``simulator``: the core (``xsim_adapters``) never imports a simulator (:data:`SIMULATORS`);
  plugins do, that is what they are for.
- ``cycle``: no import circle through modules of different folders (a strongly connected
  component of the module graph spanning two or more folders; a circle inside one folder is
  that folder's business).

Today's violations are listed in :data:`KNOWN_VIOLATIONS` and :data:`KNOWN_CYCLES` with the
issue that removes them. A new violation fails; so does a listed one that is gone (delete its
line: the lists only shrink).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import helpers
import pytest

REPO = helpers.REPO
PACKAGE = "xsim_adapters"
# Source roots: top-level package name -> its directory.
ROOTS = {
    PACKAGE: REPO / "xsim_adapters",
    "xsim_ns3": REPO / "plugins" / "ns3" / "xsim_ns3",
    "xsim_htsim": REPO / "plugins" / "htsim" / "xsim_htsim",
    "xsim_flowcore": REPO / "plugins" / "flowcore" / "src" / "xsim_flowcore",
}

# Lowest first. DESIGN.md writes "plan < topology < workload < trace < backends ..." in the
# order data flows; for imports the trace contract sits below the generator that writes it
# (every generator module imports trace.schema's column and kind constants, and the contract
# must not know its producer: the hand-made ring traces live in testing/, issue 26).
# "base" holds the stdlib-only helpers every layer may use. "apps" is sweep and search, "cli"
# the command line on top of everything (it parses arguments for every other layer's entry).
# "feasibility" is the post-load checks of a plan that need the generator's models and the
# built topology (size, what-if events, memory): above plan, topology and workload, so that
# plan stays input only; every command loads plans through it (26, item 1).
# "interop" (peer formats in, e.g. Chakra ET) builds a trace with the generator's own lowering,
# so it sits above workload; it runs nothing, so it stays below the backends.
LAYERS = ("base", "plan", "topology", "trace", "workload", "feasibility", "interop", "backends",
          "metrics", "report", "api", "apps", "cli")
RANK = {layer: i for i, layer in enumerate(LAYERS)}

# Sub-packages of xsim_adapters/ -> layer.
FOLDER_LAYER = {
    "plan": "plan", "topology": "topology", "trace": "trace", "workload": "workload",
    "interop": "interop", "backends": "backends", "metrics": "metrics", "report": "report",
    "sweep": "apps", "search": "apps", "cli": "cli", "feasibility": "feasibility",
    # hand-made test traces: ring collectives lowered by the generator's ring lowering into
    # the trace contract's TraceBuilder (moved out of trace/, 26 item 4).
    "testing": "workload",
}

# Every module at the top of xsim_adapters/ (and each plugin package) in one layer, and why.
# A new top-level module fails test_every_module_has_a_layer until it is placed here.
MODULE_LAYER = {
    # stdlib only: the exception hierarchy every layer raises.
    "xsim_adapters.errors": "base",
    # stdlib only: atomic file writes, used by trace export, plan serialisation and report.
    "xsim_adapters._atomic": "base",
    # stdlib only: child processes that die with their parent, owned temporary directories;
    # used by the plugins' workers and the sweep.
    "xsim_adapters._proc": "base",
    # the output-path rule (docs/outputs.md): file-system only, no plan or trace knowledge.
    "xsim_adapters._outdir": "base",
    # the package version, a constant: read by the output stamp and `xsim --version`.
    "xsim_adapters._version": "base",
    # argument type checks of the public Python API: errors only.
    "xsim_adapters._argcheck": "base",
    # "did you mean": difflib over a list of names, for plan keys, options and sweep axes.
    "xsim_adapters._suggest": "base",
    # stdlib only: times as the terminal prints them (summary lines and pictures).
    "xsim_adapters._units": "base",
    # the published front door for backend authors (docs/backends.md): re-exports the trace,
    # topology, timeline, options and process helpers a backend needs.
    "xsim_adapters.backend_api": "backends",
    # backend options: declared by each backend, validated for every backend.
    "xsim_adapters.options": "backends",
    # background traffic: a synthetic job's trace, generated from a traffic file like the
    # workload generator's from a plan; a job file that is a plan is loaded checked
    # (feasibility.plan_from_dict), so it sits beside the checks.
    "xsim_adapters.traffic": "feasibility",
    # several jobs on one fabric: generate, replay together and measure (a pipeline run).
    "xsim_adapters.jobs": "api",
    # nccl-tests on the simulator: lowers and replays a collective, a pipeline run.
    "xsim_adapters.bench_collective": "api",
    # fits a device constant by running the pipeline through the API.
    "xsim_adapters.calibrate": "api",
    "xsim_adapters.api": "api",
    # the package's __init__ re-exports the API.
    "xsim_adapters": "api",
    # plugins are backends (DESIGN: "backends (+ plugins ...)"); the compiled flow core is the
    # flow backend's engine.
    "xsim_ns3": "backends",
    "xsim_htsim": "backends",
    "xsim_flowcore": "backends",
}

# Top-level names of simulator packages the core must never import.
SIMULATORS = frozenset({"ns", "ns3", "cppyy", "libcppyy", "htsim", "xsim_ns3", "xsim_htsim"})
PLUGINS = ("xsim_ns3", "xsim_htsim", "xsim_flowcore")

# rule: importer -> imported (short names: without "xsim_adapters.") -> issue that fixes it.
KNOWN_VIOLATIONS: dict[str, int] = {
    # the validator's cycle check uses the flow backend's optional compiled engine when it is
    # installed (numpy otherwise): the one upward import issue 26's acceptance allows.
    "up: trace.validate -> xsim_flowcore": 26,
}

# Import circles through more than one folder: the modules of each, sorted (26). The imports
# across folders inside each, i.e. what to cut, are in the failure message of a changed one.
KNOWN_CYCLES: dict[tuple[str, ...], int] = {
}


@dataclass(frozen=True)
class Import:
    """One import edge: ``importer`` imports ``imported`` (module names) at ``line``."""

    importer: str
    imported: str
    line: int


def module_sources(roots: Mapping[str, Path] = ROOTS) -> dict[str, tuple[Path, bool]]:
    """Every module under ``roots``: name -> (file, is a package ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for top, directory in roots.items():
        for path in sorted(directory.rglob("*.py")):
            parts = [top, *path.relative_to(directory).with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _statements(nodes: list[ast.stmt]) -> Iterable[ast.AST]:
    """Every statement in ``nodes`` and the blocks nested in them (functions, classes, if, try,
    with, loops, match): where an import statement can be, without walking expressions."""
    for node in nodes:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, []))


def _imported_names(node: ast.AST, package: str) -> list[str]:
    """The dotted names one AST node imports (absolute), ``[]`` when it imports nothing."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        return [module] + [f"{module}.{alias.name}" for alias in node.names]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                 or isinstance(node.func, ast.Name) and node.func.id == "__import__")):
        return [node.args[0].value]
    return []


def imports_of(name: str, text: str, is_pkg: bool, modules: Mapping[str, object]
               ) -> tuple[list[Import], list[Import]]:
    """Internal and external imports of one module (source ``text``) among ``modules``.

    Internal: edges to ``modules`` (an ``ImportFrom`` counts its names that are modules, the
    module itself for the others). External: the top-level name of anything else, as
    ``Import(name, top_name, line)``. The first line of each edge is kept.
    """
    internal: dict[str, int] = {}
    external: dict[str, int] = {}
    package = name if is_pkg else name.rpartition(".")[0]
    tree = ast.parse(text, name)
    dynamic = "import_module" in text or "__import__" in text  # else no Call can import
    for node in ast.walk(tree) if dynamic else _statements(tree.body):
        names = _imported_names(node, package)
        if isinstance(node, ast.ImportFrom):  # a name that is no module is the package's
            names = list(dict.fromkeys(n if n in modules else names[0] for n in names[1:]))
        for target in names:
            resolved = _resolve(target, modules)
            line = getattr(node, "lineno", 0)
            if resolved is None:
                external.setdefault(target.split(".")[0], line)
            elif resolved != name:
                internal.setdefault(resolved, line)
    return ([Import(name, b, n) for b, n in sorted(internal.items())],
            [Import(name, b, n) for b, n in sorted(external.items())])


def parse_imports(texts: Mapping[str, tuple[str, bool]]) -> tuple[list[Import], list[Import]]:
    """:func:`imports_of` every module given as name -> (source text, is a package)."""
    internal: list[Import] = []
    external: list[Import] = []
    for name, (text, is_pkg) in sorted(texts.items()):
        inner, outer = imports_of(name, text, is_pkg, texts)
        internal += inner
        external += outer
    return internal, external


def _resolve(target: str, modules: Mapping[str, object]) -> str | None:
    """The longest prefix of ``target`` that is one of ``modules``, else None."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def short(module: str) -> str:
    """``xsim_adapters.plan.limits`` -> ``plan.limits`` (the package itself stays whole)."""
    return module.removeprefix(PACKAGE + ".")


def folder(module: str, is_pkg: bool) -> str:
    """The directory a module's file is in, as a dotted name."""
    return module if is_pkg else module.rpartition(".")[0]


def layer_of(module: str) -> str | None:
    """The layer of one module: :data:`MODULE_LAYER`, else its sub-package's, else None."""
    if module in MODULE_LAYER:
        return MODULE_LAYER[module]
    top, _, rest = module.partition(".")
    if top in PLUGINS:
        return MODULE_LAYER[top]
    if top == PACKAGE and rest:
        return FOLDER_LAYER.get(rest.partition(".")[0])
    return None


def _is_generator(module: str) -> bool:
    return module.startswith(PACKAGE + ".workload") or module == PACKAGE + ".traffic"


def violations(internal: list[Import], external: list[Import]) -> dict[str, Import]:
    """Every rule broken by one import: ``"rule: importer -> imported"`` -> the import."""
    found: dict[str, Import] = {}
    for imp in internal:
        src, dst = layer_of(imp.importer), layer_of(imp.imported)
        if src is None or dst is None:
            continue  # reported by test_every_module_has_a_layer
        if RANK[dst] > RANK[src]:
            found[f"up: {short(imp.importer)} -> {short(imp.imported)}"] = imp
        if src in ("metrics", "report") and (dst == "backends" or _is_generator(imp.imported)):
            found[f"metrics/report: {short(imp.importer)} -> {short(imp.imported)}"] = imp
    for imp in internal + external:
        top = imp.imported.partition(".")[0]
        if imp.importer.partition(".")[0] == PACKAGE and top in SIMULATORS:
            found[f"simulator: {short(imp.importer)} -> {imp.imported}"] = imp
    return found


def cross_folder_cycles(internal: list[Import], packages: set[str]) -> list[tuple[str, ...]]:
    """Strongly connected components (Tarjan) of two or more modules spanning two or more
    folders, each as its sorted short names; ``packages`` names the ``__init__`` modules."""
    graph: dict[str, list[str]] = {}
    for imp in internal:
        graph.setdefault(imp.importer, []).append(imp.imported)
        graph.setdefault(imp.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]  # iterative: no recursion limit on deep chains
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len({folder(m, m in packages) for m in component}) > 1:
                        out.append(tuple(sorted(short(m) for m in component)))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(out)


def cross_folder_imports(internal: list[Import], members: tuple[str, ...],
                         packages: set[str]) -> list[Import]:
    """The imports between ``members`` (short names) that cross folders: what to cut."""
    inside = set(members)
    return [imp for imp in internal
            if short(imp.importer) in inside and short(imp.imported) in inside
            and folder(imp.importer, imp.importer in packages)
            != folder(imp.imported, imp.imported in packages)]


def read_texts(modules: Mapping[str, tuple[Path, bool]]) -> dict[str, tuple[str, bool]]:
    """name -> (source text, is a package) of ``modules``."""
    return {name: (path.read_text(encoding="utf-8"), is_pkg)
            for name, (path, is_pkg) in modules.items()}


def read_tree() -> tuple[dict[str, tuple[Path, bool]], list[Import], list[Import]]:
    """The modules of :data:`ROOTS` and their internal and external imports."""
    modules = module_sources()
    return (modules, *parse_imports(read_texts(modules)))


@pytest.fixture(scope="module")
def tree() -> tuple[dict[str, tuple[Path, bool]], list[Import], list[Import]]:
    return read_tree()


def _where(imp: Import, modules: Mapping[str, tuple[Path, bool]]) -> str:
    return f"{modules[imp.importer][0].relative_to(REPO)}:{imp.line}"


def test_every_module_has_a_layer(tree):
    modules, _, _ = tree
    unplaced = sorted(m for m in modules if layer_of(m) is None)
    assert not unplaced, (
        f"modules in no layer (add them to MODULE_LAYER or FOLDER_LAYER in {Path(__file__).name}"
        f" with a reason): {', '.join(unplaced)}")


def test_no_new_layering_violation(tree):
    modules, internal, external = tree
    found = violations(internal, external)
    new = [f"{key} ({_where(found[key], modules)})" for key in sorted(found)
           if key not in KNOWN_VIOLATIONS]
    assert not new, "imports that break DESIGN.md's layering:\n  " + "\n  ".join(new)


def test_known_violations_still_exist(tree):
    _, internal, external = tree
    gone = sorted(set(KNOWN_VIOLATIONS) - set(violations(internal, external)))
    assert not gone, ("fixed (delete them from KNOWN_VIOLATIONS in "
                      f"{Path(__file__).name}):\n  " + "\n  ".join(gone))


def test_no_new_import_circle(tree):
    modules, internal, _ = tree
    packages = {m for m, (_, is_pkg) in modules.items() if is_pkg}
    new = [c for c in cross_folder_cycles(internal, packages) if c not in KNOWN_CYCLES]
    lines = []
    for members in new:
        cuts = [f"{short(i.importer)} -> {short(i.imported)} ({_where(i, modules)})"
                for i in cross_folder_imports(internal, members, packages)]
        more = f"; and {len(cuts) - 12} more" if len(cuts) > 12 else ""
        lines.append(f"{len(members)} modules ({', '.join(members)}) through imports across "
                     f"folders {'; '.join(cuts[:12])}{more}")
    assert not lines, "import circles through different folders:\n  " + "\n  ".join(lines)


def test_known_circles_still_exist(tree):
    modules, internal, _ = tree
    packages = {m for m, (_, is_pkg) in modules.items() if is_pkg}
    gone = sorted(set(KNOWN_CYCLES) - set(cross_folder_cycles(internal, packages)))
    assert not gone, ("gone or changed (replace them in KNOWN_CYCLES in "
                      f"{Path(__file__).name}):\n  " + "\n  ".join(", ".join(c) for c in gone))


def test_parse_resolves_relative_and_function_imports():
    texts = {
        "xsim_adapters": ("", True),
        "xsim_adapters.trace": ("from .schema import Trace\n", True),
        "xsim_adapters.trace.schema": ("def f():\n    from ..workload import gen\n", False),
        "xsim_adapters.workload": ("from . import gen\nimport numpy.linalg\n", True),
        "xsim_adapters.workload.gen": (
            "import importlib\nimportlib.import_module('ns3')\n"
            "from xsim_adapters.trace import schema, Trace\n", False),
    }
    internal, external = parse_imports(texts)
    assert {(short(i.importer), short(i.imported), i.line) for i in internal} == {
        ("trace", "trace.schema", 1), ("trace.schema", "workload.gen", 2),
        ("workload", "workload.gen", 1), ("workload.gen", "trace.schema", 3),
        ("workload.gen", "trace", 3)}
    assert {(short(i.importer), i.imported) for i in external} == {
        ("workload", "numpy"), ("workload.gen", "importlib"), ("workload.gen", "ns3")}
    assert sorted(violations(internal, external)) == [
        "simulator: workload.gen -> ns3", "up: trace.schema -> workload.gen"]
    packages = {m for m, (_, is_pkg) in texts.items() if is_pkg}
    assert cross_folder_cycles(internal, packages) == [
        ("trace", "trace.schema", "workload.gen")]


def test_a_planted_violation_fails(tree):
    """``import xsim_adapters.workload`` inside a function of trace/schema.py: an import up a
    layer and a new circle (workload imports trace.schema)."""
    modules, internal, external = tree
    name = "xsim_adapters.trace.schema"
    path, is_pkg = modules[name]
    planted = "\n\ndef _planted():\n    import xsim_adapters.workload\n"
    text = path.read_text(encoding="utf-8") + planted
    inner, outer = imports_of(name, text, is_pkg, modules)
    planted_internal = [i for i in internal if i.importer != name] + inner
    planted_external = [i for i in external if i.importer != name] + outer
    new = set(violations(planted_internal, planted_external)) - set(KNOWN_VIOLATIONS)
    assert new == {"up: trace.schema -> workload"}
    packages = {m for m, (_, is_pkg) in modules.items() if is_pkg}
    cycles = [c for c in cross_folder_cycles(planted_internal, packages)
              if c not in KNOWN_CYCLES]
    assert len(cycles) == 1 and {"trace.schema", "workload"} <= set(cycles[0])
