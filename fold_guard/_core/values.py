"""What the planner's sweep knows of each node's output, and which input blocks a node.

A node's output is *constant* (it folds), *lifted* (not constant here but known before run time:
the parameter path), or neither, with the *cause* its consumers inherit: a run-time input, a
barrier, a call a rule kept, a call that cannot be evaluated. :func:`first_non_constant` picks
the input that blocks a node, by strength and not by argument order, so the reason a report
gives does not depend on how the call's operands happen to be ordered.

>>> from fold_guard._core.graph import FoldNode, NodeInput, TensorInfo
>>> t = TensorInfo.of("float32", (2,))
>>> a, x = NodeInput(InputKind.NODE, "a", t, 0), NodeInput(InputKind.RUNTIME, "x", t)
>>> y = FoldNode(1, "relax.add", "y", "main", (a, x), (t,))
>>> first_non_constant(y, {0: Value(True)})[0]
'x'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from .graph import FoldNode, InputKind, NodeInput
from .reasons import Reason

__all__ = [
    "LIFTED",
    "RUNTIME",
    "Value",
    "first_non_constant",
    "is_constant",
]


@dataclass(frozen=True)
class Value:
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


LIFTED = Value(False, Reason.LIFTED, lifted=True)
#: The cause a run-time input gives; the planner tells it apart by identity to word its detail.
RUNTIME = Value(False, Reason.NOT_CONSTANT, "", "", "a run-time input")

_CAUSE_RANK = {Reason.KEPT_BY_BARRIER: 1, Reason.KEPT_BY_POLICY: 2, Reason.OVER_BUDGET: 2}


def is_constant(inp: NodeInput, values: Mapping[int, Value]) -> bool:
    """A literal constant, or the output of a node that folds (never a tuple item: the stock
    pass folds none). Whether the call reads the value is not asked here."""
    return inp.kind is InputKind.CONSTANT or (
        inp.kind is InputKind.NODE and values[inp.source].constant
    )


def first_non_constant(node: FoldNode, values: Mapping[int, Value]) -> Optional[Tuple[str, Value]]:
    """The strongest input not known before run time, independent of argument order.

    A weight parameter and a lifted value are known before run time: they put the node on the
    parameter path, they do not block it; so does a tuple item of a lifted call.

    A run-time input (or one that could not fold for any reason other than a keep) ranks first,
    then a barrier, then a policy keep; ties go to the earliest argument. An input whose value
    the call does not read (``NodeInput.reads_value``) blocks nothing here; the planner keeps a
    call that reads a barrier's type.
    """
    found: Optional[Tuple[int, str, Value]] = None
    for inp in node.inputs:
        if not inp.reads_value:
            continue
        if inp.kind is InputKind.RUNTIME:
            return inp.label, RUNTIME
        if inp.kind is InputKind.TUPLE_ITEM:
            if values[inp.source].lifted:
                continue
            return inp.label, RUNTIME  # the stock pass folds no tuple item
        if inp.kind is InputKind.NODE and not values[inp.source].before_run_time:
            value = values[inp.source]
            rank = _CAUSE_RANK.get(value.reason, 0)
            if rank == 0:
                return inp.label, value
            if found is None or rank < found[0]:
                found = (rank, inp.label, value)
    return None if found is None else (found[1], found[2])
