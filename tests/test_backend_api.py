"""The front door for backend authors (``xsim_adapters.backend_api``) and who goes through it.

The shipped backends (the embedded flow backend, the ns-3 and htsim plugins) import from
``xsim_adapters`` only through ``backend_api``; the three compiled engines share one max-min
header, installed with the core package, whose constants are the Python reference's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import xsim_adapters.backend_api as api
from xsim_adapters.backends.flow import maxmin

ROOT = Path(__file__).resolve().parent.parent
HEADER = api.NATIVE_INCLUDE_DIR / "xsim" / "maxmin.hpp"
# Python sources that must reach the core only through the front door.
BACKEND_SOURCES = sorted([*ROOT.glob("plugins/*/xsim_*/*.py"),
                          *ROOT.glob("xsim_adapters/backends/flow/*.py")])
# The C++ files of the three engines that use the shared solver.
ENGINE_SOURCES = ["plugins/flowcore/src/flowcore/executor.cpp",
                  "plugins/flowcore/src/flowcore/module.cpp",
                  "plugins/ns3/xsim_ns3/engine.cpp",
                  "plugins/htsim/driver/fluid.h"]


def core_imports(path: Path, package: tuple[str, ...] | None = None) -> list[str]:
    """The ``xsim_adapters`` modules ``path`` imports (absolute and relative), as dotted names;
    ``package``: the package ``path`` is in (default: from its place in the repository)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                found.append(".".join([*base, *([node.module] if node.module else [])]))
            else:
                found.append(node.module or "")
    return [m for m in found if m == "xsim_adapters" or m.startswith("xsim_adapters.")]


def test_the_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in BACKEND_SOURCES}
    assert {"plugins/ns3/xsim_ns3/_backend.py", "plugins/htsim/xsim_htsim/_input.py",
            "xsim_adapters/backends/flow/backend.py"} <= names


def test_backends_import_the_core_only_through_the_front_door():
    bad = []
    for path in BACKEND_SOURCES:
        for mod in core_imports(path):
            inside_flow = mod.startswith("xsim_adapters.backends.flow")
            if mod != "xsim_adapters.backend_api" and not inside_flow:
                bad.append(f"{path.relative_to(ROOT)}: {mod}")
    assert not bad, "import from xsim_adapters.backend_api instead:\n" + "\n".join(bad)


def test_core_imports_sees_relative_and_absolute_forms(tmp_path):
    """The checker itself: a planted deep import, in either form, is reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ...trace.schema import Trace\nimport xsim_adapters._proc\n"
                     "from .executor import FlowProblem\nimport numpy\n")
    assert core_imports(probe, ("xsim_adapters", "backends", "flow")) == [
        "xsim_adapters.trace.schema", "xsim_adapters._proc", "xsim_adapters.backends.flow.executor"]


def test_every_published_name_resolves_once():
    assert len(set(api.__all__)) == len(api.__all__)
    missing = [n for n in api.__all__ if not hasattr(api, n)]
    assert not missing
    public = {n for n in vars(api) if not n.startswith("_")} - {"annotations", "Path"}
    assert public == set(api.__all__)


def test_published_names_are_the_core_objects():
    from xsim_adapters import _proc, errors
    from xsim_adapters.trace import slowdowns, timeline

    assert api.owned_tempdir is _proc.owned_tempdir
    assert api.child_preexec is _proc.child_preexec
    assert api.BackendError is errors.BackendError
    assert api.slowdown_schedule is slowdowns.schedule
    assert api.Timeline is timeline.Timeline


def test_the_shared_header_ships_with_the_core():
    assert HEADER.is_file()
    text = (ROOT / "pyproject.toml").read_text()
    globs = re.search(r'\[tool\.setuptools\.package-data\]\s*xsim_adapters = \[([^\]]*)\]', text)
    assert globs is not None
    patterns = re.findall(r'"([^"]+)"', globs.group(1))
    pkg = ROOT / "xsim_adapters"
    assert any(HEADER in set(pkg.glob(p)) for p in patterns), patterns


@pytest.mark.parametrize("source", ENGINE_SOURCES)
def test_each_engine_includes_the_shared_header(source):
    assert '#include "xsim/maxmin.hpp"' in (ROOT / source).read_text()


def test_one_solver_and_one_completion_rule_in_the_cpp_sources():
    cpp = [p for ext in ("cpp", "h", "hpp") for p in ROOT.glob(f"plugins/**/*.{ext}")]
    cpp.append(HEADER)
    defines = [p for p in cpp if "class MaxMinSolver" in p.read_text()]
    assert defines == [HEADER]
    # the old per-engine completion slacks (half a tick plus a literal) are gone
    copies = [p for p in cpp if re.search(r"rate\s*\*\s*0\.5\s*\+", p.read_text())]
    assert copies == [HEADER]


def test_header_constants_are_the_python_reference_constants():
    text = HEADER.read_text()
    tol = re.search(r"kMaxMinRelTol = ([0-9.e+-]+);", text)
    small = re.search(r"kMaxMinSmallEntries = (\d+);", text)
    assert tol is not None and small is not None
    assert float(tol.group(1)) == maxmin._REL_TOL
    assert int(small.group(1)) == maxmin.SMALL_ENTRIES
