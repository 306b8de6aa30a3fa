"""The closed set of outcomes a fold decision can have, with the text the report prints."""

from __future__ import annotations

from enum import Enum

__all__ = ["Action", "Reason"]


class Action(Enum):
    """What happens to a call: it becomes a constant, it stays in the IR, or it is lifted.

    ``LIFT`` is the parameter path's fold: the call computes from weights passed as parameters
    (and constants), so this pass cannot evaluate it, but the IR's parameter lifting
    (Relax ``LiftTransformParams``) moves it ahead of run time. It stays in the IR until then.
    """

    FOLD = "fold"
    KEEP = "keep"
    LIFT = "lift"


class Reason(Enum):
    """Why a call was folded, kept or lifted.

    ``FOLDED`` is the only reason that goes with ``Action.FOLD``, ``LIFTED`` the only one with
    ``Action.LIFT``.
    """

    FOLDED = "folded"
    LIFTED = "lifted ahead of run time"
    KEPT_BY_BARRIER = "kept by barrier"
    KEPT_BY_POLICY = "kept by policy"
    OVER_BUDGET = "over budget"
    # Kept only because an input was kept by a policy rule or the IR's default: counting these
    # as "kept by policy" made one kept weight look like a dozen rule hits on real models.
    KEPT_WITH_INPUT = "kept because an input was kept"
    NOT_CONSTANT = "not constant"
    DYNAMIC_SHAPE = "dynamic shape"
    IMPURE = "impure"
    UNSUPPORTED = "unsupported"
    EVAL_FAILED = "evaluation failed"
    # The kernel's result would depend on memory nobody wrote: it leaves part of its output
    # unwritten (a reduction over a zero-size axis never runs its init) or reads outside a
    # zero-size operand. Never folded, whatever the rules say: an intended difference from
    # stock, which folds those bytes (RFC.md, guarantee 7).
    UNWRITTEN_MEMORY = "depends on unwritten memory"

    @property
    def text(self) -> str:
        return self.value
