"""Policy rules that misbehave get a clear PolicyRuleError naming the policy, the rule and the call.

A rule's predicate is user code run once per constant call, deep inside a pass. Unguarded, its
failures escape raw (``ZeroDivisionError``), a truthy non-bool (``"no"``) silently matches, an
ndarray leaks NumPy's ``ValueError``, and ``size_guard('2')`` leaks a ``TypeError``.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

import numpy as np
import pytest
from graphdsl import G

from fold_guard import (
    Action,
    FoldGuardError,
    FoldPolicy,
    PolicyRuleError,
    PreconditionError,
    Rule,
    size_guard,
)
from fold_guard._core.planner import plan_folds


def _graph():
    """``e = exp(c)`` (constant) -> ``y = add(x, e)`` (not constant): the policy sees only ``e``."""
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    g.call("relax.add", g.runtime("x"), e, label="y")
    return g.build()


def _policy(predicate) -> FoldPolicy:
    return FoldPolicy(
        "my-npu", "a backend's policy", (Rule("keep-exp", Action.KEEP, "exp stays", predicate),)
    )


def _raises(call):
    return 1 / 0


@pytest.mark.parametrize(
    "predicate, message",
    [
        (_raises, r"the predicate raised ZeroDivisionError: division by zero"),
        (lambda call: "no", r"the predicate returned str 'no', not a bool"),
        (lambda call: np.array([True, False]), r"the predicate returned ndarray .*, not a bool"),
        (lambda call: None, r"the predicate returned NoneType None, not a bool"),
        (lambda call: 1, r"the predicate returned int 1, not a bool"),
    ],
    ids=["raises", "str", "ndarray", "None", "int"],
)
def test_misbehaving_predicate_names_policy_rule_and_call(predicate, message):
    with pytest.raises(
        PolicyRuleError,
        match=r"policy 'my-npu', rule 'keep-exp', on main: e = relax.exp: " + message,
    ) as info:
        plan_folds(_graph(), _policy(predicate))
    assert isinstance(info.value, FoldGuardError)
    if predicate is _raises:
        assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    "answer, decision", [(np.bool_(True), Action.KEEP), (np.bool_(False), Action.FOLD)]
)
def test_numpy_bool_scalar_is_an_answer(answer, decision):
    """``np.all(...)`` returns a NumPy bool scalar: a real answer, not an error."""
    plan = plan_folds(_graph(), _policy(lambda call: answer))
    assert plan.decisions[0].action is decision


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: Rule("r", "fold", "d", lambda call: True),
            r"rule 'r': action must be Action.FOLD or Action.KEEP, got str 'fold'",
        ),
        (lambda: Rule("r", Action.FOLD, "d", True), r"rule 'r': matches must be a callable"),
        (
            lambda: Rule("", Action.FOLD, "d", lambda call: True),
            r"a Rule needs a non-empty string name",
        ),
        (
            lambda: FoldPolicy("p", "d", ["not a rule"]),
            r"policy 'p': rules must be a tuple of Rule objects, got list",
        ),
        (
            lambda: FoldPolicy("p", "d", ("not a rule",)),
            r"policy 'p': rules must be a tuple of Rule objects, got str",
        ),
        (lambda: size_guard("2"), r"size_guard growth_factor must be a number > 0, got '2'"),
        (lambda: size_guard(True), r"size_guard growth_factor must be a number > 0, got True"),
        (
            lambda: size_guard(2.0, min_result_bytes="4k"),
            r"size_guard min_result_bytes must be a number >= 0, got '4k'",
        ),
    ],
    ids=[
        "str-action",
        "non-callable",
        "empty-name",
        "rules-list",
        "rule-str",
        "size-guard-str",
        "size-guard-bool",
        "min-bytes-str",
    ],
)
def test_malformed_rules_and_policies_are_refused_when_built(build, message):
    with pytest.raises(PreconditionError, match=message):
        build()


def test_size_guard_accepts_numpy_numbers():
    assert size_guard(np.float32(2.0), min_result_bytes=np.int64(16)).rules[0].name == "size-guard"
