"""Where annotation helpers put ``fold_allow``: the roots of what one policy folds and another keeps.

Given two plans of the same graph, a *wide* one (say ``fold-qnn``) and a *narrow* one (say
``default``), a node is an allow root when the wide plan folds it, the narrow plan does not, and
no node that reads it folds under the wide plan. Wrapping each root in ``fold_allow`` makes the
narrow policy fold exactly the wide plan's extra subgraphs: the allow cone is the root's whole
constant subgraph, and barriers still stop it.
"""

from __future__ import annotations

from typing import Tuple

from .errors import PlanInvariantError
from .planner import FoldPlan

__all__ = ["allow_roots"]


def allow_roots(wide: FoldPlan, narrow: FoldPlan) -> Tuple[int, ...]:
    """Node ids to wrap in ``fold_allow`` so that ``narrow`` folds what ``wide`` folds.

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.planner import plan_folds
    >>> from fold_guard._core.policy import DEFAULT_POLICY, FOLD_QNN_POLICY
    >>> t = TensorInfo.of("int8", (4,))
    >>> c = NodeInput(InputKind.CONSTANT, "w", t)
    >>> x = NodeInput(InputKind.RUNTIME, "x", t)
    >>> q = FoldNode(0, "qnn.quantize", "q", "main", (c,), (t,), default_fold=False)
    >>> d = FoldNode(1, "qnn.dense", "d", "main", (x, NodeInput(InputKind.NODE, "q", t, 0)), (t,), default_fold=False)
    >>> g = FoldGraph((q, d))
    >>> allow_roots(plan_folds(g, FOLD_QNN_POLICY), plan_folds(g, DEFAULT_POLICY))
    (0,)
    """
    if wide.graph is not narrow.graph:
        raise PlanInvariantError("allow_roots compares two plans of the same FoldGraph")
    consumers = wide.graph.consumers()
    return tuple(
        node.id
        for node in wide.graph.nodes
        if wide.folds(node.id)
        and not narrow.folds(node.id)
        and not any(wide.folds(user) for user in consumers[node.id])
    )
