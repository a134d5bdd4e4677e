"""YAML text -> plain data with bounded work: the first step of reading a plan.

libyaml's parser (when PyYAML has it) produces the events, PyYAML's composer builds the node
graph under the bounds of :class:`_Bounded`, and a SafeConstructor that rejects duplicate keys
and absurdly long integers builds the Python values. Every failure is a one-line PlanError
with a line and column.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from ..errors import PlanError
from . import _fields as f
from . import limits as lim

# A syntax error found by libyaml is re-read by the pure-Python parser for its (familiar)
# message when the text is short enough to re-read quickly.
PYTHON_RETRY_CHARS = 64 * 1024


class _Bounded:
    """Composer hooks that bound the work of composing a YAML document.

    While the document is composed (before any Python object exists) they count nesting depth,
    alias uses and nodes with every alias expanded, and stop at the limits of
    :mod:`.limits` (MAX_YAML_DEPTH, MAX_YAML_ALIASES, MAX_YAML_NODES): a "billion laughs"
    document is refused after at most MAX_YAML_NODES nodes of work.
    """

    check_event: Any
    peek_event: Any

    def _init_bounds(self) -> None:
        self._max_nodes = lim.MAX_YAML_NODES
        self._depth = 0
        self._aliases = 0
        self._nodes = 0  # nodes so far, aliases expanded
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once complete

    def _where(self) -> str:
        mark = self.peek_event().start_mark
        return f"line {mark.line + 1}, column {mark.column + 1}"

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            where = self._where()
            self._aliases += 1
            if self._aliases > lim.MAX_YAML_ALIASES:
                raise PlanError(
                    "", f"invalid YAML at {where}: more than {lim.MAX_YAML_ALIASES} alias uses "
                    "(*name) (MAX_YAML_ALIASES, docs/plan.md#limits)"
                )
            node = Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
            size = self._sizes.get(id(node))
            if size is None:
                raise PlanError("", f"invalid YAML at {where}: an alias refers to an enclosing "
                                    "node (a recursive structure)")
            self._count(size, where)
            return node
        self._depth += 1
        if self._depth > lim.MAX_YAML_DEPTH:
            raise PlanError(
                "", f"invalid YAML at {self._where()}: nested deeper than "
                f"{lim.MAX_YAML_DEPTH} levels (MAX_YAML_DEPTH, docs/plan.md#limits)"
            )
        before = self._nodes
        node = Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
        self._depth -= 1
        self._count(1, None)
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, n: int, where: str | None) -> None:
        self._nodes += n
        if self._nodes > self._max_nodes:
            at = f" at {where}" if where else ""
            raise PlanError(
                "", f"invalid YAML{at}: more than {self._max_nodes:,} values with aliases "
                "expanded (MAX_YAML_NODES, docs/plan.md#limits)"
            )


class _StrictLoader(_Bounded, yaml.SafeLoader):
    """PyYAML's pure-Python SafeLoader, bounded, rejecting duplicate keys."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._init_bounds()


_FastLoader: Any = None
if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class _FastLoader(_Bounded, CParser, SafeConstructor, Resolver):  # type: ignore[no-redef]
        """libyaml's parser (events ~10x faster) under PyYAML's composer, bounded."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self.anchors: dict[str, Any] = {}
            self._init_bounds()

        # the composer in Python, so that _Bounded.compose_node sees every node
        get_single_node = Composer.get_single_node
        compose_document = Composer.compose_document
        compose_scalar_node = Composer.compose_scalar_node
        compose_sequence_node = Composer.compose_sequence_node
        compose_mapping_node = Composer.compose_mapping_node
        check_node = Composer.check_node
        get_node = Composer.get_node


MAX_INT_CHARS = 64  # an integer literal longer than this is not a plan value


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, list | dict):
            continue  # unhashable keys fail in the base constructor with its own message
        if key in seen:
            mark = key_node.start_mark
            raise PlanError(
                "",
                f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: "
                f"duplicate key {f.got(key)} (first at line {seen[key].start_mark.line + 1})",
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    if len(node.value) > MAX_INT_CHARS:
        mark = node.start_mark
        raise PlanError(
            "",
            f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: an integer of "
            f"{len(node.value)} characters (at most {MAX_INT_CHARS})",
        )
    return loader.construct_yaml_int(node)


for _cls in (_StrictLoader, _FastLoader):
    if _cls is not None:
        _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
        _cls.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _load(text: str, cls: Any, max_nodes: int) -> Any:
    loader = cls(text)
    loader._max_nodes = max_nodes
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(text: str, source: str = "<text>", *, stored: bool = False) -> Any:
    """YAML text -> Python data; YAML errors become PlanError with a 1-based line and column.

    The work is bounded (see :class:`_Bounded`); text over MAX_PLAN_BYTES is refused.
    ``stored``: the text is a ``plan.yaml`` xsim wrote beside a trace, where every replica is
    written out, so the larger MAX_STORED_PLAN_BYTES and MAX_STORED_YAML_NODES apply.
    """
    max_bytes = lim.MAX_STORED_PLAN_BYTES if stored else lim.MAX_PLAN_BYTES
    max_nodes = lim.MAX_STORED_YAML_NODES if stored else lim.MAX_YAML_NODES
    if len(text) > max_bytes:
        raise PlanError(
            "", f"{source}: the plan is larger than {max_bytes:,} bytes "
            "(MAX_PLAN_BYTES, docs/plan.md#limits)"
        )
    try:
        try:
            return _load(text, _FastLoader or _StrictLoader, max_nodes)
        except yaml.MarkedYAMLError:
            if _FastLoader is None or len(text) > PYTHON_RETRY_CHARS:
                raise
            # PyYAML's own words for the same error (what users and docs know)
            return _load(text, _StrictLoader, max_nodes)
    except yaml.reader.ReaderError as e:
        raise PlanError(
            "", f"invalid YAML in {source}: character #x{e.character:04x} at position "
            f"{e.position} is not allowed in YAML text"
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = e.problem or e.context or "malformed"
        raise PlanError("", f"invalid YAML{where} in {source}: {f.text(problem)}"
                        ) from None
    except yaml.YAMLError as e:
        raise PlanError("", f"invalid YAML in {source}: {f.text(str(e))}") from None
    except (ValueError, OverflowError, RecursionError) as e:
        if isinstance(e, PlanError):
            raise
        # e.g. a timestamp with month 13: the constructor's own error, no position
        raise PlanError("", f"invalid YAML in {source}: {f.text(str(e))}") from None


