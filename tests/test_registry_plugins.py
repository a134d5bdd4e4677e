"""The backend registry, with the installed distributions faked (no installs)."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import pytest

from xsim_adapters.backends import registry
from xsim_adapters.backends.base import Backend
from xsim_adapters.errors import BackendContractError, BackendUnavailable
from xsim_adapters.trace.timeline import Timeline


class GoodBackend(Backend):
    name = "good"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    def run(self, trace, topology, options) -> Timeline:  # pragma: no cover - not run here
        raise NotImplementedError


class MissingDepBackend(GoodBackend):
    name = "needsdep"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return False, "install the ns-3 wheel: pip install ns3"


class NeedsToolOption(GoodBackend):
    """Available only when the run's options name its tool (as htsim's ``driver``)."""

    name = "needstool"

    @classmethod
    def available(cls, options=None) -> tuple[bool, str]:
        if (options or {}).get("tool"):
            return True, ""
        return False, "tool not found: pass --option tool=PATH"


class WrongName(GoodBackend):
    name = "other"


class NoRun:
    name = "norun"

    @classmethod
    def available(cls):
        return True, ""


class BadAvailable(GoodBackend):
    name = "badavail"

    @classmethod
    def available(cls):
        return "yes"


class ShortRun(GoodBackend):
    name = "shortrun"

    def run(self, trace):  # type: ignore[override]
        raise NotImplementedError


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch):
    """Install a fake module and fake entry points; return a function to set the list."""
    mod = types.ModuleType("fake_xsim_plugins")
    for cls in (GoodBackend, MissingDepBackend, NeedsToolOption, WrongName, NoRun,
                BadAvailable, ShortRun):
        setattr(mod, cls.__name__, cls)
    mod.not_a_class = 42
    monkeypatch.setitem(sys.modules, "fake_xsim_plugins", mod)
    current: list[metadata.EntryPoint] = []

    def fake_entry_points(**kw):
        assert kw == {"group": registry.GROUP}
        return metadata.EntryPoints(current)

    monkeypatch.setattr(registry.metadata, "entry_points", fake_entry_points)

    def set_eps(**named: str) -> None:
        current[:] = [metadata.EntryPoint(n, v, registry.GROUP) for n, v in named.items()]

    return set_eps


def test_get_backend_returns_an_instance(plugins) -> None:
    plugins(good="fake_xsim_plugins:GoodBackend")
    b = registry.get_backend("good")
    assert isinstance(b, GoodBackend)
    assert registry.list_backends() == [("good", True, "")]


def test_unknown_name_lists_known_backends(plugins) -> None:
    plugins(good="fake_xsim_plugins:GoodBackend", needsdep="fake_xsim_plugins:MissingDepBackend")
    with pytest.raises(BackendUnavailable) as ei:
        registry.get_backend("ns4")
    assert str(ei.value) == "unknown backend 'ns4'; known backends: good, needsdep"


def test_unavailable_backend_carries_its_reason(plugins) -> None:
    plugins(needsdep="fake_xsim_plugins:MissingDepBackend")
    with pytest.raises(BackendUnavailable, match="install the ns-3 wheel: pip install ns3"):
        registry.get_backend("needsdep")
    assert registry.list_backends() == [
        ("needsdep", False, "install the ns-3 wheel: pip install ns3")
    ]


def test_available_sees_the_run_options_when_it_takes_them(plugins) -> None:
    plugins(needstool="fake_xsim_plugins:NeedsToolOption", good="fake_xsim_plugins:GoodBackend")
    with pytest.raises(BackendUnavailable, match="tool not found: pass --option tool=PATH"):
        registry.get_backend("needstool")
    assert isinstance(registry.get_backend("needstool", {"tool": "/opt/t"}), NeedsToolOption)
    # a backend whose available() takes no argument still works when options are given
    assert isinstance(registry.get_backend("good", {"seed": 1}), GoodBackend)


def test_import_failure_is_unavailable_not_a_crash(plugins) -> None:
    plugins(ghost="no_such_module_xsim.sub:Backend", good="fake_xsim_plugins:GoodBackend")
    listed = dict((n, (ok, why)) for n, ok, why in registry.list_backends())
    assert listed["good"] == (True, "")
    ok, why = listed["ghost"]
    assert not ok
    assert why.startswith("backend plugin 'ghost' (no_such_module_xsim.sub:Backend) failed to "
                          "import: ModuleNotFoundError: No module named 'no_such_module_xsim'")
    with pytest.raises(BackendUnavailable, match="failed to import"):
        registry.get_backend("ghost")


@pytest.mark.parametrize("name,target,message", [
    ("wrong", "WrongName",
     "class attribute 'name' is 'other' but the entry point is named 'wrong'"),
    ("norun", "NoRun", "missing callable 'run(trace, topology, options)'"),
    ("shortrun", "ShortRun", "'run' must accept (trace, topology, options); its signature is "
                             "run(self, trace)"),
    ("notclass", "not_a_class", "must be a class, got int 42"),
])
def test_contract_violations_name_plugin_and_mismatch(plugins, name, target, message) -> None:
    plugins(**{name: f"fake_xsim_plugins:{target}"})
    with pytest.raises(BackendContractError) as ei:
        registry.get_backend(name)
    text = str(ei.value)
    assert text.startswith(f"backend plugin '{name}' (fake_xsim_plugins:{target})")
    assert message in text
    # Listing survives a broken plugin and shows the same message.
    [(n, ok, why)] = registry.list_backends()
    assert (n, ok, why) == (name, False, text)


def test_available_must_return_bool_and_reason(plugins) -> None:
    plugins(badavail="fake_xsim_plugins:BadAvailable")
    with pytest.raises(BackendContractError, match=r"available\(\) must return \(bool, str\), "
                                                   r"got 'yes'"):
        registry.get_backend("badavail")


def test_abstract_backend_is_rejected(plugins) -> None:
    plugins(abstract="xsim_adapters.backends.base:Backend")
    with pytest.raises(BackendContractError) as ei:
        registry.get_backend("abstract")
    assert "class attribute 'name' must be a non-empty string (got '')" in str(ei.value)
    assert "'available' is abstract (not implemented)" in str(ei.value)
    assert "'run' is abstract (not implemented)" in str(ei.value)


def test_real_installation_registers_flow() -> None:
    assert "flow" in registry.backend_names()
