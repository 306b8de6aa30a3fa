"""How the values of a FoldGraph are used: consumers, and which constants end up as weights.

A backend policy often cares less about the call itself than about where its result goes: a
``quantize`` whose result becomes a convolution's weight should fold, the same ``quantize`` on a
constant that is added to an activation should stay. :class:`GraphUses` answers that once per
graph, lazily, for every :class:`~fold_guard._core.policy.CallView` of one plan.

A constant value *feeds only weights* when every path from it, through calls that compute from
constants only (annotations included, looked through), reaches a call that also reads a run-time
value, and enters it as

* any operand of a weight op (convolution, dense, matmul: the operand that is not the
  activation), or of a lowered call of a weight kernel (``call_tir(conv2d, ...)``), or
* the bias of a bias op: ``nn.bias_add``, or an ``add`` whose other operand is the output of a
  weight op.

Uses outside the graph (a function's return value, a tuple) are not calls, so they do not count:
a constant that feeds a weight and is also returned still feeds only weights. A value *feeds a
weight* when at least one such path reaches a weight or bias input (a table that is both an
embedding's and a tied output projection's); reads of its static type alone do not count.
"""

from __future__ import annotations

from functools import cached_property
from typing import Dict, FrozenSet, Mapping, Optional, Set, Tuple

from .graph import SOURCE_KINDS, Annotation, FoldGraph, FoldNode, InputKind
from .kernel_names import ADD, DEQUANTIZE, QUANTIZE, WEIGHT, kernel_role
from .op_names import OP_TABLES

__all__ = ["BIAS_OPS", "WEIGHT_OPS", "GraphUses", "is_weight_op"]

#: Weight ops of every IR, by full op name (Relax ``relax.nn.conv2d``, ``relax.matmul``; Relay
#: ``nn.conv2d``, ``nn.dense``; quantized ``qnn.conv2d``, ``qnn.dense``, ...; see
#: :mod:`fold_guard._core.op_names`).
WEIGHT_OPS: FrozenSet[str] = frozenset(name for table in OP_TABLES for name in table.weight)
#: Quantize and dequantize ops of every IR: a weight path looks through them.
_QUANTIZE_STEP_OPS: FrozenSet[str] = frozenset(
    name for table in OP_TABLES for name in table.quantize | table.dequantize
)
#: Ops that take a bias as a later operand (Relay ``nn.bias_add``).
_BIAS_ADD_OPS: FrozenSet[str] = frozenset(name for table in OP_TABLES for name in table.bias_add)
#: Ops whose non-activation operand is a bias: the bias-add ops, and the adds whose other operand
#: is the output of a weight op.
BIAS_OPS: FrozenSet[str] = _BIAS_ADD_OPS | frozenset(
    name for table in OP_TABLES for name in table.add
)


def _lowered_role(node: FoldNode) -> Optional[str]:
    return kernel_role(node.callee) if node.lowered else None


def _is_quantize_step(node: FoldNode) -> bool:
    """A quantize or dequantize, op or kernel (``call_tir(dequantize, ...)``)."""
    if node.lowered:
        return kernel_role(node.callee) in (QUANTIZE, DEQUANTIZE)
    return node.op in _QUANTIZE_STEP_OPS


def _is_weight_call(node: FoldNode) -> bool:
    """A weight op, or a lowered call of a weight kernel (``call_tir(conv2d, ...)``)."""
    return is_weight_op(node.op) or _lowered_role(node) == WEIGHT


def is_weight_op(op: str) -> bool:
    """True for a convolution, dense or matmul op of Relax, Relay or QNN.

    >>> is_weight_op("relax.nn.conv2d"), is_weight_op("qnn.dense"), is_weight_op("relax.add")
    (True, True, False)
    """
    return op in WEIGHT_OPS


