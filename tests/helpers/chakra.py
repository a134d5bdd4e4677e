"""Reading Chakra ET files back with Chakra's own reader (mlc-chakra's protolib). Import it
only after ``pytest.importorskip`` of Chakra's schema, as the Chakra tests do."""

from __future__ import annotations

from typing import Any

from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import decodeMessage


def read_et(path: Any) -> tuple[Any, list[Any]]:
    """Chakra's own reader: GlobalMetadata, then Node messages until EOF."""
    with open(path, "rb") as fh:
        meta = pb.GlobalMetadata()
        assert decodeMessage(fh, meta)
        nodes = []
        while True:
            node = pb.Node()
            if not decodeMessage(fh, node):
                return meta, nodes
            nodes.append(node)


def node_attrs(node: Any) -> dict:
    """A node's attributes as {name: value}."""
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}
