"""The intended differences from stock, and nothing else (RFC.md, guarantee 7).

1. Where stock raises on a call (its legalizer or kernel fails), fold_guard keeps that call with
   the reason and folds the rest of the module::

       lv = max(<bool const>, axis=0)     stock: "Cannot decide min_value for type bool"
       gv = exp(<const>)                  ==> lv kept (unsupported), gv folded

2. Where a call's kernel would compute from memory nobody wrote, fold_guard keeps it; stock folds
   those bytes::

       gv = max(<f32[2, 0, 4]>, axis=1)   the reduction's init never runs: stock's constant is
                                          whatever the buffer held; ==> kept (unwritten memory)
       gv = take(<f32[0, 3]>, idx)        every read lies outside the empty tensor ==> kept

   A call with a zero-size operand that its kernel never reads, or reads only in a branch that
   never runs, folds as in stock (``concat`` with an empty part, ``pad`` of an empty tensor).

3. Where stock's legalization leaves dead, ill-formed bindings behind, fold_guard returns the
   call untouched::

       gv = dynamic_strided_slice(x, begin, end, strides)   begin / end known only at run time
       stock: lv = call_tir(shape_func, ...)   a PrimFunc it never adds to the module, then
              lv1 = tensor_to_shape(lv); match_cast(lv1, ...)   check_well_formed fails
       ==> unchanged
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Action, Reason


def _module(*make_calls) -> tvm.IRModule:
    """``main()`` binding each call in turn (each maker gets the variables so far)."""
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            bound = []
            for make in make_calls[:-1]:
                bound.append(bb.emit(make(*bound)))
            gv = bb.emit_output(make_calls[-1](*bound))
        bb.emit_func_output(gv)
    return bb.get()


def _const(shape, dtype="float32", fill=0.0):
    return relax.const(np.full(shape, fill, dtype))


# ----------------------------------------------------------------------- where stock raises

STOCK_RAISES = {
    "bool max": (lambda: relax.op.max(_const((2, 3), "bool", True), axis=[0]), "min_value"),
    "adaptive pool of an empty input": (
        lambda: relax.op.nn.adaptive_avg_pool2d(_const((1, 2, 0, 0)), output_size=(2, 2)),
        "Divide by zero",
    ),
}


@pytest.mark.parametrize("name", sorted(STOCK_RAISES))
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_a_call_stock_raises_on_is_kept_with_the_reason_and_the_rest_folds(name, reference):
    make, message = STOCK_RAISES[name]
    mod = _module(lambda: make(), lambda kept: relax.Tuple([kept, relax.op.exp(_const((2,)))]))
    with pytest.raises(Exception, match=message):
        relax.transform.FoldConstant()(mod)
    result = fgr.fold(mod, reference_engine=reference)
    kept, exp = result.plan.decisions
    assert kept.action is Action.KEEP and message in kept.detail, result.plan.explain()
    assert exp.reason is Reason.FOLDED
    assert relax.analysis.check_well_formed(result.mod)


# ----------------------------------------------------------------- memory nobody wrote

UNWRITTEN = {
    "max over an empty axis": lambda: relax.op.max(_const((2, 0, 4)), axis=[1]),
    "argmax over an empty axis": lambda: relax.op.argmax(_const((2, 0, 4)), axis=1),
    "conv2d of no channels": lambda: relax.op.nn.conv2d(_const((1, 0, 4, 4)), _const((2, 0, 3, 3))),
    "take from an empty tensor": lambda: relax.op.take(
        _const((0, 3)), relax.const(np.array([0, 1], "int64")), axis=0
    ),
    "resize of an empty image": lambda: relax.op.image.resize2d(_const((1, 1, 0, 0)), size=(2, 2)),
}


@pytest.mark.parametrize("name", sorted(UNWRITTEN))
def test_a_call_that_would_read_unwritten_memory_is_never_folded(name):
    mod = _module(UNWRITTEN[name])
    stock = relax.transform.FoldConstant()(mod)
    assert isinstance(stock["main"].body.body, fold_guard.relax._compat.Constant)  # stock folds
    result = fgr.fold(mod)
    (decision,) = result.plan.decisions
    assert decision.reason is Reason.UNWRITTEN_MEMORY, result.plan.explain()
    assert "zero-size" in decision.detail
    tvm.ir.assert_structural_equal(result.mod, mod)  # kept as it was
    assert not result.modified


def test_fold_allow_cannot_make_it_fold():
    mod = _module(lambda: fgr.fold_allow(UNWRITTEN["max over an empty axis"]()))
    result = fgr.fold(mod)
    assert [d.reason for d in result.plan.decisions] == [Reason.UNWRITTEN_MEMORY] * 2
    with pytest.raises(fold_guard.FoldNotPossibleError, match="unwritten memory"):
        fgr.fold(mod, strict=True)


WRITTEN = {
    "concat with an empty part": lambda: relax.op.concat(
        [_const((0, 3)), _const((2, 3), fill=1.0)], axis=0
    ),
    "pad of an empty tensor": lambda: relax.op.nn.pad(
        _const((0, 2)), pad_width=[1, 1, 0, 0], pad_value=3.0
    ),
    "matmul over k = 0": lambda: relax.op.matmul(_const((2, 0)), _const((0, 3))),
    "broadcast of an empty tensor": lambda: relax.op.broadcast_to(_const((0,)), (2, 0)),
}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_zero_size_operand_the_kernel_never_reads_folds_as_in_stock(name):
    mod = _module(WRITTEN[name])
    result = fgr.fold(mod)
    assert [d.reason for d in result.plan.decisions] == [Reason.FOLDED]
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


# ------------------------------------------------- dead bindings stock's legalizer leaves


def _dynamic_slice(data_is_constant: bool) -> tvm.IRModule:
    """``main(x, b, e)``: a slice of ``x`` (or of a constant) between run-time bounds."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((10, 8), "float32"))
    begin = relax.Var("b", relax.TensorType((2,), "int64"))
    end = relax.Var("e", relax.TensorType((2,), "int64"))
    data = _const((10, 8), fill=2.0) if data_is_constant else x
    strides = relax.const(np.array([1, 1], "int64"), "int64")
    with bb.function("main", [x, begin, end]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.dynamic_strided_slice(data, begin, end, strides))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("data_is_constant", [False, True], ids=["run-time data", "constant data"])
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_a_slice_on_run_time_bounds_is_returned_untouched(data_is_constant, reference):
    mod = _dynamic_slice(data_is_constant)
    stock = relax.transform.FoldConstant()(mod)
    assert not relax.analysis.check_well_formed(stock)  # stock: a call_tir of a missing shape_func
    assert "shape_func" in stock.script()
    assert "shape_func" not in [gvar.name_hint for gvar in stock.get_global_vars()]
    result = fgr.fold(mod, reference_engine=reference, strict=True)  # strict checks well-formedness
    tvm.ir.assert_structural_equal(result.mod, mod)
    assert relax.analysis.check_well_formed(result.mod)
    (decision,) = result.plan.decisions
    assert decision.reason is Reason.NOT_CONSTANT, decision
