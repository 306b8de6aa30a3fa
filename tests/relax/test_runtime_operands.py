"""Calls on run-time operands whose legalized kernel reads only constants (RFC.md, guarantee 1).

The stock pass legalizes every call of a dataflow block, whatever its operands, and folds where
the ``call_tir`` that comes out has only constant arguments. A legalizer that needs only an
operand's static type leaves it out of the kernel's arguments, so stock folds such a call on a
run-time tensor and drops what only it read::

    x: R.Tensor((4, 4))                       run-time
    z = R.full_like(x, 0.0)                   kernel full(): no argument    ==> folds
    lv = R.exp(x)                             reads x                       ==> dropped (unused)
    e = R.zeros_like(lv)                      kernel zeros(): no argument   ==> folds
    y = R.add(x, R.add(z, e))                 reads x                       ==> stays

fold_guard finds the family by that mechanism (which leaves the kernel reads), not by op name:
each case here is a Before / Expected pair checked against fold_guard on both engines and
against the stock pass itself, and the report says why a call on a run-time value folded.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import check_before_after
from hypothesis import given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr
from fold_guard import Action, Reason

C = np.arange(8, dtype="float32").reshape(2, 4)
W_INT8 = (np.arange(16, dtype="int8") - 8).reshape(4, 4)

ENGINES = pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])


def _passes(reference: bool):
    """fold_guard's pass on the chosen engine, then the stock pass: both must give Expected."""
    return [fgr.FoldConstant(reference_engine=reference), relax.transform.FoldConstant()]


# ------------------------------------------------------------------ folds, as in stock


@I.ir_module
class FullLike:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            z = R.full_like(x, R.const(1.5, "float32"))  # folds: full() takes no argument
            y = R.add(x, z)  # stays: reads x
            R.output(y)
        return y


@I.ir_module
class FullLikeExpected:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            y = R.add(x, R.const(np.full((4, 4), 1.5, "float32")))
            R.output(y)
        return y


@I.ir_module
class ZerosLikeOfExp:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            lv = R.exp(x)  # not constant; dropped once nothing reads it
            e = R.zeros_like(lv)  # folds: reads only lv's shape
            y = R.add(x, e)  # stays
            R.output(y)
        return y


@I.ir_module
class ZerosLikeOfExpExpected:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            y = R.add(x, R.const(np.zeros((4, 4), "float32")))
            R.output(y)
        return y


@I.ir_module
class OnesEyeAndCollapse:
    @R.function
    def main(x: R.Tensor((3, 3), "float32"), y: R.Tensor((1, 4), "float32")) -> R.Tuple(
        R.Tensor((3, 3), "float32"), R.Tensor((1, 4), "float32")
    ):
        with R.dataflow():
            o = R.ones_like(x)  # folds
            i = R.eye_like(x, 1)  # folds: the diagonal's offset is an attribute
            m = R.multiply(o, i)  # folds: both inputs fold
            s = R.collapse_sum_like(R.const(C), y)  # folds: reads C, and y's shape only
            a = R.add(x, m)  # stays
            b = R.add(y, s)  # stays
            R.output(a, b)
        return (a, b)


@I.ir_module
class OnesEyeAndCollapseExpected:
    @R.function
    def main(x: R.Tensor((3, 3), "float32"), y: R.Tensor((1, 4), "float32")) -> R.Tuple(
        R.Tensor((3, 3), "float32"), R.Tensor((1, 4), "float32")
    ):
        with R.dataflow():
            a = R.add(x, R.const(np.eye(3, k=1, dtype="float32")))
            b = R.add(y, R.const(C.sum(axis=0, keepdims=True)))
            R.output(a, b)
        return (a, b)


FOLDS = {
    "full_like": (FullLike, FullLikeExpected),
    "zeros_like of exp": (ZerosLikeOfExp, ZerosLikeOfExpExpected),
    "ones_like, eye_like, collapse_sum_like": (OnesEyeAndCollapse, OnesEyeAndCollapseExpected),
}


