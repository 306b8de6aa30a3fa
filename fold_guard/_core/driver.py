"""The plan -> evaluate -> re-plan loop both adapters run, with the adapter's evaluation as a callback.

An adapter can only find out that a call cannot be evaluated by trying (a kernel that fails to
build, an interpreter that raises). The planner then has to decide again: the failed call is kept
(``Reason.EVAL_FAILED``) and what reads it no longer folds. The loop, stated once:

1. plan with every failure known so far;
2. let the adapter evaluate each folded call that has no value yet, level by level, skipping any
   call with an input that has no value (:func:`pending_levels`: that input failed in this
   round, so the re-plan keeps the call);
3. if some evaluation failed, record the failures and go back to 1, else the plan is final.

Values already computed stay valid across rounds: a re-plan only ever folds fewer calls, and a
call that still folds reads the same constants. The loop ends because every round adds at least
one failure and a node fails at most once.
"""

from __future__ import annotations

from typing import (
    AbstractSet,
    Callable,
    Container,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
)

from .graph import FoldGraph, FoldNode, InputKind
from .planner import FoldPlan, plan_folds
from .policy import FoldPolicy

__all__ = [
    "Evaluate",
    "evaluate_until_stable",
    "has_inputs",
    "pending_levels",
    "releasable",
]

#: The adapter's evaluation step: evaluate every folded node of the plan that has no value yet
#: (keeping the values itself) and return the nodes whose evaluation failed, with the error text.
Evaluate = Callable[[FoldPlan], Mapping[int, str]]


def has_inputs(node: FoldNode, values: Container[int]) -> bool:
    """Whether every node input of ``node`` has a value in ``values`` (node ids).

    A folded node reads only folded nodes, so an input without a value failed to evaluate in this
    round: the node is skipped, and the re-plan keeps it. An input whose value the node does not
    read (``NodeInput.reads_value``) needs none.
    """
    return all(
        inp.kind is not InputKind.NODE or not inp.reads_value or inp.source in values
        for inp in node.inputs
    )


def evaluate_until_stable(
    plan: FoldPlan,
    policy: FoldPolicy,
    evaluate: Evaluate,
    *,
    eval_failures: Optional[Mapping[int, str]] = None,
) -> Tuple[FoldPlan, Dict[int, str]]:
    """Evaluate ``plan`` through ``evaluate``, re-planning under ``policy`` until nothing fails.

    ``plan`` is the first plan, made with ``eval_failures`` (failures known before: an adapter
    that lowers again carries them over); the adapter makes it itself, so that it can prepare
    what that plan needs (compile its kernels) before the first evaluation. Returns the final
    plan and every failure, old and new.

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> t = TensorInfo.of("float32", (4,))
    >>> a = FoldNode(0, "exp", "a", "main", (NodeInput(InputKind.CONSTANT, "c", t),), (t,))
    >>> b = FoldNode(1, "log", "b", "main", (NodeInput(InputKind.NODE, "a", t, 0),), (t,))
    >>> values = {}
    >>> def evaluate(plan):
    ...     failed = {}
    ...     for level in pending_levels(plan, values):
    ...         for node in level:
    ...             if node.op == "exp":
    ...                 failed[node.id] = "no kernel"
    ...             else:
    ...                 values[node.id] = "value"
    ...     return failed
    >>> first = plan_folds(FoldGraph((a, b)), DEFAULT_POLICY)
    >>> plan, failures = evaluate_until_stable(first, DEFAULT_POLICY, evaluate)
    >>> [d.reason.text for d in plan.decisions], failures
    (['evaluation failed', 'not constant'], {0: 'no kernel'})
    """
    failures: Dict[int, str] = dict(eval_failures or {})
    new_failures = evaluate(plan)
    while new_failures:
        failures.update(new_failures)
        plan = plan_folds(plan.graph, policy, eval_failures=failures)
        new_failures = evaluate(plan)
    return plan, failures


def pending_levels(plan: FoldPlan, values: Container[int]) -> Iterator[List[FoldNode]]:
    """The folded nodes of ``plan`` to evaluate now, grouped by dependency level, lowest first.

    A node that already has a value in ``values`` is left out. A folded node's level is one more
    than the highest level among its folded inputs (0 for none), so no node reads another of its
    own level: an adapter may evaluate a level's nodes in any order, or at once. Each level is
    filtered as it is reached, so the values an adapter filled for the levels before count, and a
    node with an input that has none (it failed: :func:`has_inputs`) is skipped.

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> t = TensorInfo.of("float32", (4,))
    >>> const = (NodeInput(InputKind.CONSTANT, "c", t),)
    >>> a = FoldNode(0, "exp", "a", "main", const, (t,))
    >>> b = FoldNode(1, "negative", "b", "main", const, (t,))
    >>> reads_both = (NodeInput(InputKind.NODE, "a", t, 0), NodeInput(InputKind.NODE, "b", t, 1))
    >>> c = FoldNode(2, "add", "c", "main", reads_both, (t,))
    >>> plan = plan_folds(FoldGraph((a, b, c)), DEFAULT_POLICY)
    >>> values = {}
    >>> for level in pending_levels(plan, values):
    ...     print([node.id for node in level])
    ...     values.update((node.id, "its value") for node in level)
    [0, 1]
    [2]
    """
    graph: FoldGraph = plan.graph
    level: Dict[int, int] = {}
    for decision in plan.folded:  # topological order: every input's level is known
        node = graph.nodes[decision.node]
        below = [
            level[inp.source]
            for inp in node.inputs
            if inp.kind is InputKind.NODE and inp.source in level
        ]
        level[node.id] = 1 + max(below, default=-1)
    grouped: Dict[int, List[FoldNode]] = {}
    for node_id, depth in level.items():
        if node_id not in values:
            grouped.setdefault(depth, []).append(graph.nodes[node_id])
    for depth in sorted(grouped):
        yield [node for node in grouped[depth] if has_inputs(node, values)]


def releasable(plan: FoldPlan, escaping: AbstractSet[int]) -> Dict[int, Tuple[int, ...]]:
    """The folded nodes whose values nothing needs once their consumers have theirs.

    Maps each such node to its consumers, all folded: the rewrite replaces a folded call without
    reading its operands, so once those consumers are evaluated the node's value can be dropped
    (a gigabyte model's int8 weights between ``quantize`` and ``dequantize``). Left out: a node
    with a consumer that is kept (its value becomes that call's constant operand) and one in
    ``escaping``, which the adapter reports for uses outside the graph (a return value, a tuple).
    Valid for ``plan`` only: a re-plan keeps more calls, and a dropped value they need is
    computed again (:func:`pending_levels` yields every folded node without a value).

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> t = TensorInfo.of("float32", (4,))
    >>> q = FoldNode(0, "quantize", "q", "main", (NodeInput(InputKind.CONSTANT, "w", t),), (t,))
    >>> dq = FoldNode(1, "dequantize", "dq", "main", (NodeInput(InputKind.NODE, "q", t, 0),), (t,))
    >>> plan = plan_folds(FoldGraph((q, dq)), DEFAULT_POLICY)
    >>> releasable(plan, escaping={1})  # dq is returned
    {0: (1,)}
    """
    folded = {decision.node for decision in plan.folded}
    consumers = plan.graph.consumers()
    return {
        node_id: consumers[node_id]
        for node_id in sorted(folded - escaping)
        if all(consumer in folded for consumer in consumers[node_id])
    }
