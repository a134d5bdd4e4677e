"""Find backends through the entry-point group ``xsim_adapters.backends`` and check them.

A backend plugin is a class registered as ``name = "package.module:Class"``. Loading checks it
against the contract in :mod:`xsim_adapters.backends.base` and raises
:class:`~xsim_adapters.errors.BackendContractError` naming the plugin and the mismatch. A plugin
whose module fails to import is not a crash: it is listed as unavailable with the import error,
because a missing optional dependency (cppyy, an htsim build) is the normal case.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from ..errors import BackendContractError, BackendUnavailable
from ..options import COMMON_OPTIONS, Option, check_options
from .base import Backend

GROUP = "xsim_adapters.backends"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """Entry points of the group by name; of two with one name, the lower value wins."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        found.setdefault(ep.name, ep)
    return found


def _where(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    dist_name = getattr(dist, "name", None) if dist is not None else None
    origin = f" from distribution {dist_name!r}" if dist_name else ""
    return f"backend plugin {ep.name!r} ({ep.value}{origin})"


def check_backend_class(cls: Any, expected_name: str, where: str) -> None:
    """Raise BackendContractError unless ``cls`` satisfies the backend contract.

    ``where`` names the plugin in the message (e.g. ``backend plugin 'ns3' (xsim_ns3:Ns3Backend)``).
    """
    if not inspect.isclass(cls):
        raise BackendContractError(
            f"{where}: must be a class, got {type(cls).__name__} {cls!r}"
        )
    problems: list[str] = []
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        problems.append(f"class attribute 'name' must be a non-empty string (got {name!r})")
    elif name != expected_name:
        problems.append(
            f"class attribute 'name' is {name!r} but the entry point is named {expected_name!r}"
        )
    avail = getattr(cls, "available", None)
    if avail is None or not callable(avail):
        problems.append("missing callable 'available() -> (bool, str)'")
    elif getattr(avail, "__isabstractmethod__", False):
        problems.append("'available' is abstract (not implemented)")
    run = getattr(cls, "run", None)
    if run is None or not callable(run):
        problems.append("missing callable 'run(trace, topology, options)'")
    elif getattr(run, "__isabstractmethod__", False):
        problems.append("'run' is abstract (not implemented)")
    else:
        try:
            params = list(inspect.signature(run).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [
            p for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        # self + trace + topology + options
        if params and not varargs and len(positional) < 4:
            problems.append(
                "'run' must accept (trace, topology, options); its signature is "
                f"run{inspect.signature(run)}"
            )
    if problems:
        raise BackendContractError(f"{where}: " + "; ".join(problems))


def _takes_options(cls: Any) -> bool:
    """Whether ``cls.available`` accepts the run's options (an optional argument)."""
    try:
        return len(inspect.signature(cls.available).parameters) >= 1
    except (TypeError, ValueError):
        return False


def _check_available(cls: Any, where: str,
                     options: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """Call ``cls.available()`` and check it returns (bool, str).

    ``options``: the options the run will get, passed to backends whose ``available`` takes
    them (e.g. htsim's ``driver`` path decides whether it can run).
    """
    try:
        if options is not None and _takes_options(cls):
            result = cls.available(options)
        else:
            result = cls.available()
    except Exception as exc:  # a plugin's probe failing means: not available here
        return False, f"available() raised {type(exc).__name__}: {exc}"
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not isinstance(result[0], bool)
        or not isinstance(result[1], str)
    ):
        raise BackendContractError(
            f"{where}: available() must return (bool, str), got {result!r}"
        )
    return result


def load_backend_class(name: str) -> type[Backend]:
    """The checked backend class registered as ``name``.

    Raises BackendUnavailable for an unknown name (listing the known ones) or a plugin that
    fails to import (with the import error), BackendContractError for a contract mismatch.
    """
    return _load(name)[0]


def _load(name: str) -> tuple[type[Backend], str]:
    """:func:`load_backend_class` and the plugin's description for messages (one scan of the
    installed distributions' entry points: ~0.06 s with a few hundred installed)."""
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        known = ", ".join(sorted(eps)) or "none installed"
        raise BackendUnavailable(f"unknown backend {name!r}; known backends: {known}")
    where = _where(ep)
    try:
        cls = ep.load()
    except Exception as exc:  # ImportError, or anything a plugin's import raises
        raise BackendUnavailable(
            f"{where} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    check_backend_class(cls, name, where)
    return cls, where


def get_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """An instance of the backend ``name``, ready to run (with ``options``, if given).

    Raises BackendUnavailable if the name is unknown, the plugin does not import, or its
    ``available()`` says it cannot run here (with its reason); BackendContractError if the
    plugin breaks the contract.
    """
    from .._argcheck import check_arg

    check_arg("get_backend", "name", name, str, "a backend name (str, e.g. 'flow')")
    check_arg("get_backend", "options", options, Mapping, "a mapping of backend options",
              optional=True)
    cls, where = _load(name)
    ok, reason = _check_available(cls, where, options)
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
    return cls()


def list_backends() -> list[tuple[str, bool, str]]:
    """Every registered backend as (name, available, reason), sorted by name.

    Never raises for a single bad plugin: an import failure or a contract mismatch is reported
    as unavailable with the error text as the reason.
    """
    out: list[tuple[str, bool, str]] = []
    for name, ep in sorted(_entry_points().items()):
        try:
            cls = load_backend_class(name)
            ok, reason = _check_available(cls, _where(ep))
        except (BackendUnavailable, BackendContractError) as exc:
            ok, reason = False, str(exc)
        out.append((name, ok, reason))
    return out


def backend_options(name: str) -> tuple[Option, ...]:
    """The options backend ``name`` declares (its class need not be available here).

    Raises BackendUnavailable for an unknown name or a plugin that fails to import,
    BackendContractError if ``options`` is not a sequence of Option.
    """
    cls = load_backend_class(name)
    # A plugin that does not subclass Backend and declares nothing accepts the common options.
    opts = tuple(getattr(cls, "options", COMMON_OPTIONS))
    bad = [o for o in opts if not isinstance(o, Option)]
    if bad:
        raise BackendContractError(f"{_where(_entry_points()[name])}: 'options' must hold"
                                   f" xsim_adapters.options.Option values (got {bad[0]!r})")
    return opts


def check_backend_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` validated against backend ``name``'s declaration (see
    :func:`xsim_adapters.options.check_options`); used before any work is done."""
    return check_options(name, backend_options(name), options)


def backend_names() -> list[str]:
    """Names of every registered backend (installed or not), sorted."""
    return sorted(_entry_points())
