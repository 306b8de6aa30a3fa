"""Where annotation helpers put ``fold_allow`` and ``fold_barrier`` so a module carries a policy.

Given two plans of the same graph, a *wide* one (say ``fold-qnn``) and a *narrow* one (say
``default``), a node is an allow root when the wide plan folds it, the narrow plan does not, and
no node that reads it folds under the wide plan. Wrapping each root in ``fold_allow`` makes the
narrow policy fold exactly the wide plan's extra subgraphs: the allow cone is the root's whole
constant subgraph, and barriers still stop it.

:func:`placements` adds the other direction for a policy against the IR's default: a call the
policy keeps by one of its own rules, although all its inputs are constant and the IR's default
would fold it, gets a ``fold_barrier`` on its first operand. A barrier's operand may still fold, so the
call's inputs still become constants (``dequantize(fold_barrier(<int8 constant>))``), but the
call itself never folds again: not under the default policy, and not under a later stock
``FoldConstant``, which cannot fold through the barrier op. A kept call with no operand at all (a
creation op such as ``zeros(shape)``) gets a placement with ``operand=None``: a barrier on its
*result* would not do (the operand of a barrier folds), so the adapter rewrites the call into an
equivalent one with a scalar operand to guard (``full(shape, fold_barrier(0))``), or, where the
IR has none, reports it in :attr:`Annotated.uncarried`.

**The parameter path.** Where weights are function parameters, what evaluates weight-only work
ahead of run time is the IR's parameter lifting (Relax ``LiftTransformParams``), not a fold, and
it knows one stop: an identity op it never lifts (Relax ``stop_lift_params``, which it removes
from the function it leaves at run time). A call the policy keeps on that path gets the barrier
*with the stop under it*: ``dequantize(fold_barrier(stop_lift_params(w)))``. The stop keeps the
barrier and its consumers at run time; the lifting then removes the stop and leaves
``dequantize(fold_barrier(w))`` with ``w`` the lifted (or passed-through) integer weight. A
barrier already in the module whose operand is computed from weight parameters gets the same
stop under it (``stops_lift`` on a placement at that barrier), so a hand-placed barrier holds
through the lifting too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, List, Optional, Tuple

from .errors import PlanInvariantError
from .graph import SOURCE_KINDS, Annotation, FoldNode, InputKind, ModuleT, NodeInput
from .op_names import LIFT_STOP_OPS
from .planner import BARRIER_RULE, DEFAULT_RULE, FoldPlan
from .reasons import Action, Reason

__all__ = ["Annotated", "Placement", "allow_roots", "placements"]


def allow_roots(wide: FoldPlan, narrow: FoldPlan) -> Tuple[int, ...]:
    """Node ids to wrap in ``fold_allow`` so that ``narrow`` folds what ``wide`` folds.

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.planner import plan_folds
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY, FOLD_QNN_POLICY
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
    graph = wide.graph
    consumers = graph.value_consumers()

    def only_wide(node_id: int) -> bool:
        return wide.folds(node_id) and not narrow.folds(node_id)

    def tensor_roots(node_id: int) -> Tuple[int, ...]:
        # fold_allow annotates one tensor: a root with a tuple result is allowed through the
        # inputs that make it non-constant under ``narrow``; with them constant, ``narrow``
        # folds the tuple-valued call itself.
        if len(graph.nodes[node_id].outputs) == 1:
            return (node_id,)
        inputs = [inp.source for inp in graph.nodes[node_id].inputs if inp.kind is InputKind.NODE]
        return tuple(
            root for source in inputs if only_wide(source) for root in tensor_roots(source)
        )

    roots = [
        root
        for node in graph.nodes
        if only_wide(node.id) and not any(wide.folds(user) for user in consumers[node.id])
        for root in tensor_roots(node.id)
    ]
    return tuple(sorted(set(roots)))


