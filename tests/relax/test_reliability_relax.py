"""Reliability defects found by a hostile-input review, one regression test each.

Each test failed on the code before its fix: the fix is named in the test's docstring.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import CONSTANT_TYPE, op_calls
from support.reliability import check_concurrent_like_sequential
from tvm import relax

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason


def _two_calls(
    make: Callable[[np.ndarray], relax.Expr], first: np.ndarray, second: np.ndarray
) -> tvm.IRModule:
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
    (exp_value,) = [
        a
        for call in op_calls(folded, "relax.add")
        for a in call.args
        if isinstance(a, CONSTANT_TYPE)
    ]
    np.testing.assert_allclose(exp_value.value.numpy(), np.exp(np.ones(3, "float32")), rtol=1e-6)


def _unnormalized_module() -> tvm.IRModule:
    """``main`` built from ``relax.Function`` around calls that were never normalized (no types)."""
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    lv = relax.Var("lv", relax.TensorType((3,), "float32"))
    gv = relax.Var("gv", relax.TensorType((3,), "float32"))
    block = relax.DataflowBlock(
        [
            relax.VarBinding(lv, relax.op.exp(relax.const(np.ones(3, "float32")))),
            relax.VarBinding(gv, relax.op.add(x, lv)),
        ]
    )
    func = relax.Function([x], relax.SeqExpr([block], gv), relax.TensorType((3,), "float32"))
    return tvm.IRModule({"main": func})


@pytest.mark.parametrize(
    "entry",
    [
        lambda mod: fgr.fold(mod),
        lambda mod: fgr.FoldConstant()(mod),
        lambda mod: fgr.plan(mod),
        lambda mod: fgr.annotate(mod, policy="size-guard"),
    ],
    ids=["fold", "FoldConstant", "plan", "annotate"],
)
def test_unnormalized_module_is_refused_and_untouched(entry):
    """``fold`` and ``FoldConstant`` wrote inferred types into the caller's un-normalized nodes.
    Fixed: every entry refuses such a module up front, naming the binding, and changes nothing."""
    mod = _unnormalized_module()
    saved = tvm.ir.save_json(mod)
    with pytest.raises(
        fold_guard.PreconditionError,
        match=r"function main: lv = relax.exp\(\.\.\.\) has no type yet.*Normalize",
    ):
        entry(mod)
    assert tvm.ir.save_json(mod) == saved
    # Normalized, the same module folds as stock folds it.
    normalized = relax.transform.Normalize()(mod)
    assert tvm_ffi.structural_equal(
        fgr.fold(normalized).mod, relax.transform.FoldConstant()(normalized)
    )


def _qdq_module(rows: int) -> tvm.IRModule:
    """``matmul(x, dequantize(quantize(W)))`` plus an exp: a few kernels, distinct per ``rows``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, rows), "float32"))
    weight = relax.const(np.linspace(-1, 1, rows * 4, dtype="float32").reshape(rows, 4))
    scale, zero = relax.const(np.float32(0.01)), relax.const(np.int8(0))
    with bb.function("main", [x]):
        with bb.dataflow():
            q = bb.emit(relax.op.quantize(weight, scale, zero, axis=0, out_dtype="int8"))
            w = bb.emit(relax.op.dequantize(q, scale, zero, axis=0, out_dtype="float32"))
            e = bb.emit(relax.op.exp(w))
            y = bb.emit_output(relax.op.matmul(x, e))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.slow
def test_eight_threads_fold_like_one():
    """Eight threads folding at once (four distinct modules, and one module shared by four
    threads) give the sequential results and no error. Before the fix they failed intermittently
    (``InternalError: no definition of I.GlobalVar("quantize")``, ``AssertionError``): TVM's
    BlockBuilder stack and TE op-tag scope are process-global. fold_guard now serialises its own
    TVM work behind one lock (fold_guard/_tvm/serial.py)."""
    distinct = [_qdq_module(rows) for rows in (3, 5, 6, 7)]
    entries = [
        lambda mod: fgr.fold(mod, policy="keep-qdq-weights").mod,
        lambda mod: fgr.FoldConstant()(mod),
        lambda mod: fgr.annotate(mod, policy="keep-qdq-weights").mod,
    ]
    check_concurrent_like_sequential(entries, distinct + [_qdq_module(9)] * 4, rounds=2)


