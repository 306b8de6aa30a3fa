"""What the annotations reach before any node is decided: conflicts, and the allowed cone.

``fold_allow(fold_barrier(x))`` asks for opposite things and is refused. The *allowed cone* is
every node upstream of a ``fold_allow`` operand, not crossing barriers: those nodes fold (or,
on the parameter path, lift) whatever the policy says, since the allow outranks it.
"""

from __future__ import annotations

from typing import Set

from .errors import ConflictingAnnotationsError
from .graph import Annotation, FoldGraph, InputKind

__all__ = ["allowed_cone", "check_annotations"]


def check_annotations(graph: FoldGraph) -> None:
    for node in graph.nodes:
        if node.annotation is not Annotation.ALLOW:
            continue
        for inp in node.inputs:
            if (
                inp.kind is InputKind.NODE
                and graph.nodes[inp.source].annotation is Annotation.BARRIER
            ):
                barrier = graph.nodes[inp.source]
                raise ConflictingAnnotationsError(
                    f"conflicting annotations in {node.function}: {node.label} = fold_allow"
                    f"({barrier.label}) where {barrier.label} = fold_barrier(...); a value cannot be "
                    "both folded and kept behind a barrier. Hint: put fold_allow on the barrier's "
                    "operand instead, i.e. fold_barrier(fold_allow(x))"
                )


def allowed_cone(graph: FoldGraph) -> Set[int]:
    """Nodes upstream of a fold_allow operand, not crossing barriers.

    Only values count: an input whose value a node does not read (``zeros_like(x)``) does not
    bring ``x``'s subgraph into the cone.
    """
    allowed: Set[int] = set()
    for node in reversed(graph.nodes):
        if node.annotation is not Annotation.ALLOW and node.id not in allowed:
            continue
        for inp in node.inputs:
            if (
                inp.kind is InputKind.NODE
                and inp.reads_value
                and graph.nodes[inp.source].annotation is not Annotation.BARRIER
            ):
                allowed.add(inp.source)
    return allowed