@dataclass(frozen=True)
class Placement:
    """One annotation a helper placed.

    ``fold_allow`` wraps the result of node ``node``; ``fold_barrier`` wraps that node's input
    number ``operand``. ``rule`` is the policy rule the annotation stands for. ``stops_lift``
    puts the IR's lift stop under the barrier (the parameter path, see the module doc); with
    ``existing_barrier`` the node is a barrier already in the module and only the stop is new.
    """

    annotation: Annotation
    node: int
    function: str
    label: str
    op: str
    rule: str
    operand: Optional[int] = None  # None on a barrier: the call has no operand (see the module doc)
    operand_label: str = ""  # with its type, e.g. ``const: int8[8, 3, 3, 3]``
    stops_lift: bool = False
    existing_barrier: bool = False

    def __str__(self) -> str:
        where = f"{self.function}: " if self.function else ""
        if self.annotation is Annotation.ALLOW:
            return f"{where}fold_allow around {self.label} = {self.op} [{self.rule}]"
        if self.existing_barrier:
            return (
                f"{where}stop_lift_params under the barrier {self.label} (its operand "
                f"{self.operand_label} is computed from weight parameters) [{self.rule}]"
            )
        if self.stops_lift:
            return (
                f"{where}fold_barrier over stop_lift_params on {self.operand_label} (input "
                f"{self.operand} of {self.label} = {self.op}; computed from weight parameters) "
                f"[{self.rule}]"
            )
        if self.operand is None:
            return (
                f"{where}fold_barrier on the fill value of {self.label} = {self.op} "
                f"(it has no operand) [{self.rule}]"
            )
        return (
            f"{where}fold_barrier on {self.operand_label} (input {self.operand} of "
            f"{self.label} = {self.op}) [{self.rule}]"
        )


@dataclass(frozen=True)
class Annotated(Generic[ModuleT]):
    """What an annotation helper returns: the new module and every annotation it placed."""

    mod: ModuleT
    placed: Tuple[Placement, ...]
    policy_name: str
    #: keeps the module cannot carry: a creation call with no operand the IR can put a barrier
    #: on (Relax ``arange``, ``eye``); a later default fold folds these
    uncarried: Tuple[Placement, ...] = ()

    @property
    def allows(self) -> Tuple[Placement, ...]:
        return tuple(p for p in self.placed if p.annotation is Annotation.ALLOW)

    @property
    def barriers(self) -> Tuple[Placement, ...]:
        """The barriers placed (not the stops added under barriers already in the module)."""
        return tuple(
            p for p in self.placed if p.annotation is Annotation.BARRIER and not p.existing_barrier
        )

    @property
    def lift_stops(self) -> Tuple[Placement, ...]:
        """Every ``stop_lift_params`` placed: under new barriers and under existing ones."""
        return tuple(p for p in self.placed if p.stops_lift)

    def explain(self) -> str:
        """One line per placed annotation, after a count."""
        placed = len(self.allows) + len(self.barriers)
        head = (
            f"placed {placed} annotation{'' if placed == 1 else 's'} for policy "
            f"{self.policy_name!r}: {len(self.allows)} fold_allow, {len(self.barriers)} fold_barrier"
        )
        if self.lift_stops:
            head += f", {len(self.lift_stops)} stop_lift_params (weights as parameters)"
        lines = [head] + [
            f"  {placement}" for placement in self.placed if placement not in self.uncarried
        ]
        lines += [
            f"  not carried (no operand to guard): {placement}" for placement in self.uncarried
        ]
        return "\n".join(lines)


