"""A tiny builder DSL for FoldGraphs, so core tests read like the IR they stand for.

    g = G()
    c = g.const("c")                     # a literal constant, float32 (4,) by default
    x = g.runtime("x")                   # a run-time input
    w = g.param("w")                     # a weight passed as a parameter (Relax num_input)
    i = g.item(e, "i")                   # one item of e's tuple result (Relax ``i = e[0]``)
    e = g.call("relax.exp", c)           # label defaults to "e0", "e1", ... (op suffix + id)
    b = g.barrier(e, label="b")
    y = g.call("relax.add", x, b, label="y")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {"e0": "FOLDED default", "b": "KEPT_BY_BARRIER fold_barrier", ...}

Plus the graph surgery the property tests need: :func:`apply_plan` (every folded node becomes a
literal constant of its consumers), :func:`apply_placements` (what an annotation helper inserts)
and a small NumPy interpreter (:func:`evaluate`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from fold_guard._core import (
    Annotation,
    FoldGraph,
    FoldNode,
    FoldPlan,
    InputKind,
    NodeInput,
    Reason,
    TensorInfo,
)

__all__ = [
    "NUMPY_OPS",
    "G",
    "Ref",
    "apply_placements",
    "apply_plan",
    "decision",
    "evaluate",
    "summary",
]

BARRIER_OP = "fold_guard.fold_barrier"
ALLOW_OP = "fold_guard.fold_allow"
#: The parameter path's stop (Relax ``stop_lift_params``): the lifting never lifts it.
LIFT_STOP_OP = "relax.builtin.stop_lift_params"
LIFT_STOP_RULE = "the lifting never lifts its stop"


@dataclass(frozen=True)
class Ref:
    """A value a later call may read: a literal constant, a run-time input or a node's output."""

    kind: InputKind
    label: str
    tensor: TensorInfo
    node: Optional[int] = None

    def as_input(self) -> NodeInput:
        return NodeInput(self.kind, self.label, self.tensor, self.node)


