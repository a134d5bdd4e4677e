"""Fixtures shared by many test files. Helper functions and hand-built cases are in
:mod:`helpers` (``tests/helpers/``), importable from every test under any import mode:
pyproject.toml's ``pythonpath`` puts ``tests/`` on ``sys.path``."""

from __future__ import annotations

import pytest
from helpers.htsim import driver_path


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The htsim driver binary: ``$XSIM_HTSIM_DRIVER``, else built once per session from
    ``plugins/htsim/driver`` against ``$HTSIM_DIR``; skips the test (saying how to enable it)
    when neither is set (:func:`helpers.htsim.driver_path`)."""
    return str(driver_path(tmp_path_factory))
