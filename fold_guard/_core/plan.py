"""The planner's result: one frozen decision per node of a FoldGraph.

:func:`fold_guard._core.planner.plan_folds` makes a :class:`FoldPlan`; the adapters apply it, the
report reads it. Nothing here decides anything.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .errors import FoldNotPossibleError
from .graph import Annotation, FoldGraph, FoldNode, InputKind
from .reasons import Action, Reason

__all__ = [
    "ALLOW_RULE",
    "BARRIER_RULE",
    "DEFAULT_RULE",
    "FoldDecision",
    "FoldPlan",
    "evaluation_error",
    "raise_if_not_possible",
]

#: The rule names of decisions no policy rule made: an annotation, or the IR's default.
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
            or not inp.reads_value
            or (inp.kind is InputKind.NODE and self.folds(inp.source))
            for inp in self.graph.nodes[node_id].inputs
        )

    def has_inputs_before_run_time(self, node_id: int) -> bool:
        """Whether every input is known before run time under this plan.

        That is, a constant, a weight parameter, a node this plan folds or lifts, or an item of a
        tuple this plan lifts: the node is on the constant path or on the parameter path, and not
        downstream of anything kept.
        """
        return all(
            inp.kind in (InputKind.CONSTANT, InputKind.PARAMETER)
            or not inp.reads_value
            or (inp.kind is InputKind.NODE and self.decisions[inp.source].action is not Action.KEEP)
            or (inp.kind is InputKind.TUPLE_ITEM and self.lifts(inp.source))
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