class G:
    """Builds a FoldGraph call by call; nodes get ids in creation order (so it is topological)."""

    def __init__(self, function: str = "main"):
        self.function = function
        self.nodes: List[FoldNode] = []

    # Leaves ---------------------------------------------------------------------------------
    def const(
        self, label: str, dtype: str = "float32", shape: Sequence[Optional[int]] = (4,)
    ) -> Ref:
        return Ref(InputKind.CONSTANT, label, TensorInfo.of(dtype, shape))

    def runtime(
        self, label: str, dtype: str = "float32", shape: Sequence[Optional[int]] = (4,)
    ) -> Ref:
        return Ref(InputKind.RUNTIME, label, TensorInfo.of(dtype, shape))

    def param(
        self, label: str, dtype: str = "float32", shape: Sequence[Optional[int]] = (4,)
    ) -> Ref:
        return Ref(InputKind.PARAMETER, label, TensorInfo.of(dtype, shape))

    def item(self, tuple_ref: Ref, label: str, dtype: str = "float32", shape=(4,)) -> Ref:
        """An item of ``tuple_ref``'s tuple result, read through a tuple-item binding."""
        return Ref(InputKind.TUPLE_ITEM, label, TensorInfo.of(dtype, shape), tuple_ref.node)

    # Calls ----------------------------------------------------------------------------------
    def call(
        self,
        op: str,
        *args: Ref,
        label: Optional[str] = None,
        dtype: Optional[str] = None,
        shape: Optional[Sequence[Optional[int]]] = None,
        outputs: Optional[Iterable[TensorInfo]] = None,
        attrs: Optional[Mapping] = None,
        annotation: Annotation = Annotation.NONE,
        unfoldable: Optional[Reason] = None,
        unfoldable_detail: str = "",
        default_fold: bool = True,
        default_rule: str = "",
        lift_rule: str = "",
        function: Optional[str] = None,
        type_of: Optional[Ref] = None,
        callee: str = "",
        op_pattern: Optional[int] = None,
    ) -> Ref:
        """Add ``op(*args)``; the output is ``dtype``/``shape`` (default: the first argument's)."""
        node_id = len(self.nodes)
        label = label or f"{op.rsplit('.', 1)[-1][:1]}{node_id}"
        if outputs is None:
            first = args[0].tensor if args else TensorInfo.of("float32", (4,))
            out = TensorInfo.of(dtype or first.dtype, first.shape if shape is None else shape)
            outputs = (out,)
        outputs = tuple(outputs)
        self.nodes.append(
            FoldNode(
                id=node_id,
                op=op,
                label=label,
                function=self.function if function is None else function,
                inputs=tuple(arg.as_input() for arg in args),
                outputs=outputs,
                attrs=dict(attrs or {}),
                annotation=annotation,
                unfoldable=unfoldable,
                unfoldable_detail=unfoldable_detail,
                default_fold=default_fold,
                default_rule=default_rule,
                lift_rule=lift_rule,
                type_source=None if type_of is None else type_of.node,
                lowered=bool(callee),
                callee=callee,
                op_pattern=op_pattern,
            )
        )
        return Ref(InputKind.NODE, label, outputs[0], node_id)

    def kernel(self, callee: str, *args: Ref, **kwargs) -> Ref:
        """A lowered call: ``call_tir(callee, (*args,))`` (Relax after LegalizeOps, or MLC-LLM's)."""
        kwargs.setdefault("label", f"{callee}{len(self.nodes)}")
        return self.call("relax.call_tir", *args, callee=callee, **kwargs)

    def barrier(self, x: Ref, *, label: Optional[str] = None) -> Ref:
        return self.call(
            BARRIER_OP, x, label=label or f"barrier{len(self.nodes)}", annotation=Annotation.BARRIER
        )

    def allow(self, x: Ref, *, label: Optional[str] = None) -> Ref:
        return self.call(
            ALLOW_OP, x, label=label or f"allow{len(self.nodes)}", annotation=Annotation.ALLOW
        )

    def build(self) -> FoldGraph:
        return FoldGraph(tuple(self.nodes))


# Reading plans ---------------------------------------------------------------------------------


def decision(plan: FoldPlan, label: str):
    """The decision of the (unique) node called ``label``."""
    found = [d for d in plan.decisions if d.label == label]
    assert len(found) == 1, f"{len(found)} nodes are labelled {label!r}"
    return found[0]


def summary(plan: FoldPlan) -> Dict[str, str]:
    """``{label: "REASON rule"}`` for every node: compact enough to compare whole plans exactly."""
    return {d.label: f"{d.reason.name} {d.rule}".rstrip() for d in plan.decisions}


# Applying plans --------------------------------------------------------------------------------


def apply_plan(plan: FoldPlan) -> Tuple[FoldGraph, Dict[int, int]]:
    """The graph after folding: folded nodes removed, their consumers read a literal constant.

    Returns the new graph and the map old id -> new id of the kept nodes. The literal keeps the
    folded node's label and output tensor info, as an adapter's rewrite would.
    """
    graph = plan.graph
    new_id: Dict[int, int] = {}
    nodes: List[FoldNode] = []
    for node in graph.nodes:
        if plan.folds(node.id):
            continue
        inputs = []
        for inp in node.inputs:
            if inp.kind is InputKind.NODE and plan.folds(inp.node):
                source = graph.nodes[inp.node]
                inputs.append(NodeInput(InputKind.CONSTANT, source.label, source.outputs[0]))
            elif inp.kind is InputKind.NODE:
                inputs.append(NodeInput(InputKind.NODE, inp.label, inp.tensor, new_id[inp.node]))
            else:
                inputs.append(inp)
        new_id[node.id] = len(nodes)
        nodes.append(dataclasses.replace(node, id=len(nodes), inputs=tuple(inputs)))
    return FoldGraph(tuple(nodes)), new_id


