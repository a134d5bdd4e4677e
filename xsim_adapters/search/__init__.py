"""``xsim search``: find the fastest (or cheapest) plan for a cluster (docs/search.md).

Modules, one idea each: :mod:`.spec` (the spec YAML), :mod:`.space` (enumeration),
:mod:`.bound` (compute model, splits, memory, lower bound), :mod:`.bnb` (branch and bound),
:mod:`.evaluate` (simulation on the sweep executors), :mod:`.outputs` (files), :mod:`.api`.
"""

from .api import SearchResult, search, write_result
from .spec import SearchSpec, load_search_spec, spec_from_dict

__all__ = ["SearchResult", "SearchSpec", "load_search_spec", "search", "spec_from_dict",
           "write_result"]
