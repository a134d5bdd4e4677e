"""Size rule of the core (STYLE.md, issue 26): no module over :data:`MAX_MODULE_LINES` lines and
no function over :data:`MAX_FUNCTION_LINES` lines in ``xsim_adapters/`` and the plugins' Python,
except those listed in :data:`EXCEPTIONS`, each with its reason.

A module's size is its line count; a function's is from its ``def`` line to its last line (a
nested function counts inside its parent and on its own). A new offender fails; so does a
listed one that is back under the limit (delete its line: the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import helpers
import pytest

REPO = helpers.REPO
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
# The core's Python: the package and each plugin's package.
ROOTS = (
    REPO / "xsim_adapters",
    REPO / "plugins" / "ns3" / "xsim_ns3",
    REPO / "plugins" / "htsim" / "xsim_htsim",
    REPO / "plugins" / "flowcore" / "src" / "xsim_flowcore",
)

# "path" (a module) or "path:function" (repository-relative) -> why it is over the limit.
EXCEPTIONS: dict[str, str] = {
    "xsim_adapters/backends/flow/executor.py:run":
        "the pure-Python flow engine's hot loop, kept in one frame for speed (noqa C901 there)",
    "xsim_adapters/metrics/ranks.py:rank_metrics":
        "memory-staged: each column freed before the sort (the metrics' peak); split with bench",
    "plugins/htsim/xsim_htsim/_input.py:write_input":
        "the driver's binary input, section by section in format order; needs an htsim build",
    "xsim_adapters/plan/model.py":
        "the validated plan's frozen dataclasses, one per section (606 lines with FSDP): to split",
    "plugins/ns3/xsim_ns3/_prepare.py:prepare":
        "builds the ns-3 scenario in one pass; a split must be checked on ns-3 runs (long)",
}


def _python_files() -> list[Path]:
    return sorted(p for root in ROOTS for p in root.rglob("*.py") if "build" not in p.parts)


def measure(path: Path, repo: Path = REPO) -> dict[str, int]:
    """Offenders of ``path``: its key (see :data:`EXCEPTIONS`, relative to ``repo``) -> its
    lines, for the module and each function over the limits."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(repo).as_posix()
    out = {}
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        out[rel] = lines
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out[f"{rel}:{node.name}"] = n
    return out


def offenders() -> dict[str, int]:
    found: dict[str, int] = {}
    for p in _python_files():
        found.update(measure(p))
    return found


def test_no_module_or_function_over_the_limit_unless_listed() -> None:
    found = offenders()
    new = {k: v for k, v in found.items() if k not in EXCEPTIONS}
    assert not new, (
        f"over {MAX_MODULE_LINES} lines per module / {MAX_FUNCTION_LINES} per function: "
        + ", ".join(f"{k} ({v} lines)" for k, v in sorted(new.items()))
        + "; split it, or list it in EXCEPTIONS with a one-line reason"
    )


def test_every_exception_is_still_needed_and_has_a_reason() -> None:
    found = offenders()
    gone = sorted(k for k in EXCEPTIONS if k not in found)
    assert not gone, f"no longer over the limit, delete from EXCEPTIONS: {', '.join(gone)}"
    for key, reason in EXCEPTIONS.items():
        assert reason.strip() and "\n" not in reason, key


def test_the_roots_hold_the_core() -> None:
    files = {p.relative_to(REPO).as_posix() for p in _python_files()}
    assert "xsim_adapters/api.py" in files
    assert "plugins/ns3/xsim_ns3/_prepare.py" in files
    assert "plugins/htsim/xsim_htsim/_input.py" in files


@pytest.mark.parametrize(("body", "expect"), [
    (MAX_FUNCTION_LINES - 1, {}),  # the def line and 99 body lines: at the limit, allowed
    (MAX_FUNCTION_LINES, {"m.py:f": MAX_FUNCTION_LINES + 1}),
])
def test_a_planted_long_function_is_caught(tmp_path: Path, body: int,
                                           expect: dict[str, int]) -> None:
    p = tmp_path / "m.py"
    p.write_text("def f():\n" + "    x = 1\n" * body, encoding="utf-8")
    assert measure(p, tmp_path) == expect


def test_a_planted_long_module_is_caught(tmp_path: Path) -> None:
    p = tmp_path / "big.py"
    p.write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    assert measure(p, tmp_path) == {"big.py": MAX_MODULE_LINES + 1}
    p.write_text("x = 1\n" * MAX_MODULE_LINES, encoding="utf-8")
    assert measure(p, tmp_path) == {}
