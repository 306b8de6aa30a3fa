"""Deciding, for every call of a FoldGraph, whether it folds and why.

Precedence, from strongest to weakest: ``fold_barrier`` > ``fold_allow`` > policy > the IR's
default, decided in one forward sweep over the topologically ordered nodes by guard clauses
(:data:`_GUARDS`, RFC.md "Decisions"). A value is *constant* when it is a literal or the output
of a node that folds; a barrier's output never is. A node with a non-constant input inherits
the cause (``KEPT_BY_BARRIER``, ``KEPT_WITH_INPUT`` naming the rule and ``root``, or
``NOT_CONSTANT``). A rule that folds only with its consumers (``Rule.needs_folded_consumers``)
is checked on the finished sweep and vetoed where a consumer does not fold. A lowered call no
rule recognises follows the policy's ``lowered_fallback``. Nothing is mutated: the result is a
frozen :class:`FoldPlan`.

**The parameter path.** A weight passed as a function parameter (``InputKind.PARAMETER``) is
known before run time, but not to this pass: a node that computes from such weights (and
constants) cannot fold here, and the IR's parameter lifting (Relax ``LiftTransformParams``) is
what evaluates it ahead of run time. The same precedence decides it, with *lift* in the place of
*fold*: a barrier keeps it, a policy rule's fold means lift and its keep means stay at run time,
and the default is the IR's stock lifting (``FoldNode.lift_rule`` names the stock rule that
keeps a call at run time whatever its inputs, like ``unfoldable`` does for folding). A lifted
value is known before run time to its consumers, so they are on the parameter path too.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .allowed import allowed_cone, check_annotations
from .graph import SOURCE_KINDS, Annotation, FoldGraph, FoldNode, InputKind
from .plan import (
    ALLOW_RULE,
    BARRIER_RULE,
    DEFAULT_RULE,
    FoldDecision,
    FoldPlan,
    evaluation_error,
    raise_if_not_possible,
)
from .policy import BUDGET_RULE, CallView, FoldPolicy, ask
from .reasons import Action, Reason
from .uses import GraphUses
from .values import LIFTED, RUNTIME, Value, first_non_constant, is_constant

__all__ = [
    "ALLOW_RULE",
    "BARRIER_RULE",
    "DEFAULT_RULE",
    "UNRECOGNISED_KERNEL_RULE",
    "FoldDecision",
    "FoldPlan",
    "evaluation_error",
    "plan_folds",
    "raise_if_not_possible",
]

logger = logging.getLogger("fold_guard")

#: The rule a lowered call no rule recognised is kept by, under ``lowered_fallback=Action.KEEP``.
UNRECOGNISED_KERNEL_RULE = "lowered_fallback"


def plan_folds(
    graph: FoldGraph,
    policy: FoldPolicy,
    *,
    eval_failures: Optional[Mapping[int, str]] = None,
) -> FoldPlan:
    """Decide every node of ``graph`` under ``policy``.

    ``eval_failures`` maps node ids the adapter tried and failed to evaluate to the error text;
    those nodes are kept with ``Reason.EVAL_FAILED`` and their consumers see a non-constant input.

    >>> from fold_guard._core.graph import FoldNode, NodeInput, TensorInfo
    >>> t = TensorInfo.of("float32", (4,))
    >>> c = NodeInput(InputKind.CONSTANT, "c", t)
    >>> x = NodeInput(InputKind.RUNTIME, "x", t)
    >>> g = FoldGraph((FoldNode(0, "relax.exp", "e", "main", (c,), (t,)),
    ...                FoldNode(1, "relax.add", "y", "main", (x, NodeInput(InputKind.NODE, "e", t, 0)), (t,))))
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> [d.reason.text for d in plan_folds(g, DEFAULT_POLICY).decisions]
    ['folded', 'not constant']
    """
    failures = dict(eval_failures or {})
    check_annotations(graph)
    allowed = allowed_cone(graph)
    uses = GraphUses(graph)
    # Step 1. Sweep forward. A conditional fold (a rule with ``needs_folded_consumers``) can only
    # be checked once its consumers are decided: each sweep that leaves one with a consumer that
    # does not fold vetoes the rule there and sweeps again. Vetoes only remove folds, so this
    # ends; without conditional rules (every policy but the QDQ ones) it is one sweep.
    vetoed: Dict[int, str] = {}
    while True:
        sweep = _Sweep(graph, policy, allowed, failures, uses, dict(vetoed))
        decisions = sweep.run()
        unmet = {
            node_id: _unmet_consumer(graph, decisions, node_id)
            for node_id in sorted(sweep.conditional)
        }
        unmet = {node_id: why for node_id, why in unmet.items() if why}
        if not unmet:
            break
        vetoed.update(unmet)
    # Step 2. The plan, logged once (not once per sweep).
    for node, decision in zip(graph.nodes, decisions):
        logger.debug("%s/%s: %s", node.function, node.label, decision)
    plan = FoldPlan(graph, tuple(decisions), policy.name)
    if logger.isEnabledFor(logging.INFO):  # explain() walks every decision: not for nothing
        logger.info("%s", plan.explain(verbose=False))
    return plan


#: A node's decision and the value its consumers see.
_Outcome = Tuple[FoldDecision, Value]


@dataclass
class _Sweep:
    """One forward sweep: the plan's fixed inputs, and the values decided so far.

    ``conditional`` collects the nodes a conditional rule (``Rule.needs_folded_consumers``)
    folded or lifted, for :func:`plan_folds` to check once the sweep is done.
    """

    graph: FoldGraph
    policy: FoldPolicy
    allowed: Set[int]
    failures: Mapping[int, str]
    uses: GraphUses
    vetoed: Mapping[int, str]
    conditional: Set[int] = field(default_factory=set)
    values: Dict[int, Value] = field(default_factory=dict)

    def run(self) -> List[FoldDecision]:
        decisions = []
        for node in self.graph.nodes:
            decision, self.values[node.id] = _decide(node, self)
            decisions.append(decision)
        return decisions


class _Verdict:
    """The three outcomes for one node: keep (with a reason and its cause), fold, lift."""

    __slots__ = ("node",)

    def __init__(self, node: FoldNode) -> None:
        self.node = node

    def keep(
        self, reason: Reason, rule: str = "", detail: str = "", cause: Optional[Value] = None
    ) -> _Outcome:
        node = self.node
        root = None if cause is None else cause.root
        decision = FoldDecision(
            node.id, node.label, node.op, Action.KEEP, reason, rule, detail, root
        )
        return decision, cause or Value(False, reason, rule, node.label, detail, node.id)

    def fold(self, rule: str, detail: str = "") -> _Outcome:
        node = self.node
        decision = FoldDecision(
            node.id, node.label, node.op, Action.FOLD, Reason.FOLDED, rule, detail
        )
        return decision, Value(True)

    def lift(self, rule: str, detail: str = "") -> _Outcome:
        node = self.node
        decision = FoldDecision(
            node.id, node.label, node.op, Action.LIFT, Reason.LIFTED, rule, detail
        )
        return decision, LIFTED


def _decide(node: FoldNode, sweep: _Sweep) -> _Outcome:
    """The first guard that answers decides, in precedence order; else the policy or the default.

    Like the early returns of TVM's ``ConstantFolder`` (``src/relax/transform/fold_constant.cc``):
    each guard checks one condition and answers, or passes (None) to the next.
    """
    for guard in _GUARDS:
        outcome = guard(node, sweep)
        if outcome is not None:
            return _with_shape_reads(node, sweep, outcome)
    outcome = _by_policy_or_default(
        node, sweep, _Verdict(node).fold, node.default_fold, node.default_rule
    )
    return _with_shape_reads(node, sweep, outcome)


def _with_shape_reads(node: FoldNode, sweep: _Sweep, outcome: _Outcome) -> _Outcome:
    """A fold that reads only the type of an input not known here says so in its detail.

    The stock Relax pass folds ``zeros_like(x)`` of a run-time ``x`` of static shape: its kernel
    reads no tensor. The report names what was not read, so the fold does not look like a bug.
    """
    decision, value = outcome
    if decision.action is not Action.FOLD:
        return outcome
    unread = [
        inp.label
        for inp in node.inputs
        if not inp.reads_value and not is_constant(inp, sweep.values)
    ]
    if not unread:
        return outcome
    what = f"{unread[0]}'s shape" if len(unread) == 1 else f"the shapes of {', '.join(unread)}"
    note = f"the kernel reads only {what}"
    detail = f"{decision.detail}; {note}" if decision.detail else note
    return dataclasses.replace(decision, detail=detail), value


def _barrier(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    """A barrier is kept, whatever its operand; its output is never constant."""
    if node.annotation is not Annotation.BARRIER:
        return None
    detail = "the barrier stays; nothing that consumes it folds"
    if first_non_constant(node, sweep.values) is None:
        if all(is_constant(inp, sweep.values) for inp in node.inputs):
            detail = "operand is constant; " + detail
        else:
            detail = (
                "operand is computed from weight parameters; the barrier stays; nothing that "
                "consumes it folds or is lifted"
            )
    return _Verdict(node).keep(Reason.KEPT_BY_BARRIER, BARRIER_RULE, detail)


def _blocked(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    """A node that cannot fold whatever the rules say: an input is not known before run time.

    The blocking input is the strongest (:func:`first_non_constant`); a node that reads only a
    barrier's static type (``type_source``, or an input that does not read its value) is
    blocked by the barrier too. Another cause that blocks a node before any rule is asked
    belongs here, as a clause of its own.
    """
    blocker = first_non_constant(node, sweep.values)
    if blocker is None:
        nodes = sweep.graph.nodes
        for source in _type_sources(node):
            if nodes[source].annotation is Annotation.BARRIER:
                blocker = nodes[source].label, sweep.values[source]
                break
    if blocker is None:
        return None
    return _inherit(node, sweep.graph, *blocker)


def _type_sources(node: FoldNode) -> List[int]:
    """The nodes whose static type alone ``node`` reads (not their values)."""
    sources = [
        inp.source for inp in node.inputs if not inp.reads_value and inp.kind in SOURCE_KINDS
    ]
    return sources + ([node.type_source] if node.type_source is not None else [])


def _inherit(node: FoldNode, graph: FoldGraph, label: str, cause: Value) -> _Outcome:
    """Keep ``node``, whose input ``label`` is not constant because of ``cause``."""
    keep = _Verdict(node).keep
    allow = node.annotation is Annotation.ALLOW
    if cause.reason is Reason.KEPT_BY_BARRIER:
        detail = f"input {label} is downstream of barrier {cause.origin}"
        return keep(Reason.KEPT_BY_BARRIER, BARRIER_RULE, detail, cause)
    if cause.reason is Reason.OVER_BUDGET and allow:
        # The budget outranks fold_allow: the allow reports the refusal as its own.
        detail = f"operand {label} cannot fold: {cause.detail}"
        return keep(Reason.OVER_BUDGET, cause.rule, detail, cause)
    if cause.reason in (Reason.KEPT_BY_POLICY, Reason.OVER_BUDGET):
        root = cause.origin
        if cause.root is not None:
            kept = graph.nodes[cause.root]
            root = f"{cause.origin} = {kept.op}" + (f"({kept.callee})" if kept.callee else "")
        # The rule is the decision's own ``rule``; the detail names the call it kept.
        return keep(Reason.KEPT_WITH_INPUT, cause.rule, f"input {label} was kept ({root})", cause)
    if allow and cause.reason is not Reason.NOT_CONSTANT:
        # the allow asked for this subgraph to be evaluated: report the root cause
        where = "" if cause.origin == label else f"{cause.origin}: "
        detail = f"operand {label} cannot fold: {where}{cause.detail}"
        return keep(cause.reason, "", detail, cause)
    if cause is RUNTIME:
        # Quoted, because a parameter named "input" read "input input is not constant".
        runtime = Value(False, Reason.NOT_CONSTANT, "", label, cause.detail)
        return keep(Reason.NOT_CONSTANT, "", f"{label!r} is a run-time input", runtime)
    return keep(Reason.NOT_CONSTANT, "", f"input {label} is not constant", cause)


def _over_budget(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    """Results larger than ``max_fold_bytes``: kept, decided from the types before allocating.

    Before the allow: the budget outranks it (an allow node allocates nothing itself).
    """
    budget = sweep.policy.max_fold_bytes
    if budget is None or node.annotation is not Annotation.NONE:
        return None
    total = sum(out.nbytes for out in node.outputs if out.nbytes is not None)
    if total <= budget:
        return None
    detail = f"its results would take {total} bytes, more than max_fold_bytes={budget}"
    return _Verdict(node).keep(Reason.OVER_BUDGET, BUDGET_RULE, detail)


def _parameter_path(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    """A node computed from weight parameters: the same precedence, with lift in place of fold.

    The stock lifting rule comes first, as ``unfoldable`` does for folding: neither a policy nor
    an allow can make the IR's lifting pass move a call it never moves.
    """
    if not any(
        inp.reads_value
        and (
            inp.kind is InputKind.PARAMETER
            or (inp.kind in SOURCE_KINDS and sweep.values[inp.source].lifted)
        )
        for inp in node.inputs
    ):
        return None
    verdict = _Verdict(node)
    if node.lift_rule:
        return verdict.keep(Reason.KEPT_BY_POLICY, DEFAULT_RULE, node.lift_rule)
    if node.annotation is Annotation.ALLOW:
        return verdict.lift(ALLOW_RULE, "operand is computed from weight parameters")
    if node.id in sweep.allowed:
        return verdict.lift(ALLOW_RULE, "inside a fold_allow subgraph")
    return _by_policy_or_default(node, sweep, verdict.lift, True, "")


def _eval_failed(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    if node.id not in sweep.failures:
        return None
    return _Verdict(node).keep(Reason.EVAL_FAILED, "", sweep.failures[node.id])


def _allow(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    if node.annotation is not Annotation.ALLOW:
        return None
    return _Verdict(node).fold(ALLOW_RULE, "operand is constant; the annotation is removed")


def _unfoldable(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    """A call the adapter can never evaluate (impure, unsupported, dynamic shape), or never to a
    defined value (its kernel may leave output unwritten): kept, whatever a rule or allow says."""
    if node.unfoldable is None:
        return None
    return _Verdict(node).keep(node.unfoldable, "", node.unfoldable_detail)


def _in_allowed_cone(node: FoldNode, sweep: _Sweep) -> Optional[_Outcome]:
    if node.id not in sweep.allowed:
        return None
    return _Verdict(node).fold(ALLOW_RULE, "inside a fold_allow subgraph")


#: The guard clauses of :func:`_decide`, strongest first (RFC.md, "Decisions", rows 1 to 7).
_GUARDS: Tuple[Callable[[FoldNode, _Sweep], Optional[_Outcome]], ...] = (
    _barrier,
    _blocked,
    _over_budget,
    _parameter_path,
    _eval_failed,
    _allow,
    _unfoldable,
    _in_allowed_cone,
)


def _by_policy_or_default(
    node: FoldNode,
    sweep: _Sweep,
    act: Callable[[str, str], _Outcome],
    default_acts: bool,
    default_rule: str,
) -> _Outcome:
    """Rows 8 and 9, on either path: the policy's first rule that answers, else the IR's default.

    ``act`` folds (or, on the parameter path, lifts); without a rule that answers, the call is
    acted on when ``default_acts``, else kept with the stock ``default_rule``'s text. A rule
    vetoed here (its consumers did not act with it in an earlier sweep) is skipped, and a
    conditional rule's act is recorded in ``sweep.conditional``.
    """
    keep = _Verdict(node).keep
    policy, veto = sweep.policy, sweep.vetoed.get(node.id, "")
    view = CallView(node, sweep.graph, sweep.uses)
    verdict = ask(policy, view, skip_conditional=bool(veto))
    if verdict is not None:
        action, rule = verdict
        detail = f"{rule.description} ({veto})" if veto else rule.description
        if action is Action.KEEP:
            return keep(Reason.KEPT_BY_POLICY, rule.name, detail)
        if rule.needs_folded_consumers:
            sweep.conditional.add(node.id)
        return act(rule.name, detail)
    if node.lowered and policy.reads_ops:
        return _unrecognised_kernel(node, policy, act, default_acts, default_rule)
    if default_acts:
        return act(DEFAULT_RULE, veto)
    detail = f"{default_rule} ({veto})" if veto else default_rule
    return keep(Reason.KEPT_BY_POLICY, DEFAULT_RULE, detail)


def _unrecognised_kernel(
    node: FoldNode,
    policy: FoldPolicy,
    act: Callable[[str, str], _Outcome],
    default_acts: bool,
    default_rule: str,
) -> _Outcome:
    """A lowered call no rule of an op-reading policy answered for: the policy's stated fallback.

    The report says so, since the rules may have meant it (a kernel named as no flow we know
    names it); ``FoldPolicy.lowered_fallback`` says whether it stays or the default decides.
    """
    what = (
        f"lowered call to kernel {node.callee or '?'} not recognised by the rules of policy "
        f"{policy.name!r}"
    )
    if policy.lowered_fallback is Action.KEEP:
        detail = f"{what}; kept (the policy's lowered_fallback)"
        return _Verdict(node).keep(Reason.KEPT_BY_POLICY, UNRECOGNISED_KERNEL_RULE, detail)
    if default_acts:
        return act(DEFAULT_RULE, f"{what}; the IR's default folds it")
    detail = f"{what}; the IR's default keeps it: {default_rule}"
    return _Verdict(node).keep(Reason.KEPT_BY_POLICY, DEFAULT_RULE, detail)


def _unmet_consumer(graph: FoldGraph, decisions: Sequence[FoldDecision], node_id: int) -> str:
    """Why a conditional fold (or lift) of ``node_id`` does not hold ("" when every consumer
    folds with it, or on the parameter path is lifted with it)."""
    action = decisions[node_id].action
    for user in graph.value_consumers()[node_id]:
        if decisions[user].action is not action:
            rule = decisions[node_id].rule
            consumer = graph.nodes[user]
            what = "does not fold" if action is Action.FOLD else "is not lifted"
            return f"{rule} did not apply: {consumer.label} = {consumer.op} {what}"
    return ""
