"""ns-3 backend of xsim-adapters: packet-level replay on the official ns-3 Python wheel."""

from ._backend import Ns3Backend
from ._options import Ns3Options, parse_options

__all__ = ["Ns3Backend", "Ns3Options", "parse_options"]