def test_raising_policy_rule_through_the_pass_names_policy_rule_and_call():
    """Through the module pass, a raising predicate came back as a bare RuntimeError naming
    nothing; now it is a PolicyRuleError (registered with the FFI, so its class survives)."""
    rule = fold_guard.Rule("keep-exp", fold_guard.Action.KEEP, "exp stays", lambda call: 1 / 0)
    policy = fold_guard.FoldPolicy("my-npu", "a backend's policy", (rule,))
    mod = _qdq_module(3)
    saved = tvm.ir.save_json(mod)
    message = r"policy 'my-npu', rule 'keep-exp', on main: lv = relax.quantize: the predicate raised ZeroDivisionError"
    for entry in (
        lambda m: fgr.FoldConstant(policy)(m),
        lambda m: fgr.fold(m, policy=policy),
        lambda m: fgr.plan(m, policy),
    ):
        with pytest.raises(fold_guard.PolicyRuleError, match=message):
            entry(mod)
    assert tvm.ir.save_json(mod) == saved


def _local_function() -> relax.Function:
    p = relax.Var("p", relax.TensorType((2,), "float32"))
    return relax.Function([p], relax.SeqExpr([], p), relax.TensorType((2,), "float32"))


NON_TENSORS = {
    "shape": (lambda: relax.ShapeExpr([4]), "ShapeType"),
    "prim-value": (lambda: relax.prim_value(3), "PrimType"),
    "string": (lambda: tvm.ir.StringImm("s"), "StringType"),
    "tuple": (lambda: relax.Tuple([relax.const(np.ones(2, "float32"))]), "TupleType"),
    "local-function": (_local_function, "FuncType"),
}


@pytest.mark.parametrize("builder", [fgr.fold_barrier, fgr.fold_allow], ids=["barrier", "allow"])
@pytest.mark.parametrize("kind", sorted(NON_TENSORS))
def test_builders_refuse_annotations_on_non_tensors(builder, kind):
    """The builders accepted a shape, a PrimValue, a StringImm or a local function; then our pass
    raised IndexError on an allow over them, stock FoldConstant asserted on a barrier over a
    shape, and a barrier over a string did not build. Only tensors are supported now."""
    make, type_name = NON_TENSORS[kind]
    with pytest.raises(
        fold_guard.UnsupportedIRError,
        match=rf"fold_(barrier|allow) annotates tensors only, .* is a {type_name}",
    ):
        builder(make())


@pytest.mark.parametrize("op_name", ["relax.fold_barrier", "relax.fold_allow"])
def test_non_tensor_annotations_are_refused_by_type_inference_and_the_pass(op_name):
    """A raw ``relax.Call`` of the op gets the same error from the normalizer, and a module
    holding one (built without the normalizer) gets it from every entry, naming the binding."""
    annotation = relax.Call(tvm.ir.Op.get(op_name), [relax.ShapeExpr([4])])
    bb = relax.BlockBuilder()
    with pytest.raises(fold_guard.UnsupportedIRError, match="annotates tensors only"):
        with bb.function("main", []):
            bb.emit_func_output(bb.emit(annotation))
    s = relax.Var("s", relax.ShapeType([4]))
    func = relax.Function(
        [],
        relax.SeqExpr([relax.BindingBlock([relax.VarBinding(s, annotation)])], s),
        relax.ShapeType([4]),
    )
    mod = tvm.IRModule({"main": func})
    saved = tvm.ir.save_json(mod)
    for entry in (fgr.fold, fgr.plan, lambda m: fgr.FoldConstant()(m)):
        with pytest.raises(
            fold_guard.UnsupportedIRError,
            match=r"function main: s = fold_(barrier|allow) annotates tensors only, "
            r"but its operand R.shape\(\[4\]\) is a ShapeType",
        ):
            entry(mod)
    assert tvm.ir.save_json(mod) == saved