def apply_placements(graph: FoldGraph, placed: Sequence) -> Tuple[FoldGraph, Dict[int, int]]:
    """``graph`` with the placed annotations inserted, as an annotation helper writes them.

    ``placed`` are :class:`~fold_guard._core.annotate.Placement` objects: a barrier (over the
    lifting's stop when it ``stops_lift``) on the given operand, a stop alone under an
    ``existing_barrier``, an allow around a node's result. Returns the new graph and the map
    old id -> new id.
    """
    operand_of = {
        p.node: p for p in placed if p.annotation is Annotation.BARRIER and p.operand is not None
    }
    allow_on = {p.node for p in placed if p.annotation is Annotation.ALLOW}
    nodes: List[FoldNode] = []
    new_id: Dict[int, int] = {}
    output_of: Dict[int, int] = {}  # old id -> id of the node consumers now read

    def add(node: FoldNode) -> int:
        nodes.append(dataclasses.replace(node, id=len(nodes)))
        return len(nodes) - 1

    def wrap(inp: NodeInput, op: str, label: str, function: str, **facts) -> NodeInput:
        node = FoldNode(0, op, label, function, (inp,), (inp.tensor,), **facts)
        return NodeInput(InputKind.NODE, label, inp.tensor, add(node))

    for node in graph.nodes:
        inputs = [
            NodeInput(InputKind.NODE, inp.label, inp.tensor, output_of[inp.source])
            if inp.kind is InputKind.NODE
            else inp
            for inp in node.inputs
        ]
        placement = operand_of.get(node.id)
        if placement is not None:
            index = placement.operand
            if placement.stops_lift:
                inputs[index] = wrap(
                    inputs[index],
                    LIFT_STOP_OP,
                    f"stop_{node.label}",
                    node.function,
                    lift_rule=LIFT_STOP_RULE,
                )
            if not placement.existing_barrier:
                inputs[index] = wrap(
                    inputs[index],
                    BARRIER_OP,
                    f"barrier_{node.label}",
                    node.function,
                    annotation=Annotation.BARRIER,
                )
        new_id[node.id] = add(dataclasses.replace(node, inputs=tuple(inputs)))
        output_of[node.id] = new_id[node.id]
        if node.id in allow_on:
            result = NodeInput(InputKind.NODE, node.label, node.outputs[0], new_id[node.id])
            output_of[node.id] = wrap(
                result, ALLOW_OP, f"allow_{node.label}", node.function, annotation=Annotation.ALLOW
            ).source
    return FoldGraph(tuple(nodes)), new_id


# A NumPy reference interpreter -----------------------------------------------------------------

NUMPY_OPS = {
    "relax.add": lambda *xs: xs[0] + xs[1] if len(xs) == 2 else sum(xs[1:], xs[0]),
    "relax.multiply": lambda *xs: np.prod(np.stack(xs), axis=0) if len(xs) > 1 else xs[0] * 2.0,
    "relax.negative": lambda x, *rest: -x,
    "relax.subtract": lambda x, *rest: x - rest[0] if rest else x - 1.0,
    "relax.clip_exp": lambda x, *rest: np.exp(np.clip(x, -4.0, 4.0)),
    "relax.tanh": lambda x, *rest: np.tanh(x),
    BARRIER_OP: lambda x: x,
    ALLOW_OP: lambda x: x,
    LIFT_STOP_OP: lambda x: x,
}


def evaluate(graph: FoldGraph, env: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Evaluate every node of ``graph``; leaves (constant or run-time) are read from ``env`` by label.

    Returns ``{node label: value}``. A leaf missing from ``env`` raises KeyError, which the
    property tests use to prove a folded node never reads a run-time input.
    """
    values: Dict[int, np.ndarray] = {}
    out: Dict[str, np.ndarray] = {}
    for node in graph.nodes:
        args = [
            values[inp.node] if inp.kind is InputKind.NODE else env[inp.label]
            for inp in node.inputs
        ]
        values[node.id] = NUMPY_OPS[node.op](*args)
        out[node.label] = values[node.id]
    return out