def placements(
    policy_plan: FoldPlan, default_plan: FoldPlan, *, later: Optional[FoldPlan] = None
) -> Tuple[Placement, ...]:
    """The annotations under which ``default_plan``'s policy decides as ``policy_plan``'s does.

    Allows go on :func:`allow_roots`; a barrier goes on the first operand of every call that
    ``policy_plan`` keeps by a rule of its own while all its inputs are constant there and the
    IR's default would fold it, or, given ``later`` (a plan of the same graph under what a later
    fold will do, e.g. Relay's build folding lowered QNN ops), ``later`` folds it. On the
    parameter path (module doc) the same goes for a call kept while its inputs are known before
    run time and the IR's lifting would lift it: its barrier ``stops_lift``, and so does every
    barrier already in the module over a lifted operand. Sorted by node; a node may get both (an
    allow root whose result is the operand of a kept call is wrapped as
    ``fold_barrier(fold_allow(x))``).

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, NodeInput, TensorInfo
    >>> from fold_guard._core.planner import plan_folds
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY, KEEP_QDQ_WEIGHTS_POLICY
    >>> i8, f32 = TensorInfo.of("int8", (4,)), TensorInfo.of("float32", (4,))
    >>> w, x = NodeInput(InputKind.CONSTANT, "w", i8), NodeInput(InputKind.RUNTIME, "x", f32)
    >>> dq = FoldNode(0, "relax.dequantize", "dq", "main", (w,), (f32,))
    >>> mm = FoldNode(1, "relax.matmul", "y", "main", (x, NodeInput(InputKind.NODE, "dq", f32, 0)), (f32,))
    >>> g = FoldGraph((dq, mm))
    >>> [str(p) for p in placements(plan_folds(g, KEEP_QDQ_WEIGHTS_POLICY), plan_folds(g, DEFAULT_POLICY))]
    ['main: fold_barrier on w: int8[4] (input 0 of dq = relax.dequantize) [keep-dequantize-of-integer-constant]']
    >>> p = NodeInput(InputKind.PARAMETER, "w", i8)
    >>> g = FoldGraph((FoldNode(0, "relax.dequantize", "dq", "main", (p,), (f32,)), mm))
    >>> [p.stops_lift for p in placements(plan_folds(g, KEEP_QDQ_WEIGHTS_POLICY), plan_folds(g, DEFAULT_POLICY))]
    [True]
    """
    graph = policy_plan.graph
    placed: List[Placement] = []
    for node_id in allow_roots(policy_plan, default_plan):
        node, decision = graph.nodes[node_id], policy_plan.decisions[node_id]
        placed.append(
            Placement(Annotation.ALLOW, node_id, node.function, node.label, node.op, decision.rule)
        )
    for node, decision in zip(graph.nodes, policy_plan.decisions):
        if node.annotation is Annotation.BARRIER:
            if _operand_is_lifted(policy_plan, node):
                placed.append(
                    Placement(
                        Annotation.BARRIER,
                        node.id,
                        node.function,
                        node.label,
                        node.op,
                        BARRIER_RULE,
                        operand=0,
                        operand_label=_typed_label(node.inputs[0]),
                        stops_lift=True,
                        existing_barrier=True,
                    )
                )
            continue
        kept_by_own_rule = (
            decision.action is Action.KEEP
            and decision.reason in (Reason.KEPT_BY_POLICY, Reason.OVER_BUDGET)
            and decision.rule != DEFAULT_RULE
        )
        if not kept_by_own_rule:
            continue
        if policy_plan.has_constant_inputs(node.id):
            # Not default_plan.folds(node): an allow placed upstream can make the inputs constant
            # only in the annotated module, and the default must not fold the call there either.
            stops_lift = False
            default_would_act = (
                later.folds(node.id)
                if later is not None
                else node.default_fold and node.unfoldable is None
            )
        elif policy_plan.has_inputs_before_run_time(node.id):
            stops_lift, default_would_act = True, not node.lift_rule
        else:
            continue
        if default_would_act:
            placed.append(
                Placement(
                    Annotation.BARRIER,
                    node.id,
                    node.function,
                    node.label,
                    node.op,
                    decision.rule,
                    operand=0 if node.inputs else None,
                    operand_label=_typed_label(node.inputs[0]) if node.inputs else "",
                    stops_lift=stops_lift,
                )
            )

    def in_node_order(placement: Placement) -> Tuple[int, bool]:
        return placement.node, placement.annotation is Annotation.BARRIER

    return tuple(sorted(placed, key=in_node_order))


def _operand_is_lifted(plan: FoldPlan, barrier: FoldNode) -> bool:
    """Whether ``barrier``'s operand is a weight parameter or a call the plan lifts.

    Such an operand would be lifted together with the barrier and everything that reads it,
    unless it is already the IR's lift stop.
    """
    if not barrier.inputs:
        return False
    operand = barrier.inputs[0]
    if operand.kind is InputKind.PARAMETER:
        return True
    if operand.kind not in SOURCE_KINDS:
        return False
    source = plan.graph.nodes[operand.source]
    return source.op not in LIFT_STOP_OPS and plan.lifts(source.id)


def _typed_label(inp: NodeInput) -> str:
    tensor = inp.tensor
    if tensor is None or tensor.shape is None:
        return inp.label
    dims = ", ".join("?" if dim is None else str(dim) for dim in tensor.shape)
    return f"{inp.label}: {tensor.dtype}[{dims}]"
