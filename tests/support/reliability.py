"""Helpers the reliability tests of both IRs share: the bad-input catalogue runner and the
concurrency check. They use only ``tvm.ir`` and the standard library, so they run on
any TVM either adapter supports.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pytest
import tvm

from fold_guard import Action, FoldPolicy, Rule, policy_registry_scope, register_policy

__all__ = [
    "Kind",
    "check_concurrent_like_sequential",
    "check_kind",
    "keep_exp_policy",
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
