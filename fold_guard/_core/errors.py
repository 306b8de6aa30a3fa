"""Exceptions raised by fold_guard.

Every message says what failed, where (function and variable), why, and gives a hint.
They are plain Python so the TVM-free core can raise them too.
"""

from __future__ import annotations

__all__ = [
    "ConflictingAnnotationsError",
    "FoldGuardError",
    "FoldNotPossibleError",
    "PlanInvariantError",
    "PolicyRuleError",
    "PreconditionError",
    "UnknownPolicyError",
    "UnsupportedIRError",
]


class FoldGuardError(Exception):
    """Base class of every error fold_guard raises on purpose."""


class UnsupportedIRError(FoldGuardError, TypeError):
    """The input is not something fold_guard can read (wrong object type, unknown TVM version)."""


class PreconditionError(FoldGuardError, ValueError):
    """The input is of the right kind but breaks a documented precondition."""


class UnknownPolicyError(PreconditionError):
    """A policy name that is not registered."""


class ConflictingAnnotationsError(PreconditionError):
    """Annotations that contradict each other on the same value, e.g. ``fold_allow(fold_barrier(x))``."""


class FoldNotPossibleError(FoldGuardError, RuntimeError):
    """Under ``strict=True``: a ``fold_allow`` could not fold, or an evaluation failed."""


class PolicyRuleError(FoldGuardError, RuntimeError):
    """A policy rule's predicate raised, or returned something that is not a bool, on a call."""


class PlanInvariantError(FoldGuardError, RuntimeError):
    """An internal bug: a plan or a rewrite broke an invariant. Please report it."""