def _run_main(mod: tvm.IRModule, *inputs: np.ndarray) -> np.ndarray:
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _creation_module(op, shape, dtype) -> tvm.IRModule:
    """``main(x) = add(x, op(shape))``: a creation call with no operand at all."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            created = bb.emit(op(shape, dtype))
            y = bb.emit_output(relax.op.add(x, created))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize(
    "policy, op, shape, dtype",
    [
        ("weights-only", relax.op.zeros, (2, 3), "float32"),
        ("weights-only", relax.op.ones, (4,), "int32"),
        (
            "size-guard",
            relax.op.zeros,
            (512,),
            "float64",
        ),  # 4096 bytes, within stock's 1024 elements
    ],
    ids=["weights-only-zeros", "weights-only-ones", "size-guard-zeros"],
)
def test_annotate_carries_keeps_of_calls_without_operands(policy, op, shape, dtype):
    """A creation call a policy keeps got no barrier (it has no operand), so the default fold of
    the annotated module folded it: ``fold(annotate(m, P), "default")`` differed from
    ``fold(m, P)``. It is now rewritten ``full(shape, fold_barrier(<fill>))``.

        lv = zeros((2, 3))   ==annotate==>   lv_fill = fold_barrier(0.0); lv = full((2, 3), lv_fill)
    """
    mod = _creation_module(op, shape, dtype)
    assert fgr.plan(mod).folded  # the default folds the creation call
    annotated = fgr.annotate(mod, policy=policy)
    assert len(annotated.barriers) == 1 and not annotated.uncarried
    assert "has no operand" in annotated.explain()
    reference = fgr.fold(mod, policy=policy).mod
    assert len(op_calls(reference, f"relax.{op.__name__}")) == 1
    inputs = np.ones(shape, dtype)
    want = _run_main(reference, inputs)
    for folded in (fgr.fold(annotated.mod).mod, relax.transform.FoldConstant()(annotated.mod)):
        assert not fgr.plan(folded).folded  # nothing left to fold: the keep held
        assert (
            len(op_calls(folded, "relax.full")) == 1
            and len(op_calls(folded, "relax.fold_barrier")) == 1
        )
        np.testing.assert_array_equal(_run_main(folded, inputs), want)


def _single_call(shape, make) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(make(x))
            out = bb.emit_output(relax.op.add(y, relax.const(np.float32(1))))
        bb.emit_func_output(out)
    return bb.get()


ZERO_SIZE_CASES = {
    # stock folds these: the legalized kernel of a reduction over a zero-size axis reads nothing
    "sum-over-empty-axis": ((0, 3), lambda x: relax.op.sum(x, axis=[0])),
    "sum-of-empty-via-matmul": (
        (2, 0),
        lambda x: relax.op.matmul(x, relax.const(np.ones((0, 3), "float32"))),
    ),
    # and not these: their kernels take the zero-size parameter as an argument
    "exp-of-empty": ((0, 3), lambda x: relax.op.exp(x)),
    "concat-with-empty": (
        (0, 3),
        lambda x: relax.op.concat([x, relax.const(np.ones((2, 3), "float32"))], axis=0),
    ),
}


@pytest.mark.parametrize("case", sorted(ZERO_SIZE_CASES))
def test_zero_size_parameters_fold_as_stock_folds_them(case):
    """Stock folds a call on a zero-size run-time tensor when its legalized kernel does not read
    it (``sum`` over an empty axis legalizes to ``full(0)``), and so do its consumers; ``default``
    kept them (not constant) and differed from stock. Now such an input counts as constant
    exactly when the call's kernel does not read it."""
    shape, make = ZERO_SIZE_CASES[case]
    mod = _single_call(shape, make)
    tvm.ir.assert_structural_equal(
        fgr.fold(mod, strict=True).mod, relax.transform.FoldConstant()(mod)
    )
    empty = np.zeros(shape, "float32")
    np.testing.assert_array_equal(_run_main(fgr.fold(mod).mod, empty), _run_main(mod, empty))


def test_barrier_over_a_zero_size_tensor_holds_in_fold_guard_only():
    """Why a barrier over a zero-size tensor cannot hold through a later *stock* FoldConstant:
    the legalized ``sum`` over its empty axis takes no argument at all, so stock folds it without
    looking at the barrier. It is harmless: the result depends on no data (a zero-size tensor has
    a single value), so no constant a backend matches is lost. fold_guard's own pass keeps it.

        b = fold_barrier(<float32[0, 3]>); s = sum(b, axis=0)
        fold_guard.FoldConstant   ==> unchanged (kept by barrier)
        then stock FoldConstant   ==> s = <float32[3] zeros>; the barrier is left unused
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            b = bb.emit(fgr.fold_barrier(relax.const(np.ones((0, 3), "float32"))))
            s = bb.emit(relax.op.sum(b, axis=[0]))
            out = bb.emit_output(relax.op.add(x, s))
        bb.emit_func_output(out)
    mod = bb.get()
    ours = fgr.fold(mod, strict=True)
    assert {d.op: d.reason for d in ours.plan.decisions}["relax.sum"] is Reason.KEPT_BY_BARRIER
    tvm.ir.assert_structural_equal(ours.mod, mod)
    after_stock = relax.transform.FoldConstant()(ours.mod)
    assert not op_calls(after_stock, "relax.sum")
    ones = np.ones(3, "float32")
    np.testing.assert_array_equal(_run_main(after_stock, ones), _run_main(mod, ones))
