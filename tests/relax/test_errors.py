"""Guarantee 6: bad input gets a clear fold_guard error naming the offending expression, and the
caller's module is never half-changed (compared with a ``tvm.ir.save_json`` copy taken before).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason

A = np.arange(4, dtype="float32")
B = np.full(4, 2.0, dtype="float32")


def _decision(result, label):
    (decision,) = [d for d in result.plan.decisions if d.label == label]
    return decision


class _Unchanged:
    """``with _Unchanged(mod):`` asserts that the block leaves ``mod`` exactly as it was."""

    def __init__(self, mod):
        self.mod = mod
        self.saved = tvm.ir.save_json(mod)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        assert tvm.ir.save_json(self.mod) == self.saved, "the caller's module was changed"
        return False


# -------------------------------------------------------------------------- not an IRModule


def _function():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(A)))
        bb.emit_func_output(y)
    return bb.get()["main"]


@pytest.mark.parametrize(
    "obj, type_name",
    [(_function(), "Function"), ("def main(): ...", "str"), (None, "NoneType")],
    ids=["relax.Function", "str", "None"],
)
@pytest.mark.parametrize("entry", ["fold", "plan"])
def test_not_an_irmodule(obj, type_name, entry):
    call = fgr.fold if entry == "fold" else fgr.plan
    with pytest.raises(fold_guard.UnsupportedIRError, match=f"got {type_name}") as info:
        call(obj)
    assert "tvm.IRModule({'main': func})" in str(info.value)  # the hint
    assert isinstance(info.value, TypeError)


def test_not_an_irmodule_through_the_pass():
    """The Pass form never reaches fold_guard: TVM's RunPass rejects the argument itself.

    The error is a plain TypeError from TVM's FFI (clear, but not UnsupportedIRError).
    """
    with pytest.raises(
        TypeError, match=r"Expected `RValueRef<ir\.IRModule>` but got `relax\.expr\.Function`"
    ):
        fgr.FoldConstant()(_function())


# ------------------------------------------------------------ annotation op with two operands


def test_builder_refuses_two_operand_annotation():
    c = relax.const(A)
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with pytest.raises(
        Exception, match=r"relax.fold_barrier takes exactly one operand, got 2"
    ) as info:
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit(relax.Call(tvm.ir.Op.get("relax.fold_barrier"), [c, c]))
    # The FInferType error crosses TVM's FFI, which turns it into a RuntimeError; the hint stays.
    assert "fold_guard.relax.fold_barrier(expr)" in str(info.value)


def test_unnormalized_two_operand_annotation_is_rejected():
    """Built without the normalizer: fold_guard rejects it, naming function and variable."""
    c = relax.const(A)
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    b = relax.Var("b", relax.TensorType((4,), "float32"))
    y = relax.Var("y", relax.TensorType((4,), "float32"))
    call = relax.Call(tvm.ir.Op.get("relax.fold_barrier"), [c, c])
    block = relax.BindingBlock([relax.VarBinding(b, call), relax.VarBinding(y, relax.op.add(x, b))])
    func = relax.Function([x], relax.SeqExpr([block], y), relax.TensorType((4,), "float32"))
    mod = tvm.IRModule({"encoder": func})
    with _Unchanged(mod):
        for entry in (fgr.fold, fgr.plan):
            with pytest.raises(
                fold_guard.UnsupportedIRError,
                match=r"function encoder: b = relax.fold_barrier has 2 operands",
            ):
                entry(mod)


def test_annotating_a_non_expression():
    with pytest.raises(
        fold_guard.UnsupportedIRError, match=r"fold_barrier expects a Relax expression, got ndarray"
    ):
        fgr.fold_barrier(A)
    with pytest.raises(
        fold_guard.UnsupportedIRError, match=r"fold_allow expects a Relax expression, got int"
    ):
        fgr.fold_allow(3)


# ------------------------------------------------------------------------------ unknown policy


def test_unknown_policy():
    with pytest.raises(
        fold_guard.UnknownPolicyError,
        match=r"unknown fold policy 'npu'; registered policies: default, fold-qnn, "
        r"keep-low-precision-weights, keep-qdq-weights, keep-requantize, qdq-accelerator, "
        r"size-guard, weights-only",
    ):
        fgr.FoldConstant("npu")


# ------------------------------------------------------------------------ conflicting annotations


@I.ir_module
class Conflict:
    @R.function
    def encoder(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.add(R.const(A), R.const(B))
            wb = R.fold_barrier(a)
            wa = R.fold_allow(wb)
            y = R.add(x, wa)
            R.output(y)
        return y


def test_conflicting_annotations_named_and_module_unchanged():
    with _Unchanged(Conflict):
        with pytest.raises(fold_guard.ConflictingAnnotationsError) as info:
            fgr.fold(Conflict, policy="keep-qdq-weights")
    message = str(info.value)
    assert "in encoder: wa = fold_allow(wb)" in message
    assert "fold_barrier(fold_allow(x))" in message  # the hint
    assert isinstance(info.value, fold_guard.PreconditionError)


# -------------------------------------------------------------------------------- dynamic shape


@I.ir_module
class AllowDynamic:
    @R.function
    def main(x: R.Tensor(("n",), "float32")) -> R.Tensor(("n",), "float32"):
        n = T.int64()
        with R.dataflow():
            z = R.zeros(
                R.shape([n]), "float32"
            )  # kept: dynamic shape (n is only known at run time)
            a = R.fold_allow(z)  # kept: its operand cannot be evaluated
            y = R.add(x, a)  # kept: run-time input
            R.output(y)
        return y


@I.ir_module
class AllowUnsupported:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            z = R.cumsum(R.const(A), axis=0)  # kept: unsupported (cumsum has no FLegalize in 0.27)
            a = R.fold_allow(z)  # kept: its operand cannot be evaluated
            y = R.add(x, a)  # kept: run-time input
            R.output(y)
        return y


CANNOT_EVALUATE = [
    (AllowDynamic, Reason.DYNAMIC_SHAPE, "symbolic dims"),
    (AllowUnsupported, Reason.UNSUPPORTED, "FLegalize"),
]
CANNOT_EVALUATE_IDS = ["dynamic-shape", "unsupported"]


@pytest.mark.parametrize("mod, reason, detail", CANNOT_EVALUATE, ids=CANNOT_EVALUATE_IDS)
def test_allow_over_unevaluable_operand_non_strict(mod, reason, detail):
    with _Unchanged(mod):
        result = fgr.fold(mod)
    tvm.ir.assert_structural_equal(result.mod, mod)
    assert not result.modified
    producer = _decision(result, "z")
    assert producer.reason is reason and detail in producer.detail
    assert _decision(result, "a").action is fold_guard.Action.KEEP


@pytest.mark.parametrize("mod, reason, detail", CANNOT_EVALUATE, ids=CANNOT_EVALUATE_IDS)
def test_allow_over_unevaluable_operand_reports_cause(mod, reason, detail):
    assert _decision(fgr.fold(mod), "a").reason is reason


@pytest.mark.parametrize("mod, reason, detail", CANNOT_EVALUATE, ids=CANNOT_EVALUATE_IDS)
def test_allow_over_unevaluable_operand_strict(mod, reason, detail):
    with _Unchanged(mod):
        with pytest.raises(
            fold_guard.FoldNotPossibleError,
            match=r"function main: a = fold_allow\(\.\.\.\) cannot fold",
        ) as info:
            fgr.fold(mod, strict=True)
    assert "operand z cannot fold" in str(info.value)


@pytest.mark.parametrize("mod, reason, detail", CANNOT_EVALUATE, ids=CANNOT_EVALUATE_IDS)
def test_allow_over_unevaluable_operand_strict_says_why(mod, reason, detail):
    with pytest.raises(fold_guard.FoldNotPossibleError) as info:
        fgr.fold(mod, strict=True)
    assert reason.text in str(info.value) and detail in str(info.value)


# ----------------------------------------------------------------------------- evaluation fails


@I.ir_module
class EvalFails:
    @T.prim_func(private=True)
    def boom(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.Assert(a[0] > T.float32(100), "boom: first element too small")
        for i in range(4):
            b[i] = a[i]

    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        cls = EvalFails
        with R.dataflow():
            # kept: evaluation fails at run time of the kernel (the assert)
            c = R.call_tir(cls.boom, (R.const(A),), out_ty=R.Tensor((4,), "float32"))
            y = R.add(x, c)  # kept: run-time input
            R.output(y)
        return y


def test_evaluation_failure_non_strict_keeps_the_call():
    with _Unchanged(EvalFails):
        result = fgr.fold(EvalFails)
    tvm.ir.assert_structural_equal(result.mod, EvalFails)
    decision = _decision(result, "c")
    assert decision.reason is Reason.EVAL_FAILED
    assert "boom: first element too small" in decision.detail


def test_evaluation_failure_strict_raises_chained():
    with _Unchanged(EvalFails):
        with pytest.raises(
            fold_guard.FoldNotPossibleError,
            match=r"function main: evaluating c = relax.call_tir failed",
        ) as info:
            fgr.fold(EvalFails, strict=True)
    assert "boom: first element too small" in str(info.value)
    assert "strict=False" in str(info.value)  # the hint


def test_evaluation_failure_strict_keeps_the_original_exception():
    with pytest.raises(fold_guard.FoldNotPossibleError) as info:
        fgr.fold(EvalFails, strict=True)
    # STYLE item 8: strict re-raises chained, so the kernel's own exception is kept.
    assert info.value.__cause__ is not None
    assert "boom: first element too small" in str(info.value.__cause__)


# ------------------------------------------------------------------------------- TVM version


@pytest.mark.parametrize("version", ["0.19.0", "0.28.0.dev0", "1.0.0", "nightly"])
def test_unknown_tvm_version(version):
    with pytest.raises(fold_guard.UnsupportedIRError) as info:
        fgr._compat.check_tvm_version(version)
    message = str(info.value)
    assert f"tvm {version} is installed" in message
    assert "0.27.x" in message
    assert "pip install 'apache-tvm==0.27.0.post1' 'apache-tvm-ffi==0.1.14.post1'" in message


def test_installed_tvm_version_is_supported():
    fgr._compat.check_tvm_version()
    fgr._compat.check_tvm_version("0.27.0.post1")