@pytest.mark.parametrize("name", sorted(FOLDS))
@ENGINES
def test_a_kernel_that_reads_only_constants_folds_as_in_stock(name, reference):
    before, expected = FOLDS[name]
    for transform in _passes(reference):
        tvm.ir.assert_structural_equal(transform(before), expected)
    check_before_after(before, expected, fgr.FoldConstant(reference_engine=reference))


def test_the_report_says_the_kernel_reads_only_the_shape():
    result = fgr.fold(ZerosLikeOfExp)
    by_label = {d.label: d for d in result.plan.decisions}
    assert by_label["e"].action is Action.FOLD
    assert by_label["e"].detail == "the kernel reads only lv's shape"
    assert by_label["lv"].reason is Reason.NOT_CONSTANT  # exp is not evaluated, only dropped
    full = {d.label: d for d in fgr.fold(FullLike).plan.decisions}["z"]
    assert full.detail == "the kernel reads only x's shape", full


def test_the_folded_module_runs_as_the_unfolded_one():
    x = np.arange(16, dtype="float32").reshape(4, 4)
    outputs = []
    for mod in (ZerosLikeOfExp, fgr.FoldConstant()(ZerosLikeOfExp)):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])


# ------------------------------------------------------- the parameter path and annotations


@I.ir_module
class ZerosLikeOfWeight:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor(
        (4, 4), "float32"
    ):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            z = R.zeros_like(w)  # folds: stock FoldConstant does not wait for the lifting
            y = R.add(R.add(x, w), z)
            R.output(y)
        return y


@I.ir_module
class ZerosLikeOfWeightExpected:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor(
        (4, 4), "float32"
    ):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            lv = R.add(x, w)
            y = R.add(lv, R.const(np.zeros((4, 4), "float32")))
            R.output(y)
        return y


@ENGINES
def test_a_weight_parameter_whose_value_is_not_read_does_not_wait_for_the_lifting(reference):
    for transform in _passes(reference):
        tvm.ir.assert_structural_equal(transform(ZerosLikeOfWeight), ZerosLikeOfWeightExpected)
    decisions = fgr.fold(ZerosLikeOfWeight).plan.decisions
    assert [d.action for d in decisions if d.label == "z"] == [Action.FOLD]


@I.ir_module
class ZerosLikeOfBarrier:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            b = R.fold_barrier(R.const(np.ones(4, "float32")))  # kept: a barrier
            z = R.zeros_like(b)  # kept: nothing folds across a barrier, its type included
            y = R.add(x, z)
            R.output(y)
        return y


def test_nothing_folds_across_a_barrier_even_a_read_of_its_shape():
    result = fgr.fold(ZerosLikeOfBarrier)
    tvm.ir.assert_structural_equal(result.mod, ZerosLikeOfBarrier)
    z = {d.label: d for d in result.plan.decisions}["z"]
    assert z.reason is Reason.KEPT_BY_BARRIER, z


@I.ir_module
class AllowOverZerosLikeOfDequantize:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            w = R.dequantize(
                R.const(W_INT8), R.const(0.5, "float32"), R.const(0, "int8"), axis=0
            )  # kept by keep-qdq-weights: the allow below reads only its shape
            z = R.fold_allow(R.zeros_like(w))  # folds
            m = R.matmul(x, w)
            y = R.add(m, z)
            R.output(y)
        return y


@I.ir_module
class AllowOverZerosLikeOfDequantizeExpected:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            w = R.dequantize(R.const(W_INT8), R.const(0.5, "float32"), R.const(0, "int8"), axis=0)
            m = R.matmul(x, w)
            y = R.add(m, R.const(np.zeros((4, 4), "float32")))
            R.output(y)
        return y


def test_an_allow_does_not_reach_through_a_read_of_a_shape():
    """The allowed cone follows values: ``zeros_like(w)`` does not ask for ``w`` to fold."""
    check_before_after(
        AllowOverZerosLikeOfDequantize,
        AllowOverZerosLikeOfDequantizeExpected,
        fgr.FoldConstant("keep-qdq-weights"),
    )


# ------------------------------------------------------------- unchanged, as in stock


