"""An ``If`` whose condition is computed from constants, and what reads it.

    %c = less(1f, 2f)                         # folds to True
    %i = if (%c) { exp(W) } else { %x }       # stock: becomes exp(W), which folds
    add(%i, W)                                # stock: then folds too  ==>  one constant

fold_guard first sees the ``If`` as a run-time value (its condition is not a literal), evaluates
the condition, and lowers again with it known, so the result is stock's, reader included.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import fold_guard.relay as fgr
from fold_guard import Reason

W = np.arange(6, dtype="float32").reshape(2, 3) / 10


Y = relay.var("y", shape=(1,))


def _module(condition: relay.Expr, nested: bool = False) -> tvm.IRModule:
    x = relay.var("x", shape=(2, 3))
    w = relay.const(W)
    branch = relay.If(condition, relay.exp(w), x)
    if nested:  # the chosen branch is itself an If on a computed condition
        branch = relay.If(relay.greater(relay.const(3.0), relay.const(2.0)), branch, x)
    body = relay.add(branch, w)
    params = [x, Y] if Y in relay.analysis.free_vars(body) else [x]
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))


CASES = {
    "true": lambda: _module(relay.less(relay.const(1.0), relay.const(2.0))),
    "false": lambda: _module(relay.less(relay.const(2.0), relay.const(1.0))),
    "nested": lambda: _module(relay.less(relay.const(1.0), relay.const(2.0)), nested=True),
    "runtime": lambda: _module(relay.less(relay.sum(Y), relay.const(1.0))),
}


@pytest.mark.parametrize("policy,stock", [("default", {}), ("fold-qnn", {"fold_qnn": True})])
@pytest.mark.parametrize("name", sorted(CASES))
def test_computed_condition_folds_like_stock(name: str, policy: str, stock: dict) -> None:
    mod = CASES[name]()
    expected = relay.transform.FoldConstant(**stock)(CASES[name]())
    tvm.ir.assert_structural_equal(fgr.FoldConstant(policy)(mod), expected, map_free_vars=True)


def test_reader_of_a_true_branch_folds_into_one_constant() -> None:
    result = fgr.fold(CASES["true"]())
    body = result.mod["main"].body
    assert isinstance(body, relay.Constant)
    np.testing.assert_array_equal(
        body.data.numpy(),
        relay.create_executor("debug", mod=tvm.IRModule(), target="llvm -mtriple=x86_64-linux-gnu")
        .evaluate(relay.add(relay.exp(relay.const(W)), relay.const(W)))
        .numpy(),
    )
    # the plan is the final one: the add that reads the If folded
    assert [d.op for d in result.plan.folded][-1] == "add"


def test_false_branch_reader_stays_with_its_reason() -> None:
    result = fgr.fold(CASES["false"]())
    add = next(d for d in result.plan.decisions if d.op == "add")
    assert add.reason is Reason.NOT_CONSTANT and "x" in add.detail
