"""How the command groups decisions: the picture's colours, the headline and ``--only``.

Every reason falls in one drawing category; the categories fall in four groups, the ones the
headline counts: ``folded``, ``kept`` (its inputs are constant, and something kept it: a barrier,
a rule, a kept input, an evaluation that cannot or did not run), ``not-constant`` (it reads a
run-time value, so no policy could fold it) and ``lifted`` (it computes from weights passed as
parameters: ``LiftTransformParams`` evaluates it ahead of run time). ``--only`` takes a group or
a category.

>>> category_of(Reason.OVER_BUDGET), group_of(Reason.OVER_BUDGET)
('kept_by_rule', 'kept')
>>> sorted(selected(["kept-by-rule", "folded"]))
['folded', 'kept_by_rule']
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Set, Tuple

from .._core.reasons import Reason

__all__ = ["CATEGORIES", "GROUPS", "category_of", "group_of", "selected"]

#: Decision category -> (legend text, fill colour). Order is the legend's.
CATEGORIES: Dict[str, Tuple[str, str]] = {
    "folded": ("folded", "#2e7d32"),
    "lifted": ("lifted ahead of run time (from weight parameters)", "#81c784"),
    "kept_by_barrier": ("kept by a barrier", "#c62828"),
    "kept_by_rule": ("kept by a rule", "#ef6c00"),
    "kept_with_input": ("kept because an input was kept", "#ffcc80"),
    "not_constant": ("not constant", "#cfd8dc"),
    "unsupported": (
        "cannot be evaluated (unsupported, impure, dynamic shape, failed, unwritten memory)",
        "#8e24aa",
    ),
}

#: Headline group -> its categories.
GROUPS: Dict[str, Tuple[str, ...]] = {
    "folded": ("folded",),
    "kept": ("kept_by_barrier", "kept_by_rule", "kept_with_input", "unsupported"),
    "not_constant": ("not_constant",),
    "lifted": ("lifted",),
}

_BY_REASON = {
    Reason.FOLDED: "folded",
    Reason.LIFTED: "lifted",
    Reason.KEPT_BY_BARRIER: "kept_by_barrier",
    Reason.KEPT_BY_POLICY: "kept_by_rule",
    Reason.OVER_BUDGET: "kept_by_rule",  # the max_fold_bytes rule
    Reason.KEPT_WITH_INPUT: "kept_with_input",
    Reason.NOT_CONSTANT: "not_constant",
}


def category_of(reason: Reason) -> str:
    """The drawing category of a decision's reason (impure, dynamic shape, ... are "unsupported")."""
    return _BY_REASON.get(reason, "unsupported")


def group_of(reason: Reason) -> str:
    """``folded``, ``kept``, ``not_constant`` or ``lifted``: the headline's counts."""
    category = category_of(reason)
    return next(group for group, members in GROUPS.items() if category in members)


def selected(filters: Iterable[str]) -> FrozenSet[str]:
    """The categories ``--only`` names select (``kept`` is every category of that group)."""
    chosen: Set[str] = set()
    for name in filters:
        key = name.replace("-", "_")
        chosen.update(GROUPS.get(key, (key,)))
    unknown = chosen - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown decision categories: {sorted(unknown)}")
    return frozenset(chosen)
