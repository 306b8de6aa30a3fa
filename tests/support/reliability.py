"""Helpers the reliability tests of both IRs share: the bad-input catalogue runner and the
concurrency check. They use only ``tvm.ir`` and the standard library, so they run on
any TVM either adapter supports.
"""

from __future__ import annotations

import concurrent.futures
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import pytest
import tvm

import fold_guard
from fold_guard import Action, CallView, FoldPolicy, Rule, policy_registry_scope, register_policy

__all__ = [
    "Kind",
    "check_concurrent_like_sequential",
    "check_kind",
    "keep_exp_policy",
    "policy_kinds",
    "register_twice",
]


@dataclass(frozen=True)
class Kind:
    """One kind of input: how to make it, what to call on it, and what must come out.

    ``error`` None means the input is valid: the call must succeed, and ``check(result, input)``
    judges the result.
    """

    make: Callable[[], object]
    call: Callable[[object], object]
    error: Optional[type] = None
    match: str = ""
    check: Optional[Callable[[Any, Any], None]] = None


def keep_exp_policy(predicate: Callable[[Any], Any]) -> FoldPolicy:
    """A backend's policy ``my-npu`` with one rule ``keep-exp`` whose predicate is ``predicate``."""
    return FoldPolicy(
        "my-npu", "a backend's policy", (Rule("keep-exp", Action.KEEP, "exp stays", predicate),)
    )


def register_twice(_mod: object = None) -> None:
    """Register ``my-npu`` twice (the second is an error), restoring the registry afterwards."""
    with policy_registry_scope():
        register_policy(keep_exp_policy(lambda call: True))
        register_policy(keep_exp_policy(lambda call: True))


class _WrongDecide(FoldPolicy):
    """A policy whose ``decide`` answers (FOLD, None) instead of (Action, Rule) or None."""

    def __init__(self) -> None:
        super().__init__("wrong-decide", "decide names no rule", ())

    def decide(self, call: CallView) -> Optional[Tuple[Action, Rule]]:
        return (Action.FOLD, None)  # type: ignore[return-value]


def policy_kinds(adapter: Any, make: Callable[[], object], exp_call: str) -> Dict[str, Kind]:
    """The catalogue entries about policies, alike in both IRs.

    ``adapter`` is ``fold_guard.relax`` or ``fold_guard.relay``; ``make`` builds a module whose one
    constant call is an ``exp``, which messages show as ``exp_call`` (``lv = relax.exp``).
    """
    on_exp = f"on main: {re.escape(exp_call)}"
    rule_error, precondition = fold_guard.PolicyRuleError, fold_guard.PreconditionError
    return {
        "empty-policy-list": Kind(
            make,
            lambda m: adapter.fold(m, policy=[]),
            precondition,
            r"non-empty list of them, got \[\]",
        ),
        "duplicate-registration": Kind(
            make, register_twice, precondition, r"a policy named 'my-npu' is already registered"
        ),
        "raising-rule": Kind(
            make,
            lambda m: adapter.fold(m, policy=keep_exp_policy(lambda call: 1 / 0)),
            rule_error,
            rf"policy 'my-npu', rule 'keep-exp', {on_exp}: the predicate raised ZeroDivisionError",
        ),
        "non-bool-rule": Kind(
            make,
            lambda m: adapter.FoldConstant(keep_exp_policy(lambda call: "no"))(m),
            rule_error,
            rf"rule 'keep-exp', {on_exp}: the predicate returned str 'no'",
        ),
        "ndarray-rule": Kind(
            make,
            lambda m: adapter.plan(m, keep_exp_policy(lambda call: np.ones(2, bool))),
            rule_error,
            rf"{on_exp}: the predicate returned ndarray",
        ),
        "decide-returns-no-rule": Kind(
            make,
            lambda m: adapter.fold(m, policy=_WrongDecide()),
            rule_error,
            r"policy 'wrong-decide' \(_WrongDecide.decide\) returned \(<Action.FOLD: 'fold'>, None\)",
        ),
        "rule-with-str-action": Kind(
            make,
            lambda m: adapter.fold(m, policy=FoldPolicy("p", "d", (Rule("r", "keep", "d", bool),))),
            precondition,
            r"rule 'r': action must be Action.FOLD or Action.KEEP, got str 'keep'",
        ),
        "size-guard-str": Kind(
            make,
            lambda m: adapter.fold(m, policy=fold_guard.size_guard("2")),
            precondition,
            r"size_guard growth_factor must be a number > 0, got '2'",
        ),
        "negative-budget": Kind(
            make,
            lambda m: adapter.fold(m, max_fold_bytes=-1),
            precondition,
            r"max_fold_bytes must be a byte count .* got int -1",
        ),
    }


def check_kind(kind: Kind) -> None:
    """Run one catalogue entry: the error class and message, or the check; the input unchanged."""
    subject = kind.make()
    saved = tvm.ir.save_json(subject) if isinstance(subject, tvm.IRModule) else None
    if kind.error is not None:
        with pytest.raises(kind.error, match=kind.match):
            kind.call(subject)
    else:
        result = kind.call(subject)
        assert kind.check is not None, "a valid kind needs a check"
        kind.check(result, subject)
    if saved is not None:
        assert tvm.ir.save_json(subject) == saved, "the caller's module was changed"


def check_concurrent_like_sequential(
    entries: Sequence[Callable[[tvm.IRModule], tvm.IRModule]],
    work: Sequence[tvm.IRModule],
    *,
    rounds: int = 1,
    assert_equal: Callable[[tvm.IRModule, tvm.IRModule], None] = tvm.ir.assert_structural_equal,
) -> None:
    """Each entry run on ``work`` from ``len(work)`` threads at once equals it run sequentially,
    raises nothing, and leaves every input byte-for-byte as it was."""
    for entry in entries:
        expected = [entry(mod) for mod in work]
        saved = [tvm.ir.save_json(mod) for mod in work]
        for _ in range(rounds):
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(work)) as pool:
                results = list(pool.map(entry, work))
            for got, want in zip(results, expected):
                assert_equal(got, want)
        assert [tvm.ir.save_json(mod) for mod in work] == saved