class GraphUses:
    """Consumers and weight uses of one graph, computed on first use and then shared.

    >>> from fold_guard._core.graph import FoldNode, NodeInput, TensorInfo
    >>> t = TensorInfo.of("float32", (4, 4))
    >>> w = FoldNode(0, "relax.exp", "w", "main", (NodeInput(InputKind.CONSTANT, "c", t),), (t,))
    >>> x = NodeInput(InputKind.RUNTIME, "x", t)
    >>> y = FoldNode(1, "relax.matmul", "y", "main", (x, NodeInput(InputKind.NODE, "w", t, 0)), (t,))
    >>> GraphUses(FoldGraph((w, y))).feeds_only_weights(0)
    True
    """

    def __init__(self, graph: FoldGraph) -> None:
        self.graph = graph

    @cached_property
    def consumers(self) -> Mapping[int, Tuple[int, ...]]:
        """Map each node id to the ids of the nodes that read it."""
        return self.graph.consumers()

    @cached_property
    def computes_from_constants(self) -> FrozenSet[int]:
        """Nodes whose every input is a literal constant, a weight parameter or such a node.

        Through barriers, unlike the planner: a barrier stops folding, not the flow of constant
        data, and a barrier over a weight still carries a weight. A weight passed as a parameter
        (``InputKind.PARAMETER``) is a weight too, so ``weights-only`` decides the same on the
        parameter path as on constants.
        """
        return self.graph.reachable_from_constants(through_barriers=True, with_parameters=True)

    @cached_property
    def reads_parameters(self) -> FrozenSet[int]:
        """Nodes that read a weight parameter (``InputKind.PARAMETER``), directly or through nodes."""
        found: Set[int] = set()
        for node in self.graph.nodes:
            if any(
                inp.kind is InputKind.PARAMETER
                or (inp.kind in SOURCE_KINDS and inp.source in found)
                for inp in node.inputs
            ):
                found.add(node.id)
        return frozenset(found)

    @cached_property
    def weight_feeders(self) -> FrozenSet[int]:
        """Ids of the constant-computed nodes whose value feeds only weights (see module doc)."""
        constant = self.computes_from_constants
        feeds: Dict[int, bool] = {}
        for node in reversed(self.graph.nodes):
            if node.id not in constant:
                continue
            users = self.consumers[node.id]
            feeds[node.id] = bool(users) and all(
                feeds[user]
                if user in constant
                else self._is_weight_edge(self.graph.nodes[user], node.id)
                for user in users
            )
        return frozenset(node_id for node_id, ok in feeds.items() if ok)

    def feeds_only_weights(self, node_id: int) -> bool:
        """True when ``node_id`` is computed from constants and its value feeds only weights."""
        return node_id in self.weight_feeders

    @cached_property
    def weight_reachers(self) -> FrozenSet[int]:
        """Ids of the constant-computed nodes whose value, on some path through other constant
        calls, is a weight or bias input; only reads of the value count (``zeros_like(w)`` or a
        ``shape_of`` reads no value). A quantize or dequantize on the path is looked through
        even at run time: ``dequantize(W, s1) -> quantize(s2) -> dequantize`` still ends as the
        weight when ``s2`` is known only at run time."""
        constant = self.computes_from_constants
        nodes = self.graph.nodes
        users = self.graph.value_consumers()
        through = {node.id for node in nodes if node.id in constant or _is_quantize_step(node)}
        reaches: Dict[int, bool] = {}
        for node in reversed(nodes):
            if node.id in through:
                reaches[node.id] = any(
                    reaches[user] if user in through else self._is_weight_edge(nodes[user], node.id)
                    for user in users[node.id]
                )
        return frozenset(node_id for node_id, ok in reaches.items() if ok and node_id in constant)

    def feeds_a_weight(self, node_id: int) -> bool:
        """True when ``node_id`` is computed from constants and some use of it is a weight."""
        return node_id in self.weight_reachers

    def _is_weight_edge(self, user: FoldNode, source: int) -> bool:
        if _is_weight_call(user):
            return True
        if not (user.op in BIAS_OPS or _lowered_role(user) == ADD):
            return False
        if user.op in _BIAS_ADD_OPS:
            return any(inp.kind is InputKind.NODE and inp.node == source for inp in user.inputs[1:])
        return any(
            inp.kind is InputKind.NODE
            and inp.node != source
            and self._produced_by_weight_op(inp.source)
            for inp in user.inputs
        )

    def _produced_by_weight_op(self, node_id: int) -> bool:
        node = self.graph.nodes[node_id]
        while (
            node.annotation is not Annotation.NONE
            and node.inputs
            and node.inputs[0].kind is InputKind.NODE
        ):
            node = self.graph.nodes[node.inputs[0].source]
        return _is_weight_call(node)
