"""Guarantee 7 on Relay: a call whose kernel would compute from memory nobody wrote is never folded;
everything else is guarantee 1 (RFC.md). And a hand barrier over a weight parameter holds.

Relay lowers each op through its TE compute. ``resize2d`` or ``take`` of an empty tensor reads
outside it, and stock folds whatever lies there::

    %0 = image.resize2d(<f32[1, 1, 0, 0]>, size=[2, 2])   stock: bytes from anywhere
                                                         ==> kept (depends on unwritten memory)

A reduction over an empty axis is *not* such a call here, unlike Relax: TE's schedule writes
the reduction's initial value before the loop, so ``max`` gives the lowest float, as stock does.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import fold_guard.relay as fgr
from fold_guard import Reason


def _module(body: relay.Expr) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([], body)))


def _zeros(shape, dtype="float32") -> relay.Constant:
    return relay.const(np.zeros(shape, dtype))


UNWRITTEN = {
    "resize of an empty image": lambda: relay.image.resize2d(_zeros((1, 1, 0, 0)), size=(2, 2)),
    "take from an empty tensor": lambda: relay.take(
        _zeros((0, 3)), relay.const(np.array([0, 1], "int32")), axis=0
    ),
}


@pytest.mark.parametrize("name", sorted(UNWRITTEN))
def test_a_call_that_would_read_unwritten_memory_is_never_folded(name):
    mod = _module(UNWRITTEN[name]())
    stock = relay.transform.FoldConstant()(mod)
    assert isinstance(stock["main"].body, relay.Constant)  # stock folds it
    result = fgr.fold(mod)
    (decision,) = result.plan.decisions
    assert decision.reason is Reason.UNWRITTEN_MEMORY, result.plan.explain()
    assert "zero-size operand" in decision.detail
    assert tvm.ir.structural_equal(result.mod, mod)


WRITTEN = {
    "max over an empty axis": lambda: relay.max(_zeros((2, 0, 4)), axis=[1]),
    "concat with an empty part": lambda: relay.concatenate(
        [_zeros((0, 3)), relay.const(np.ones((2, 3), "float32"))], axis=0
    ),
    "pad of an empty tensor": lambda: relay.nn.pad(
        _zeros((0, 2)), pad_width=((1, 1), (0, 0)), pad_value=3.0
    ),
}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_zero_size_operand_whose_result_is_defined_folds_as_in_stock(name):
    mod = _module(WRITTEN[name]())
    result = fgr.fold(mod)
    assert [d.reason for d in result.plan.decisions] == [Reason.FOLDED]
    assert tvm.ir.structural_equal(result.mod, relay.transform.FoldConstant()(mod))


def test_a_hand_barrier_over_a_weight_parameter_holds_when_the_weights_are_bound():
    """Relay has no parameter lifting: weights passed as parameters are bound (``relay.build``'s
    ``params``, ``bind_params_by_name``) and folded. The barrier is stateful, so no stock pass
    evaluates it: the int8 weight reaches the dequantize as a constant."""
    x = relay.var("x", shape=(1, 4), dtype="float32")
    w = relay.var("w", shape=(4, 4), dtype="int8")
    weight = relay.qnn.op.dequantize(fgr.fold_barrier(w), relay.const(0.5), relay.const(0))
    mod = _module_with([x, w], relay.nn.dense(x, weight))
    bound = relay.build_module.bind_params_by_name(mod["main"], {"w": np.ones((4, 4), "int8")})
    folded = relay.transform.FoldConstant(fold_qnn=True)(tvm.IRModule.from_expr(bound))
    dequantize = folded["main"].body.args[1]
    assert dequantize.op.name == "qnn.dequantize"
    barrier = dequantize.args[0]
    assert barrier.op.name == "fold_barrier" and isinstance(barrier.args[0], relay.Constant)
    assert barrier.args[0].data.dtype == "int8"


def _module_with(params, body) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))
