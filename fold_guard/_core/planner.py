"""Deciding, for every call of a FoldGraph, whether it folds and why.

Precedence, from strongest to weakest: ``fold_barrier`` > ``fold_allow`` > policy > the IR's
default. In one forward pass over the topologically ordered nodes:

* a value is *constant* when it is a literal constant or the output of a node that folds;
* a barrier is always kept and its output is never constant, so nothing downstream folds, not
  even a node whose value only needs the barrier's static type (``FoldNode.type_source``);
* a node with a non-constant input is kept, with the cause inherited from that input
  (a barrier upstream gives ``KEPT_BY_BARRIER``, a call kept by a rule upstream gives
  ``KEPT_WITH_INPUT`` with that rule and ``root`` naming the kept call, anything else
  ``NOT_CONSTANT``);
* a node the adapter cannot evaluate keeps its own reason (impure, unsupported, dynamic shape,
  or an evaluation failure reported back by the adapter);
* a node in the backward cone of a ``fold_allow`` operand (stopping at barriers) folds;
* otherwise the policy's first matching rule decides, and without one the IR's default does;
  a rule that folds only with its consumers (``Rule.needs_folded_consumers``) is checked on the
  finished sweep, and where a consumer does not fold the node is decided again without it.

An allow node whose operand is constant folds (the annotation disappears). The planner never
mutates anything: it returns a frozen :class:`FoldPlan`.

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

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from .errors import (
    ConflictingAnnotationsError,
    FoldNotPossibleError,
    PolicyRuleError,
    PreconditionError,
)
from .graph import Annotation, FoldGraph, FoldNode, InputKind
from .policy import BUDGET_RULE, CallView, FoldPolicy, Rule
from .reasons import Action, Reason
from .uses import GraphUses

__all__ = [
    "ALLOW_RULE",
    "BARRIER_RULE",
    "DEFAULT_RULE",
    "FoldDecision",
    "FoldPlan",
    "evaluation_error",
    "plan_folds",
    "raise_if_not_possible",
]

logger = logging.getLogger("fold_guard")

ALLOW_RULE = "fold_allow"
BARRIER_RULE = "fold_barrier"
DEFAULT_RULE = "default"


@dataclass(frozen=True)
class FoldDecision:
    """The outcome for one node: ``action``, ``reason``, the ``rule`` that decided, and a detail.

    ``root`` is the id of the node where the cause of a keep starts, when it is not this node:
    the call a rule kept (``KEPT_WITH_INPUT``), the barrier upstream (``KEPT_BY_BARRIER``), or
    the call that could not be evaluated (``NOT_CONSTANT``); None for run-time inputs.
    """

    node: int
    label: str
    op: str
    action: Action
    reason: Reason
    rule: str = ""
    detail: str = ""
    root: Optional[int] = None

    def __str__(self) -> str:
        rule = f" [{self.rule}]" if self.rule else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.label} = {self.op}: {self.reason.text}{rule}{detail}"


@dataclass(frozen=True)
class FoldPlan:
    """Decisions for every node of ``graph``, in node order, under ``policy_name``."""

    graph: FoldGraph
    decisions: Tuple[FoldDecision, ...]
    policy_name: str
    #: :attr:`folded`, once asked (the plan is immutable; the driver and the rewrite ask often)
    _folded: Optional[Tuple[FoldDecision, ...]] = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def folded(self) -> Tuple[FoldDecision, ...]:
        if self._folded is None:
            folded = tuple(d for d in self.decisions if d.action is Action.FOLD)
            object.__setattr__(self, "_folded", folded)  # frozen; eq and hash ignore it
            return folded
        return self._folded

    @property
    def kept(self) -> Tuple[FoldDecision, ...]:
        return tuple(d for d in self.decisions if d.action is Action.KEEP)

    @property
    def lifted(self) -> Tuple[FoldDecision, ...]:
        """The calls computed ahead of run time from weight parameters (see the module doc)."""
        return tuple(d for d in self.decisions if d.action is Action.LIFT)

    def folds(self, node_id: int) -> bool:
        return self.decisions[node_id].action is Action.FOLD

    def lifts(self, node_id: int) -> bool:
        return self.decisions[node_id].action is Action.LIFT

    def has_constant_inputs(self, node_id: int) -> bool:
        """Whether every input of the node is a literal constant or a node this plan folds.

        Constant *under this plan*, which is narrower than computing from constants
        (:meth:`FoldGraph.reachable_from_constants`): a rule that keeps a call upstream makes
        this false.
        """
        return all(
            inp.kind is InputKind.CONSTANT
            or (inp.kind is InputKind.NODE and self.folds(inp.source))
            for inp in self.graph.nodes[node_id].inputs
        )

    def has_inputs_before_run_time(self, node_id: int) -> bool:
        """Whether every input is known before run time under this plan.

        That is, a constant, a weight parameter, or a node this plan folds or lifts: the node is
        on the constant path or on the parameter path, and not downstream of anything kept.
        """
        return all(
            inp.kind in (InputKind.CONSTANT, InputKind.PARAMETER)
            or (inp.kind is InputKind.NODE and self.decisions[inp.source].action is not Action.KEEP)
            for inp in self.graph.nodes[node_id].inputs
        )

    def count_by_reason(self) -> Dict[Reason, int]:
        counts = Counter(d.reason for d in self.decisions)
        return {reason: counts[reason] for reason in Reason if counts[reason]}

    def explain(self, *, verbose: bool = True) -> str:
        """A readable report: counts by reason, then (``verbose``) one line per decision."""
        counts = ", ".join(f"{n} {reason.text}" for reason, n in self.count_by_reason().items())
        lines = [f"fold plan under policy {self.policy_name!r}: {counts or 'no calls'}"]
        if verbose:
            for node, decision in zip(self.graph.nodes, self.decisions):
                lines.append(f"  {node.function}: {decision}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Value:
    """Whether a node's output is constant and, if not, the cause consumers inherit.

    ``origin`` is where the cause starts (a run-time input, a barrier, a kept or unevaluable
    call) and ``detail`` what went wrong there, so a ``fold_allow`` far downstream can say why.
    ``lifted`` marks a value that is not constant here but known before run time (the
    parameter path); its consumers are not blocked by it.
    """

    constant: bool
    reason: Reason = Reason.FOLDED
    rule: str = ""
    origin: str = ""
    detail: str = ""
    root: Optional[int] = None
    lifted: bool = False

    @property
    def before_run_time(self) -> bool:
        return self.constant or self.lifted


_LIFTED = _Value(False, Reason.LIFTED, lifted=True)


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
    >>> from fold_guard._core.policy import DEFAULT_POLICY
    >>> [d.reason.text for d in plan_folds(g, DEFAULT_POLICY).decisions]
    ['folded', 'not constant']
    """
    failures = dict(eval_failures or {})
    _check_annotations(graph)
    allowed = _allowed_cone(graph)
    uses = GraphUses(graph)
    # Step 1. Sweep forward. A conditional fold (a rule with ``needs_folded_consumers``) can only
    # be checked once its consumers are decided: each sweep that leaves one with a consumer that
    # does not fold vetoes the rule there and sweeps again. Vetoes only remove folds, so this
    # ends; without conditional rules (every policy but the QDQ ones) it is one sweep.
    vetoed: Dict[int, str] = {}
    while True:
        conditional: Set[int] = set()
        decisions = _sweep(graph, policy, allowed, failures, uses, vetoed, conditional)
        unmet = {
            node_id: _unmet_consumer(graph, decisions, uses, node_id)
            for node_id in sorted(conditional)
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


def _sweep(
    graph: FoldGraph,
    policy: FoldPolicy,
    allowed: Set[int],
    failures: Mapping[int, str],
    uses: GraphUses,
    vetoed: Mapping[int, str],
    conditional: Set[int],
) -> List[FoldDecision]:
    """Decide every node in order; record in ``conditional`` the nodes a conditional rule folded."""
    values: Dict[int, _Value] = {}
    decisions = []
    for node in graph.nodes:
        decision, value = _decide(
            node, graph, policy, values, allowed, failures, uses, vetoed, conditional
        )
        values[node.id] = value
        decisions.append(decision)
    return decisions


def _unmet_consumer(
    graph: FoldGraph, decisions: Sequence[FoldDecision], uses: GraphUses, node_id: int
) -> str:
    """Why a conditional fold (or lift) of ``node_id`` does not hold ("" when every consumer
    folds with it, or on the parameter path is lifted with it)."""
    action = decisions[node_id].action
    for user in uses.consumers[node_id]:
        if decisions[user].action is not action:
            rule = decisions[node_id].rule
            consumer = graph.nodes[user]
            what = "does not fold" if action is Action.FOLD else "is not lifted"
            return f"{rule} did not apply: {consumer.label} = {consumer.op} {what}"
    return ""


def _check_annotations(graph: FoldGraph) -> None:
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


def _allowed_cone(graph: FoldGraph) -> Set[int]:
    """Nodes upstream of a fold_allow operand, not crossing barriers."""
    allowed: Set[int] = set()
    for node in reversed(graph.nodes):
        if node.annotation is not Annotation.ALLOW and node.id not in allowed:
            continue
        for inp in node.inputs:
            if (
                inp.kind is InputKind.NODE
                and graph.nodes[inp.source].annotation is not Annotation.BARRIER
            ):
                allowed.add(inp.source)
    return allowed


def _decide(
    node: FoldNode,
    graph: FoldGraph,
    policy: FoldPolicy,
    values: Mapping[int, _Value],
    allowed: Set[int],
    failures: Mapping[int, str],
    uses: GraphUses,
    vetoed: Mapping[int, str],
    conditional: Set[int],
) -> Tuple[FoldDecision, _Value]:
    def keep(
        reason: Reason, rule: str = "", detail: str = "", cause: Optional[_Value] = None
    ) -> Tuple[FoldDecision, _Value]:
        root = None if cause is None else cause.root
        decision = FoldDecision(
            node.id, node.label, node.op, Action.KEEP, reason, rule, detail, root
        )
        return decision, cause or _Value(False, reason, rule, node.label, detail, node.id)

    def fold(rule: str, detail: str = "") -> Tuple[FoldDecision, _Value]:
        decision = FoldDecision(
            node.id, node.label, node.op, Action.FOLD, Reason.FOLDED, rule, detail
        )
        return decision, _Value(True)

    def lift(rule: str, detail: str = "") -> Tuple[FoldDecision, _Value]:
        decision = FoldDecision(
            node.id, node.label, node.op, Action.LIFT, Reason.LIFTED, rule, detail
        )
        return decision, _LIFTED

    if node.annotation is Annotation.BARRIER:
        detail = "the barrier stays; nothing that consumes it folds"
        if _first_non_constant(node, values) is None:
            constant = all(
                inp.kind is InputKind.CONSTANT
                or (inp.kind is InputKind.NODE and values[inp.source].constant)
                for inp in node.inputs
            )
            if constant:
                detail = "operand is constant; " + detail
            else:
                detail = (
                    "operand is computed from weight parameters; the barrier stays; nothing that "
                    "consumes it folds or is lifted"
                )
        return keep(Reason.KEPT_BY_BARRIER, BARRIER_RULE, detail)

    blocker = _first_non_constant(node, values)
    if (
        blocker is None
        and node.type_source is not None
        and graph.nodes[node.type_source].annotation is Annotation.BARRIER
    ):
        barrier = graph.nodes[node.type_source]
        blocker = barrier.label, values[barrier.id]
    if blocker is not None:
        label, cause = blocker
        if cause.reason is Reason.KEPT_BY_BARRIER:
            return keep(
                Reason.KEPT_BY_BARRIER,
                BARRIER_RULE,
                f"input {label} is downstream of barrier {cause.origin}",
                cause,
            )
        if cause.reason is Reason.OVER_BUDGET and node.annotation is Annotation.ALLOW:
            # The budget outranks fold_allow: the allow reports the refusal as its own.
            return keep(
                Reason.OVER_BUDGET,
                cause.rule,
                f"operand {label} cannot fold: {cause.detail}",
                cause,
            )
        if cause.reason in (Reason.KEPT_BY_POLICY, Reason.OVER_BUDGET):
            root = (
                f"{cause.origin} = {graph.nodes[cause.root].op}"
                if cause.root is not None
                else cause.origin
            )
            # The rule is the decision's own ``rule``; the detail names the call it kept.
            detail = f"input {label} was kept ({root})"
            return keep(Reason.KEPT_WITH_INPUT, cause.rule, detail, cause)
        if node.annotation is Annotation.ALLOW and cause.reason is not Reason.NOT_CONSTANT:
            # the allow asked for this subgraph to be evaluated: report the root cause
            where = "" if cause.origin == label else f"{cause.origin}: "
            return keep(
                cause.reason, "", f"operand {label} cannot fold: {where}{cause.detail}", cause
            )
        if cause is _RUNTIME:
            # Quoted, because a parameter named "input" read "input input is not constant".
            runtime = _Value(False, Reason.NOT_CONSTANT, "", label, cause.detail)
            return keep(Reason.NOT_CONSTANT, "", f"{label!r} is a run-time input", runtime)
        return keep(Reason.NOT_CONSTANT, "", f"input {label} is not constant", cause)

    over = _over_budget(node, policy.max_fold_bytes)
    if over:
        # Before the allow: the budget outranks it. Decided from the types, before anything is
        # allocated; an allow node itself allocates nothing (it is its operand's value).
        return keep(Reason.OVER_BUDGET, BUDGET_RULE, over)
    if any(
        inp.kind is InputKind.PARAMETER
        or (inp.kind is InputKind.NODE and values[inp.source].lifted)
        for inp in node.inputs
    ):
        return _decide_lift(node, graph, policy, allowed, uses, keep, lift, vetoed, conditional)
    if node.id in failures:
        return keep(Reason.EVAL_FAILED, "", failures[node.id])
    if node.annotation is Annotation.ALLOW:
        return fold(ALLOW_RULE, "operand is constant; the annotation is removed")
    if node.unfoldable is not None:
        return keep(node.unfoldable, "", node.unfoldable_detail)
    if node.id in allowed:
        return fold(ALLOW_RULE, "inside a fold_allow subgraph")
    return _by_policy_or_default(
        node,
        graph,
        policy,
        uses,
        keep,
        fold,
        node.default_fold,
        node.default_rule,
        vetoed,
        conditional,
    )


class _Keep(Protocol):
    def __call__(
        self, reason: Reason, rule: str = ..., detail: str = ..., cause: Optional[_Value] = ...
    ) -> Tuple[FoldDecision, _Value]: ...


class _Act(Protocol):
    """Fold, or (on the parameter path) lift."""

    def __call__(self, rule: str, detail: str = ...) -> Tuple[FoldDecision, _Value]: ...


def _by_policy_or_default(
    node: FoldNode,
    graph: FoldGraph,
    policy: FoldPolicy,
    uses: GraphUses,
    keep: _Keep,
    act: _Act,
    default_acts: bool,
    default_rule: str,
    vetoed: Mapping[int, str],
    conditional: Set[int],
) -> Tuple[FoldDecision, _Value]:
    """Rows 8 and 9, on either path: the policy's first rule that answers, else the IR's default.

    ``act`` folds (or, on the parameter path, lifts); without a rule that answers, the call is
    acted on when ``default_acts``, else kept with the stock ``default_rule``'s text. A rule
    ``vetoed`` here (its consumers did not act with it in an earlier sweep) is skipped, and a
    conditional rule's act is recorded in ``conditional``.
    """
    if node.lowered and policy.reads_ops:
        raise _lowered_call_error(node, policy)
    veto = vetoed.get(node.id, "")
    view = CallView(node, graph, uses)
    # Asked without the keyword unless needed: a subclass's decide(call) keeps working.
    answer = policy.decide(view, skip_conditional=True) if veto else policy.decide(view)
    verdict = _checked_verdict(policy, node, answer)
    if verdict is not None:
        action, rule = verdict
        detail = f"{rule.description} ({veto})" if veto else rule.description
        if action is Action.FOLD:
            if rule.needs_folded_consumers:
                conditional.add(node.id)
            return act(rule.name, detail)
        return keep(Reason.KEPT_BY_POLICY, rule.name, detail)
    if default_acts:
        return act(DEFAULT_RULE, veto)
    return keep(
        Reason.KEPT_BY_POLICY, DEFAULT_RULE, f"{default_rule} ({veto})" if veto else default_rule
    )


def _decide_lift(
    node: FoldNode,
    graph: FoldGraph,
    policy: FoldPolicy,
    allowed: Set[int],
    uses: GraphUses,
    keep: _Keep,
    lift: _Act,
    vetoed: Mapping[int, str],
    conditional: Set[int],
) -> Tuple[FoldDecision, _Value]:
    """The parameter path (module doc): the fold path's precedence, with lift in place of fold.

    The stock lifting rule comes first, as ``unfoldable`` does for folding: neither a policy nor
    an allow can make the IR's lifting pass move a call it never moves.
    """
    if node.lift_rule:
        return keep(Reason.KEPT_BY_POLICY, DEFAULT_RULE, node.lift_rule)
    if node.annotation is Annotation.ALLOW:
        return lift(ALLOW_RULE, "operand is computed from weight parameters")
    if node.id in allowed:
        return lift(ALLOW_RULE, "inside a fold_allow subgraph")
    return _by_policy_or_default(
        node, graph, policy, uses, keep, lift, True, "", vetoed, conditional
    )


def _checked_verdict(
    policy: FoldPolicy, node: FoldNode, verdict: object
) -> Optional[Tuple[Action, Rule]]:
    """``verdict`` as ``FoldPolicy.decide`` promises it (None or ``(Action, Rule)``), else an error.

    A subclass may override ``decide``; what it returns is checked here, so a wrong answer
    names the policy instead of failing deep in the planner.
    """
    if verdict is None:
        return None
    if (
        isinstance(verdict, tuple)
        and len(verdict) == 2
        and verdict[0] in (Action.FOLD, Action.KEEP)
        and isinstance(verdict[1], Rule)
    ):
        return verdict
    raise PolicyRuleError(
        f"policy {policy.name!r} ({type(policy).__name__}.decide) returned {verdict!r} for "
        f"{node.label} = {node.op} in function {node.function}; hint: decide must return None "
        "(no opinion) or a pair (Action, Rule), the rule that chose the action"
    )


def _over_budget(node: FoldNode, max_fold_bytes: Optional[int]) -> str:
    """Why ``node``'s results exceed the budget ("" when they do not, or there is none)."""
    if max_fold_bytes is None or node.annotation is not Annotation.NONE:
        return ""
    sizes = [out.nbytes for out in node.outputs]
    total = sum(size for size in sizes if size is not None)
    if total <= max_fold_bytes:
        return ""
    return f"its results would take {total} bytes, more than max_fold_bytes={max_fold_bytes}"


# The cause a run-time input gives; ``_decide`` tells it apart by identity to word its detail.
_RUNTIME = _Value(False, Reason.NOT_CONSTANT, "", "", "a run-time input")

_CAUSE_RANK = {Reason.KEPT_BY_BARRIER: 1, Reason.KEPT_BY_POLICY: 2, Reason.OVER_BUDGET: 2}


def _first_non_constant(
    node: FoldNode, values: Mapping[int, _Value]
) -> Optional[Tuple[str, _Value]]:
    """The strongest input not known before run time, independent of argument order.

    A weight parameter and a lifted value are known before run time: they put the node on the
    parameter path, they do not block it.

    A run-time input (or one that could not fold for any reason other than a keep) ranks first,
    then a barrier, then a policy keep; ties go to the earliest argument.
    """
    found: Optional[Tuple[int, str, _Value]] = None
    for inp in node.inputs:
        if inp.kind is InputKind.RUNTIME:
            return inp.label, _RUNTIME
        if inp.kind is InputKind.NODE and not values[inp.source].before_run_time:
            value = values[inp.source]
            rank = _CAUSE_RANK.get(value.reason, 0)
            if rank == 0:
                return inp.label, value
            if found is None or rank < found[0]:
                found = (rank, inp.label, value)
    return None if found is None else (found[1], found[2])


def _lowered_call_error(node: FoldNode, policy: FoldPolicy) -> PreconditionError:
    rules = ", ".join(rule.name for rule in policy.rules if rule.reads_ops)
    return PreconditionError(
        f"function {node.function}: {node.label} = {node.op} has constant inputs, but the module is "
        f"already lowered (LegalizeOps turned its ops into kernel calls), and policy "
        f"{policy.name!r} decides by op name ({rules}): it cannot tell what this call computes. "
        "Hint: annotate before lowering (fold_guard.relax.annotate(mod, policy=...) right after the "
        "import writes the policy into the module as fold_barrier / fold_allow, which every later "
        "pipeline keeps), or fold this module under 'default' or a size_guard"
    )


def evaluation_error(node: FoldNode, detail: str) -> FoldNotPossibleError:
    """The error ``strict=True`` raises when evaluating ``node`` failed with ``detail``."""
    return FoldNotPossibleError(
        f"function {node.function}: evaluating {node.label} = {node.op} failed: {detail}. "
        "Hint: pass strict=False to keep the call and continue"
    )


def raise_if_not_possible(plan: FoldPlan) -> None:
    """What ``strict=True`` refuses: a failed evaluation, or a ``fold_allow`` that was kept."""
    for node, decision in zip(plan.graph.nodes, plan.decisions):
        if decision.reason is Reason.EVAL_FAILED:
            raise evaluation_error(node, decision.detail)
        if node.annotation is Annotation.ALLOW and decision.action is Action.KEEP:
            raise FoldNotPossibleError(
                f"function {node.function}: {node.label} = fold_allow(...) cannot fold: "
                f"{decision.reason.text}{': ' + decision.detail if decision.detail else ''}. "
                "Hint: fold_allow needs an operand computed from constants only"
            )