@I.ir_module
class SymbolicShape:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")) -> R.Tensor(("n", 4), "float32"):
        with R.dataflow():
            z = R.zeros_like(x)  # kept: its result has a symbolic dim
            y = R.add(x, z)
            R.output(y)
        return y


@I.ir_module
class OutsideDataflow:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        z = R.zeros_like(x)  # kept: operators fold only inside dataflow blocks
        y = R.add(x, z)
        return y


@pytest.mark.parametrize(
    "before", [SymbolicShape, OutsideDataflow], ids=["symbolic", "no dataflow"]
)
def test_unchanged_where_stock_leaves_it(before):
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(before), before)
    check_before_after(before, before, fgr.FoldConstant())


# ------------------------------------------------------- the zero-size stand-in's dtype


@I.ir_module
class PowerOfEmptyFloat64:
    """torch ``logspace`` with tensor bounds: ``10 ** <empty float64>``, folded by stock."""

    @R.function
    def main(x: R.Tensor((2,), "float64")) -> R.Tensor((2,), "float64"):
        with R.dataflow():
            e = R.exp(R.const(np.zeros((0,), "float64"), "float64"))  # folds to an empty f64
            p = R.power(R.const(10.0, "float64"), e)  # folds: its operand keeps its dtype
            y = R.add(x, R.sum(p))
            R.output(y)
        return y


@ENGINES
def test_a_zero_size_float64_value_keeps_its_dtype(reference):
    stock = relax.transform.FoldConstant()(PowerOfEmptyFloat64)
    result = fgr.fold(PowerOfEmptyFloat64, reference_engine=reference)
    assert tvm_ffi.structural_equal(result.mod, stock), result.plan.explain()
    assert [d.action for d in result.plan.decisions][:3] == [Action.FOLD] * 3


# ------------------------------------------------------------ a property over compositions

#: Calls on the run-time ``x`` (or on what the last of them computed): their kernels read it.
_READING = {
    "exp": relax.op.exp,
    "negative": relax.op.negative,
    "add x": lambda v, x: relax.op.add(v, x),
    "sum keepdims": lambda v: relax.op.sum(v, axis=[1], keepdims=True),
}
#: Calls whose kernel reads only their run-time operand's shape (none read its value).
_SHAPE_ONLY = {
    "zeros_like": relax.op.zeros_like,
    "ones_like": relax.op.ones_like,
    "full_like": lambda v: relax.op.full_like(v, relax.const(2.5, "float32")),
    "eye_like": lambda v: relax.op.eye_like(v, 0),
    "collapse_sum_like": lambda v: relax.op.collapse_sum_like(
        relax.const(np.arange(12, dtype="float32").reshape(3, 4)), v
    ),
}


def _composition(reading, shape_only, consume) -> tvm.IRModule:
    """``main(x: f32[3, 4])``: ``reading`` calls on x in turn, a shape-only call on their
    result, and (``consume``) a call that adds x to it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            for name in reading:
                make = _READING[name]
                value = bb.emit(make(value, x) if name == "add x" else make(value))
            value = bb.emit(_SHAPE_ONLY[shape_only](value))
            if consume:
                value = bb.emit(relax.op.add(x, relax.op.broadcast_to(value, (3, 4))))
            gv = bb.emit_output(value)
        bb.emit_func_output(gv)
    return bb.get()


@settings(max_examples=examples(40), deadline=None)
@given(
    reading=st.lists(st.sampled_from(sorted(_READING)), max_size=3),
    shape_only=st.sampled_from(sorted(_SHAPE_ONLY)),
    consume=st.booleans(),
)
def test_default_equals_stock_on_compositions_with_run_time_operands(reading, shape_only, consume):
    """Guarantee 1 over random compositions: what only a shape-only call reads disappears with
    it, as in stock, and the rest stays."""
    mod = _composition(reading, shape_only, consume)
    stock = relax.transform.FoldConstant()(mod)
    result = fgr.fold(mod)
    assert tvm_ffi.structural_equal(result.mod, stock), (result.plan.explain(), stock)
    folded = [d for d in result.plan.folded if d.op.startswith("relax.") and "_like" in d.op]
    assert len(folded) == 1 and "reads only" in folded[0].detail, result.plan.explain()
