"""Reliability defects found by a hostile-input session (issue 11), one regression test each.

Each test failed on the code before its fix: the fix is named in the test's docstring.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason

from golden import CONSTANT_TYPE, op_calls


def _two_calls(make: Callable[[np.ndarray], relax.Expr], first: np.ndarray, second: np.ndarray) -> tvm.IRModule:
    """``main(x) = (make(first), make(second), x)``: two calls of one op signature, two shapes."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(make(first))
            b = bb.emit(make(second))
            out = bb.emit_output(relax.Tuple([a, b, x]))
        bb.emit_func_output(out)
    return bb.get()


def _constants(mod: tvm.IRModule) -> List[np.ndarray]:
    """The constants of ``main``'s output tuple, in order (folded bindings are inlined there)."""
    bindings = mod["main"].body.blocks[0].bindings
    fields = bindings[-1].value.fields
    return [field.value.numpy() for field in fields if isinstance(field, CONSTANT_TYPE)]


OUT_OF_RANGE = np.array([300, -300, np.nan, 1e30], "float32")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint32"])
def test_astype_float_to_int_out_of_range_matches_stock(dtype):
    """Two ``astype(float32 -> int)`` of different shapes shared one symbolic kernel, which gave
    ``[44, -44, 0, 0]`` where stock gives ``[127, -128, -128, -128]`` (the conversion is undefined
    in C/LLVM). Fixed: a float-to-integer astype always gets static kernels, as stock builds.
    """
    first, second = OUT_OF_RANGE, np.concatenate([OUT_OF_RANGE, [5.0]]).astype("float32")
    mod = _two_calls(lambda array: relax.op.astype(relax.const(array), dtype), first, second)
    ours, stock = fgr.fold(mod, strict=True).mod, relax.transform.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(ours, stock)
    for got, want in zip(_constants(ours), _constants(stock)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [relax.op.left_shift, relax.op.right_shift])
def test_shift_by_bit_width_matches_stock(op):
    """A shift by at least the bit width is undefined too: shared, ``1 << 40`` gave INT_MIN or 0
    per lane where stock gives ``256``. Fixed with the rule above (integer shifts, divisions and
    modulos are static)."""
    make = lambda array: op(relax.const(array), relax.const(np.full(array.shape, 40, "int32")))  # noqa: E731
    mod = _two_calls(make, np.arange(1, 5, dtype="int32"), np.arange(1, 8, dtype="int32"))
    ours, stock = fgr.fold(mod, strict=True).mod, relax.transform.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(ours, stock)


def test_float_astype_still_shares_a_kernel():
    """The rule is narrow: a float-to-float astype of two shapes still compiles one kernel."""
    make = lambda array: relax.op.astype(relax.const(array), "float16")  # noqa: E731
    mod = _two_calls(make, np.ones(4, "float32"), np.ones(7, "float32"))
    result = fgr.fold(mod, strict=True)
    assert result.report.kernels_compiled == 1
    tvm.ir.assert_structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def test_legalization_fallback_isolates_the_failing_call():
    """When the batched LegalizeOps fails (``mean`` over a zero-size axis divides by zero), the
    one-by-one fallback merged the per-call modules by name and lost their ``GlobalVar``s:
    ``InternalError: no definition of I.GlobalVar("tir_exp")``, blaming the innocent ``exp``.
    Fixed: each request keeps its own legalized module.

        exp(c)            ==> constant   (folds)
        mean(zeros(0, 3)) ==> kept       (unsupported: its legalizer fails)
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(relax.const(np.ones(3, "float32"))))
            m = bb.emit(relax.op.mean(relax.const(np.ones((0, 3), "float32")), axis=[0]))
            y = bb.emit_output(relax.op.add(relax.op.add(x, e), m))
        bb.emit_func_output(y)
    mod = bb.get()
    for plan in (fgr.plan(mod), fgr.fold(mod).plan):
        reasons = {d.op: d.reason for d in plan.decisions}
        assert reasons["relax.exp"] is Reason.FOLDED
        assert reasons["relax.mean"] is Reason.UNSUPPORTED
        (mean,) = [d for d in plan.decisions if d.op == "relax.mean"]
        assert "LegalizeOps failed" in mean.detail
    folded = fgr.fold(mod).mod
    assert not op_calls(folded, "relax.exp") and len(op_calls(folded, "relax.mean")) == 1
    (exp_value,) = [a for call in op_calls(folded, "relax.add") for a in call.args if isinstance(a, CONSTANT_TYPE)]
    np.testing.assert_allclose(exp_value.value.numpy(), np.exp(np.ones(3, "float32")), rtol=1e-6)


def _unnormalized_module() -> tvm.IRModule:
    """``main`` built from ``relax.Function`` around calls that were never normalized (no types)."""
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    lv = relax.Var("lv", relax.TensorType((3,), "float32"))
    gv = relax.Var("gv", relax.TensorType((3,), "float32"))
    block = relax.DataflowBlock([
        relax.VarBinding(lv, relax.op.exp(relax.const(np.ones(3, "float32")))),
        relax.VarBinding(gv, relax.op.add(x, lv)),
    ])  # fmt: skip
    func = relax.Function([x], relax.SeqExpr([block], gv), relax.TensorType((3,), "float32"))
    return tvm.IRModule({"main": func})


@pytest.mark.parametrize(
    "entry",
    [
        lambda mod: fgr.fold(mod),
        lambda mod: fgr.FoldConstant()(mod),
        lambda mod: fgr.plan(mod),
        lambda mod: fgr.annotate(mod, "size-guard"),
    ],
    ids=["fold", "FoldConstant", "plan", "annotate"],
)
def test_unnormalized_module_is_refused_and_untouched(entry):
    """``fold`` and ``FoldConstant`` wrote inferred types into the caller's un-normalized nodes.
    Fixed: every entry refuses such a module up front, naming the binding, and changes nothing."""
    mod = _unnormalized_module()
    saved = tvm.ir.save_json(mod)
    with pytest.raises(fold_guard.PreconditionError, match=r"function main: lv = relax.exp\(\.\.\.\) has no type yet.*Normalize"):
        entry(mod)
    assert tvm.ir.save_json(mod) == saved
    # Normalized, the same module folds as stock folds it.
    normalized = relax.transform.Normalize()(mod)
    assert tvm_ffi.structural_equal(fgr.fold(normalized).mod, relax.transform.FoldConstant()(normalized))
