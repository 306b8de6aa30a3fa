"""The catalogue of bad and unusual input (RFC.md, guarantee 6), one parametrised test.

Every kind either raises a fold_guard error of the stated class whose message names the
offending expression or argument, or (unusual but valid input: NaN, every dtype) folds as the
stock pass folds it. In every case the caller's module is byte-for-byte what it was
(``tvm.ir.save_json`` before and after). The kinds both IRs share are
:func:`support.ir_harness.common_kinds`; this file adds Relax's own. RFC.md ("Errors and bad
input") has it as a condensed table.
"""

from __future__ import annotations

from typing import Dict

import pytest
import tvm
from harness_relax import RELAX
from support.ir_harness import Kind, check_kind, common_kinds, exp_module
from test_errors import AllowDynamic, AllowUnsupported, EvalFails
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard
import fold_guard.relax as fgr

A = RELAX.catalogue_constant


def _exp_module() -> tvm.IRModule:
    return exp_module(RELAX)


def _raw(bindings, ret_var, ret_ty, params=()) -> tvm.IRModule:
    """A module built without the normalizer (the shape hostile builders produce)."""
    func = relax.Function(
        list(params), relax.SeqExpr([relax.BindingBlock(bindings)], ret_var), ret_ty
    )
    return tvm.IRModule({"main": func})


def _annotation_over_shape() -> tvm.IRModule:
    s = relax.Var("s", relax.ShapeType([4]))
    return _raw(
        [
            relax.VarBinding(
                s, relax.Call(tvm.ir.Op.get("relax.fold_barrier"), [relax.ShapeExpr([4])])
            )
        ],
        s,
        relax.ShapeType([4]),
    )


def _two_operand_annotation() -> tvm.IRModule:
    c = relax.const(A)
    b = relax.Var("b", relax.TensorType((4,), "float32"))
    return _raw(
        [relax.VarBinding(b, relax.Call(tvm.ir.Op.get("relax.fold_allow"), [c, c]))],
        b,
        relax.TensorType((4,), "float32"),
    )


def _unnormalized() -> tvm.IRModule:
    lv = relax.Var("lv", relax.TensorType((4,), "float32"))
    return _raw(
        [relax.VarBinding(lv, relax.op.exp(relax.const(A)))], lv, relax.TensorType((4,), "float32")
    )


@I.ir_module
class Conflicting:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            b = R.fold_barrier(R.exp(R.const(A)))
            a = R.fold_allow(b)
            y = R.add(x, a)
            R.output(y)
        return y


@I.ir_module
class AllowRuntime:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(x)
            a = R.fold_allow(e)
            R.output(a)
        return a


@I.ir_module
class AllowImpure:
    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        p = R.call_packed("testing.echo", R.const(A), ty_args=R.Tensor((4,), "float32"))
        a = R.fold_allow(p)
        y = R.add(x, a)
        return y


def _not_well_formed() -> tvm.IRModule:
    """``y`` is used in a second function where it is not defined."""
    mod = _exp_module()
    y = mod["main"].body.body
    other = relax.Function([], relax.SeqExpr([], y), relax.TensorType((4,), "float32"))
    return tvm.IRModule({"main": mod["main"], "other": other})


FOLD = lambda mod: fgr.fold(mod)  # noqa: E731
STRICT = lambda mod: fgr.fold(mod, strict=True)  # noqa: E731

#: Relax's own kinds; :func:`common_kinds` adds those both IRs have (not a module, unknown
#: policy, annotating a non-expression, nested annotations, NaN, every dtype, the policies).
KINDS: Dict[str, Kind] = {
    # not a module at all
    "not-a-module-ndarray": Kind(lambda: A, FOLD, fold_guard.UnsupportedIRError, r"got ndarray"),
    # policies
    "misspelt-policy": Kind(
        _exp_module,
        lambda m: fgr.fold(m, policy="keep-qdq-weight"),
        fold_guard.UnknownPolicyError,
        r"'keep-qdq-weight'; did you mean 'keep-qdq-weights'\?",
    ),
    "misspelt-policy-in-pass": Kind(
        _exp_module,
        lambda m: fgr.FoldConstant("Default")(m),
        fold_guard.UnknownPolicyError,
        r"'Default'; did you mean 'default'\?",
    ),
    "misspelt-policy-in-list": Kind(
        _exp_module,
        lambda m: fgr.plan(m, ["default", "size-gaurd"]),
        fold_guard.UnknownPolicyError,
        r"'size-gaurd'; did you mean 'size-guard'\?",
    ),
    "policy-of-wrong-type": Kind(
        _exp_module,
        lambda m: fgr.fold(m, policy=42),
        fold_guard.PreconditionError,
        r"policy must be .*, got 42",
    ),
    "budget-as-str": Kind(
        _exp_module,
        lambda m: fgr.FoldConstant(max_fold_bytes="1G")(m),
        fold_guard.PreconditionError,
        r"max_fold_bytes must be a byte count .* got str '1G'",
    ),
    # annotations
    "conflicting-annotations": Kind(
        lambda: Conflicting,
        FOLD,
        fold_guard.ConflictingAnnotationsError,
        r"conflicting annotations in main: a = fold_allow\(b\) where b = fold_barrier",
    ),
    "annotation-over-shape": Kind(
        _annotation_over_shape,
        FOLD,
        fold_guard.UnsupportedIRError,
        r"function main: s = fold_barrier annotates tensors only, but its operand R.shape\(\[4\]\) is a ShapeType",
    ),
    "annotation-two-operands": Kind(
        _two_operand_annotation,
        lambda m: fgr.plan(m),
        fold_guard.UnsupportedIRError,
        r"function main: b = relax.fold_allow has 2 operands, expected 1",
    ),
    # strict: what cannot fold is an error naming the allow and the cause
    "allow-over-non-constant-strict": Kind(
        lambda: AllowRuntime,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: a = fold_allow\(\.\.\.\) cannot fold: not constant: input e is not constant",
    ),
    "allow-over-dynamic-shape-strict": Kind(
        lambda: AllowDynamic,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: a = fold_allow\(\.\.\.\) cannot fold: dynamic shape: operand z cannot fold",
    ),
    "allow-over-impure-or-opaque-strict": Kind(
        lambda: AllowImpure,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: a = fold_allow\(\.\.\.\) cannot fold: (impure|unsupported): operand p cannot fold",
    ),
    "allow-over-unsupported-strict": Kind(
        lambda: AllowUnsupported,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"a = fold_allow\(\.\.\.\) cannot fold: unsupported: operand z cannot fold.*FLegalize",
    ),
    "not-well-formed-strict": Kind(
        _not_well_formed,
        STRICT,
        fold_guard.PreconditionError,
        r"the input module is not well formed.*relax.analysis.well_formed",
    ),
    # structure
    "not-normalized": Kind(
        _unnormalized,
        FOLD,
        fold_guard.PreconditionError,
        r"function main: lv = relax.exp\(\.\.\.\) has no type yet.*Normalize",
    ),
    "evaluation-fails-strict": Kind(
        lambda: EvalFails,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: evaluating c = relax.call_tir failed: .*boom: first element too small",
    ),
}
KINDS.update(common_kinds(RELAX))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_input(kind):
    check_kind(KINDS[kind])
