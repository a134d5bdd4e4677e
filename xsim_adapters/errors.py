"""The exception hierarchy: every error the project raises on purpose is an ``XsimError``."""

from __future__ import annotations


class XsimError(Exception):
    """Base class of every error xsim-adapters raises on purpose."""


class PlanError(XsimError, ValueError):
    """A plan is malformed: the message names the YAML path, what was expected, what was found."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)


class PlanWarning(UserWarning):
    """A plan loads, but means something it may not have meant before (shown once, one line)."""


class InfeasiblePlanError(XsimError, ValueError):
    """A well-formed plan cannot run (e.g. a stage does not fit in device memory)."""


class TraceError(XsimError, ValueError):
    """A trace on disk is missing, damaged or of an unsupported schema version."""


class BackendError(XsimError, RuntimeError):
    """A backend failed to finish a replay; the message carries the simulator's own words."""


class OptionError(BackendError, ValueError):
    """A backend option is unknown or its value has the wrong type or range."""


class BackendUnavailable(XsimError, RuntimeError):
    """A backend cannot run here (a missing dependency); the message says what is missing."""


class BackendContractError(XsimError, TypeError):
    """A registered backend plugin does not satisfy the backend contract."""


class OutputError(XsimError, FileExistsError):
    """An output path holds data xsim did not write (or another kind of output); nothing is
    replaced, and the message says how to proceed."""


class ArgumentTypeError(XsimError, TypeError):
    """A Python API function got an argument of the wrong type: the message names the
    function, the argument, what was expected and what was got."""
