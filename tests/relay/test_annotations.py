"""Golden-IR tests of the Relay ops ``fold_barrier`` / ``fold_allow`` under ``fold_guard.relay.FoldConstant``.

Each case is a ``Before`` module and an ``Expected`` module built by hand, with constants computed
by NumPy from ops that are exact in float32 (add, subtract, multiply of small integers, and
quantize / dequantize by a power-of-two scale), so a bit-exact comparison is meaningful. Both
sides go through ``InferType`` (which fills in function return types) and are compared with
``tvm.ir.assert_structural_equal(..., map_free_vars=True)``; every case also checks that the pass
left ``Before`` untouched (guarantee 4).

Relay has no binding names, so plan decisions are looked up by op name; each module uses an op
at most once where a decision is asserted.

The issue asks for one contrast in particular: stock Relay ``FoldConstant`` folds straight
through a plain identity op (registered here under a test-only name, exactly the way RFC.md's
Appendix A describes), while ``fold_barrier`` holds under our pass and under a later stock pass.

White-box on purpose: it tests the op registration (``_ops``), a private mechanism.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Callable

import numpy as np
import pytest
import tvm
from relay_ir import op_calls
from tvm import relay, topi
from tvm.contrib import graph_executor
from tvm.relay.op import op as relay_op

import fold_guard
import fold_guard.relay as fgr
from fold_guard import Action, Reason

TARGET = tvm.target.Target(
    "llvm -mtriple=x86_64-linux-gnu"
)  # hhb's default "llvm" triple is riscv64
SHAPE = (2, 3)
A = np.arange(6, dtype="float32").reshape(SHAPE)
B = np.full(SHAPE, 2.0, dtype="float32")
X = np.array([[0.5, -1.0, 3.0], [7.25, 0.0, -2.5]], dtype="float32")

# Quantization by a power-of-two scale: W / SCALE is an exact integer, so no rounding tie arises.
SCALE = 0.5
W_FP32 = (np.arange(8, dtype="float32") - 4.0).reshape(2, 4) * 0.5
W_INT8 = (W_FP32 / SCALE).astype("int8")
X_QNN = np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(2, 4)

TEST_IDENTITY_OP = "fold_guard_test.identity"


# ----------------------------------------------------------------------------------- helpers


def _module(params: list[relay.Var], body: relay.Expr) -> tvm.IRModule:
    """A typed one-function module (InferType fills in the return type both sides must share)."""
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))


def _x(shape=SHAPE) -> relay.Var:
    return relay.var("x", shape=shape, dtype="float32")


def _c(value: np.ndarray) -> relay.Constant:
    return relay.const(value)


def assert_input_unchanged(mod: tvm.IRModule, saved: str) -> None:
    """Guarantee 4: the caller's module is structurally what its ``save_json`` copy was.

    Structural equality ignores TVM's cached ``checked_type_`` fields; that the pass leaves even
    those alone (the module byte-for-byte unchanged) is checked once, in
    ``test_annotations.py::test_input_is_byte_for_byte_unchanged``, so that a type-cache rewrite
    shows up there and not as a failure of every golden test.
    """
    tvm.ir.assert_structural_equal(mod, tvm.ir.load_json(saved), map_free_vars=True)


def check_before_after(
    before: tvm.IRModule, expected: tvm.IRModule, transform: tvm.transform.Pass
) -> tvm.IRModule:
    """``transform(before)`` is structurally ``expected``; ``before`` itself is left untouched."""
    saved = tvm.ir.save_json(before)
    after = transform(before)
    tvm.ir.assert_structural_equal(after, expected, map_free_vars=True)
    assert_input_unchanged(before, saved)
    return after


def _run(mod: tvm.IRModule, **inputs: np.ndarray) -> np.ndarray:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    runtime = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runtime.set_input(**inputs)
    runtime.run()
    return runtime.get_output(0).numpy()


def _decision(plan: fold_guard.FoldPlan, op_name: str) -> fold_guard.FoldDecision:
    (decision,) = [d for d in plan.decisions if d.op == op_name]
    return decision


def _reasons(plan: fold_guard.FoldPlan) -> dict[str, Reason]:
    """op name -> reason, for modules whose calls all have distinct ops."""
    reasons = {d.op: d.reason for d in plan.decisions}
    assert len(reasons) == len(plan.decisions), "this helper needs distinct ops"
    return reasons


STRICT = fgr.FoldConstant(strict=True)
STOCK = relay.transform.FoldConstant()


# -------------------------------------------------------------- barrier on a constant subgraph


def barrier_on_constant_subgraph() -> tvm.IRModule:
    x = _x()
    c = relay.add(_c(A), _c(B))  # folds: both inputs are constants
    m = relay.multiply(c, _c(B))  # folds: c folded, B constant
    b = fgr.fold_barrier(m)  # kept: a barrier always stays (its operand m folds under it)
    d = relay.subtract(b, _c(B))  # kept: consumes the barrier, which counts as non-constant
    y = relay.maximum(x, d)  # kept: x is a run-time input
    return _module([x], y)


def barrier_on_constant_subgraph_expected() -> tvm.IRModule:
    x = _x()
    b = fgr.fold_barrier(_c((A + B) * B))
    return _module([x], relay.maximum(x, relay.subtract(b, _c(B))))


def plain_constant_subgraph() -> tvm.IRModule:
    """barrier_on_constant_subgraph without the barrier: the reference for run-time numerics."""
    x = _x()
    return _module(
        [x], relay.maximum(x, relay.subtract(relay.multiply(relay.add(_c(A), _c(B)), _c(B)), _c(B)))
    )


def test_barrier_operand_folds_consumer_does_not():
    """
    c = A + B; m = c * B; b = barrier(m); d = b - B; y = max(x, d)
        ==>  b = barrier(<(A+B)*B>); d = b - B; y = max(x, d)
    """
    check_before_after(
        barrier_on_constant_subgraph(), barrier_on_constant_subgraph_expected(), STRICT
    )


def test_barrier_decisions_and_reasons():
    plan = fgr.plan(barrier_on_constant_subgraph())
    assert _reasons(plan) == {
        "add": Reason.FOLDED,
        "multiply": Reason.FOLDED,
        "fold_barrier": Reason.KEPT_BY_BARRIER,
        "subtract": Reason.KEPT_BY_BARRIER,
        "maximum": Reason.NOT_CONSTANT,
    }
    assert _decision(plan, "fold_barrier").rule == "fold_barrier"
    assert _decision(plan, "subtract").rule == "fold_barrier"
    assert "barrier" in _decision(plan, "subtract").detail  # says what it sits behind
    text = plan.explain()
    assert "2 folded" in text and "2 kept by barrier" in text and "1 not constant" in text


def test_stock_without_barrier_folds_everything_constant():
    """The contrast: without the barrier, stock folds the consumer too (max(x, <(A+B)*B-B>))."""
    x = _x()
    expected = _module([x], relay.maximum(x, _c((A + B) * B - B)))
    check_before_after(plain_constant_subgraph(), expected, STOCK)
    check_before_after(plain_constant_subgraph(), expected, STRICT)


def barrier_on_literal_constant() -> tvm.IRModule:
    x = _x()
    b = fgr.fold_barrier(_c(A))  # kept: barrier
    d = relay.multiply(b, _c(B))  # kept: its input is behind the barrier
    return _module([x], relay.add(x, d))  # kept: x is a run-time input


def barrier_on_runtime_value() -> tvm.IRModule:
    x = _x()
    a = relay.add(x, _c(A))  # kept: x is a run-time input
    b = fgr.fold_barrier(a)  # kept: barrier
    return _module([x], relay.multiply(b, _c(B)))  # kept: behind the barrier (and not constant)


@pytest.mark.parametrize(
    "before", [barrier_on_literal_constant, barrier_on_runtime_value], ids=["literal", "runtime"]
)
@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_barrier_unchanged(before, policy):
    """Nothing to fold: Expected is Before, under both built-in Relay policies and stock."""
    check_before_after(before(), before(), fgr.FoldConstant(policy, strict=True))
    check_before_after(before(), before(), STOCK)


def shape_of_barrier() -> tvm.IRModule:
    x = _x()
    b = fgr.fold_barrier(x)  # kept: barrier
    s = relay.shape_of(b)  # kept: stock would fold it from b's static type, but b is a barrier
    return _module([x], relay.add(relay.cast(s, "float32"), relay.sum(b)))  # kept: not constant


def test_shape_of_a_barrier_stays():
    """
    b = barrier(x); s = shape_of(b)   ==>   unchanged (the barrier's type is not a constant either)
    shape_of(x) without the barrier   ==>   folds to [2, 3], as stock folds it
    """
    check_before_after(shape_of_barrier(), shape_of_barrier(), STRICT)
    plan = fgr.plan(shape_of_barrier())
    assert _decision(plan, "shape_of").reason is Reason.KEPT_BY_BARRIER
    barrier = _decision(plan, "fold_barrier").label
    assert (
        _decision(plan, "shape_of").detail == f"input {barrier} is downstream of barrier {barrier}"
    )
    x = _x()
    plain = _module([x], relay.add(relay.cast(relay.shape_of(x), "float32"), relay.sum(x)))
    assert _decision(fgr.plan(plain), "shape_of").reason is Reason.FOLDED


# ------------------------------------------- the contrast: a plain identity op vs ours


@pytest.fixture(scope="module")
def test_identity_op() -> Iterator[tvm.ir.Op]:
    """A plain identity op, registered the way RFC.md's Appendix A describes (not TOpIsStateful).

    Relay ops cannot be unregistered, so it gets a test-only name and is registered at most once
    per process.
    """
    if TEST_IDENTITY_OP not in tvm.ir.Op.list_op_names():
        relay_op.register(TEST_IDENTITY_OP, "Identity, for tests only.")
        op = relay.op.get(TEST_IDENTITY_OP)
        op.set_num_inputs(1)
        op.add_argument("data", "Tensor", "The input.")
        op.add_type_rel("Identity")
        relay_op.register_compute(
            TEST_IDENTITY_OP, lambda _attrs, inputs, _out: [topi.identity(inputs[0])]
        )
        relay_op.register_injective_schedule(TEST_IDENTITY_OP)
        relay_op.register_pattern(TEST_IDENTITY_OP, relay_op.OpPattern.INJECTIVE)
    yield relay.op.get(TEST_IDENTITY_OP)


def test_stock_folds_straight_through_an_identity_op(test_identity_op):
    """y = x + (identity(A) + B)  ==stock==>  y = x + <A+B>: a plain annotation op is no barrier."""
    x = _x()
    before = _module([x], relay.add(x, relay.add(relay.Call(test_identity_op, [_c(A)]), _c(B))))
    expected = _module([x], relay.add(x, _c(A + B)))
    check_before_after(before, expected, STOCK)
    # Our default policy agrees with stock on an op it has never heard of (guarantee 1).
    check_before_after(before, expected, STRICT)


def test_fold_barrier_holds_where_identity_op_folds():
    """y = x + (barrier(A) + B) stays, under ours, under stock, and under stock after ours."""
    x = _x()
    before = _module([x], relay.add(x, relay.add(fgr.fold_barrier(_c(A)), _c(B))))
    ours = check_before_after(before, before, STRICT)
    stock_after_ours = check_before_after(ours, before, STOCK)
    assert len(op_calls(stock_after_ours, "fold_barrier")) == 1
    assert len(op_calls(stock_after_ours, "add")) == 2  # the consumer of the barrier did not fold
    decision = _decision(fgr.plan(before), "fold_barrier")
    assert decision.action is Action.KEEP and decision.reason is Reason.KEPT_BY_BARRIER


def test_barrier_survives_later_stock_fold_constant():
    ours = STRICT(barrier_on_constant_subgraph())
    stock_after = STOCK(ours)
    tvm.ir.assert_structural_equal(stock_after, ours, map_free_vars=True)
    (barrier,) = op_calls(stock_after, "fold_barrier")
    assert isinstance(barrier.args[0], relay.Constant)
    np.testing.assert_array_equal(barrier.args[0].data.numpy(), (A + B) * B)
    assert len(op_calls(stock_after, "subtract")) == 1  # nothing downstream of the barrier folded


def test_stock_alone_folds_the_operand_but_not_across_the_barrier():
    """fold_barrier is TOpIsStateful: stock folds above it, never the barrier or below."""
    check_before_after(
        barrier_on_constant_subgraph(), barrier_on_constant_subgraph_expected(), STOCK
    )


def test_annotated_modules_build_and_match_unannotated():
    """Annotations lower to identity: every stage runs to the unannotated module's output."""
    reference = _run(plain_constant_subgraph(), x=X)
    np.testing.assert_array_equal(reference, np.maximum(X, (A + B) * B - B))
    ours = STRICT(barrier_on_constant_subgraph())
    stages = {
        "annotated": (barrier_on_constant_subgraph(), reference),
        "ours": (ours, reference),
        "ours+stock": (STOCK(ours), reference),
        # Annotations that stay after the pass also lower to identity.
        "allow over a run-time value": (allow_over_runtime_value(), X + A),
        "barrier inside allow": (barrier_inside_allow(), X + (A + B) * B),
    }
    for name, (mod, expected) in stages.items():
        np.testing.assert_array_equal(_run(mod, x=X), expected, err_msg=name)


def _barrier_shapes() -> dict[str, tuple[Callable[[relay.Var], relay.Expr], np.ndarray]]:
    """Where a barrier can sit in a module that must still build: name -> (body of x, expected output)."""
    return {
        "consumed": (lambda x: relay.add(fgr.fold_barrier(_c(A)), x), A + X),
        "returned, constant operand": (lambda x: relay.Tuple([fgr.fold_barrier(_c(A)), x]), A),
        "whole body": (lambda x: fgr.fold_barrier(_c(A)), A),
        "over the input": (lambda x: fgr.fold_barrier(x), X),
        "over a run-time call": (lambda x: fgr.fold_barrier(relay.add(x, _c(A))), X + A),
        "allow returned": (lambda x: fgr.fold_allow(x), X),
    }


@pytest.mark.parametrize("shape", list(_barrier_shapes()))
def test_annotations_build_wherever_they_sit(shape):
    """Guarantee 5: an annotated module builds and runs with the annotation as identity.

    Not only where the barrier is fused into a consumer: also as a function output and over a
    run-time value (the first output is compared).
    """
    body, expected = _barrier_shapes()[shape]
    x = _x()
    mod = _module([x], body(x))
    for name, stage in (("annotated", mod), ("ours", fgr.FoldConstant()(mod))):
        np.testing.assert_array_equal(_run(stage, x=X), expected, err_msg=f"{shape}: {name}")


# ---------------------------------------------------------------------------------- allow


def allow_removes_itself() -> tvm.IRModule:
    x = _x()
    c = relay.add(_c(A), _c(B))  # folds: constants (the default policy would fold it anyway)
    a = fgr.fold_allow(c)  # folds: its operand is constant, so the annotation disappears
    return _module([x], relay.multiply(x, a))  # kept: x is a run-time input


def test_allow_disappears_once_operand_folds():
    """c = A + B; a = allow(c); y = x * a  ==>  y = x * <A+B>"""
    x = _x()
    after = check_before_after(
        allow_removes_itself(), _module([x], relay.multiply(x, _c(A + B))), STRICT
    )
    assert op_calls(after, "fold_allow") == []
    plan = fgr.plan(allow_removes_itself())
    assert _reasons(plan) == {
        "add": Reason.FOLDED,
        "fold_allow": Reason.FOLDED,
        "multiply": Reason.NOT_CONSTANT,
    }
    assert _decision(plan, "fold_allow").rule == "fold_allow"


def test_stock_folds_through_allow():
    """fold_allow is computational on purpose: stock folds it like any identity op."""
    x = _x()
    check_before_after(allow_removes_itself(), _module([x], relay.multiply(x, _c(A + B))), STOCK)


def quantized_weight(allow: bool) -> tvm.IRModule:
    """y = x + dequantize(quantize(W)), optionally with allow(quantize(W))."""
    x = _x((2, 4))
    q = relay.qnn.op.quantize(_c(W_FP32), relay.const(SCALE), relay.const(0), out_dtype="int8")
    if allow:
        q = fgr.fold_allow(q)  # folds: quantize of a constant, asked for explicitly
    dq = relay.qnn.op.dequantize(
        q, relay.const(SCALE), relay.const(0)
    )  # kept: QNN op, default policy
    return _module([x], relay.add(x, dq))  # kept: x is a run-time input


def quantized_weight_expected() -> tvm.IRModule:
    x = _x((2, 4))
    dq = relay.qnn.op.dequantize(_c(W_INT8), relay.const(SCALE), relay.const(0))
    return _module([x], relay.add(x, dq))


def test_allow_folds_qnn_constant_subgraph_under_default():
    """
    q = allow(quantize(W)); y = x + dequantize(q)  ==>  y = x + dequantize(<int8 W>)

    Only the allowed QNN call is lowered and evaluated; the dequantize after it stays intact.
    """
    after = check_before_after(quantized_weight(allow=True), quantized_weight_expected(), STRICT)
    assert len(op_calls(after, "qnn.dequantize")) == 1
    plan = fgr.plan(quantized_weight(allow=True))
    assert _reasons(plan) == {
        "qnn.quantize": Reason.FOLDED,
        "fold_allow": Reason.FOLDED,
        "qnn.dequantize": Reason.KEPT_BY_POLICY,
        "add": Reason.NOT_CONSTANT,
    }
    assert _decision(plan, "qnn.quantize").rule == "fold_allow"
    assert _decision(plan, "qnn.dequantize").rule == "default"


def test_allowed_qnn_constant_is_bit_identical_to_stock_fold_qnn():
    """The int8 weight we fold is what stock FoldConstant(fold_qnn=True) computes for it alone."""
    q = relay.qnn.op.quantize(_c(W_FP32), relay.const(SCALE), relay.const(0), out_dtype="int8")
    stock = relay.transform.FoldConstant(fold_qnn=True)(_module([], q))
    assert isinstance(stock["main"].body, relay.Constant)
    stock_bits = stock["main"].body.data.numpy()
    ours = STRICT(quantized_weight(allow=True))
    (dequantize,) = op_calls(ours, "qnn.dequantize")
    assert dequantize.args[0].data.numpy().dtype == np.int8
    np.testing.assert_array_equal(dequantize.args[0].data.numpy(), stock_bits)
    np.testing.assert_array_equal(stock_bits, W_INT8)


def test_unannotated_qnn_constant_subgraph_unchanged_under_default():
    """Without the allow, the default policy keeps QNN ops, exactly as stock does."""
    check_before_after(quantized_weight(allow=False), quantized_weight(allow=False), STRICT)
    check_before_after(quantized_weight(allow=False), quantized_weight(allow=False), STOCK)
    plan = fgr.plan(quantized_weight(allow=False))
    assert _decision(plan, "qnn.quantize").reason is Reason.KEPT_BY_POLICY
    assert _decision(plan, "qnn.quantize").rule == "default"


def test_fold_qnn_policy_folds_both_like_stock():
    x = _x((2, 4))
    expected = _module([x], relay.add(x, _c(W_INT8.astype("float32") * SCALE)))
    stock = relay.transform.FoldConstant(fold_qnn=True)
    for before in (quantized_weight(allow=False), quantized_weight(allow=True)):
        check_before_after(before, expected, stock)
        check_before_after(before, expected, fgr.FoldConstant("fold-qnn", strict=True))


def test_qnn_on_activations_stays_inside_and_outside_allow():
    """QNN on the run-time input is never lowered, even next to an allowed weight.

    y = dequantize(quantize(x)) + dequantize(allow(quantize(W)))
        ==>  y = dequantize(quantize(x)) + dequantize(<int8 W>)
    """
    x = _x((2, 4))

    def build(weight: relay.Expr) -> tvm.IRModule:
        act = relay.qnn.op.dequantize(
            relay.qnn.op.quantize(x, relay.const(SCALE), relay.const(0), out_dtype="int8"),
            relay.const(SCALE),
            relay.const(0),
        )
        return _module(
            [x], relay.add(act, relay.qnn.op.dequantize(weight, relay.const(SCALE), relay.const(0)))
        )

    quantize_w = relay.qnn.op.quantize(
        _c(W_FP32), relay.const(SCALE), relay.const(0), out_dtype="int8"
    )
    before = build(fgr.fold_allow(quantize_w))
    after = check_before_after(before, build(_c(W_INT8)), STRICT)
    assert len(op_calls(after, "qnn.quantize")) == 1 and len(op_calls(after, "qnn.dequantize")) == 2
    np.testing.assert_array_equal(_run(after, x=X_QNN), _run(before, x=X_QNN))


def allow_over_runtime_value() -> tvm.IRModule:
    x = _x()
    a = relay.add(x, _c(A))  # kept: x is a run-time input
    return _module([x], fgr.fold_allow(a))  # kept: its operand cannot be computed from constants


def test_allow_over_runtime_value_stays():
    check_before_after(
        allow_over_runtime_value(), allow_over_runtime_value(), fgr.FoldConstant(strict=False)
    )
    decision = _decision(fgr.plan(allow_over_runtime_value()), "fold_allow")
    assert decision.action is Action.KEEP and decision.reason is Reason.NOT_CONSTANT
    assert "not constant" in decision.detail
    result = fgr.fold(allow_over_runtime_value())
    assert not result.modified
    assert "not constant" in result.plan.explain()


def test_allow_over_runtime_value_strict_raises():
    before = allow_over_runtime_value()
    saved = tvm.ir.save_json(before)
    with pytest.raises(fold_guard.FoldNotPossibleError, match="fold_allow") as info:
        fgr.fold(before, strict=True)
    assert "not constant" in str(info.value)
    assert_input_unchanged(before, saved)


def barrier_inside_allow() -> tvm.IRModule:
    x = _x()
    a = relay.add(_c(A), _c(B))  # folds: constants
    b = fgr.fold_barrier(a)  # kept: barrier, even inside an allowed subgraph
    c = relay.multiply(b, _c(B))  # kept: behind the barrier; the allow does not override it
    d = fgr.fold_allow(c)  # kept: its operand is behind a barrier
    return _module([x], relay.add(x, d))  # kept: x is a run-time input


def barrier_inside_allow_expected() -> tvm.IRModule:
    x = _x()
    d = fgr.fold_allow(relay.multiply(fgr.fold_barrier(_c(A + B)), _c(B)))
    return _module([x], relay.add(x, d))


def test_barrier_inside_allowed_subgraph_wins():
    """a = A+B; b = barrier(a); c = b*B; d = allow(c) ==> b = barrier(<A+B>); c, d stay"""
    check_before_after(
        barrier_inside_allow(), barrier_inside_allow_expected(), fgr.FoldConstant(strict=False)
    )
    plan = fgr.plan(barrier_inside_allow())
    assert _decision(plan, "fold_barrier").reason is Reason.KEPT_BY_BARRIER
    assert _decision(plan, "multiply").reason is Reason.KEPT_BY_BARRIER
    assert _decision(plan, "fold_allow").reason is Reason.KEPT_BY_BARRIER
    assert [d.reason for d in plan.decisions if d.op == "add"] == [
        Reason.FOLDED,
        Reason.NOT_CONSTANT,
    ]


def test_barrier_inside_allowed_subgraph_strict_raises():
    with pytest.raises(fold_guard.FoldNotPossibleError, match="fold_allow") as info:
        fgr.fold(barrier_inside_allow(), strict=True)
    assert "barrier" in str(info.value)


# ------------------------------------------------------------------------- conflicts


def allow_of_barrier() -> tvm.IRModule:
    x = _x()
    b = fgr.fold_barrier(relay.add(_c(A), _c(B)))
    c = fgr.fold_allow(b)  # an error: a value cannot be both allowed and barred
    return _module([x], relay.add(x, c))


def test_allow_of_barrier_is_an_error_and_input_unchanged():
    before = allow_of_barrier()
    saved = tvm.ir.save_json(before)
    for entry in (fgr.fold, fgr.plan, fgr.FoldConstant()):
        with pytest.raises(
            fold_guard.ConflictingAnnotationsError, match=r"fold_allow\(.*\).*fold_barrier"
        ) as info:
            entry(before)
        assert "fold_barrier(fold_allow(x))" in str(info.value)  # the hint: the order that works
    assert_input_unchanged(before, saved)


def test_barrier_of_allow_is_fine():
    """y = x + barrier(allow(A+B))  ==>  y = x + barrier(<A+B>): the suggested fix for the conflict."""
    x = _x()
    before = _module([x], relay.add(x, fgr.fold_barrier(fgr.fold_allow(relay.add(_c(A), _c(B))))))
    expected = _module([x], relay.add(x, fgr.fold_barrier(_c(A + B))))
    after = check_before_after(before, expected, STRICT)
    assert op_calls(after, "fold_allow") == []


# --------------------------------------------------------------- printing and serialization


@pytest.mark.parametrize(
    "build",
    [
        barrier_inside_allow,
        barrier_inside_allow_expected,
        allow_removes_itself,
        lambda: quantized_weight(allow=True),
    ],
    ids=["before", "folded-form", "allow", "qnn-allow"],
)
def test_print_json_and_reparse_round_trip(build):
    mod = build()
    text = mod.astext()
    assert "fold_barrier(" in text or "fold_allow(" in text
    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(mod)), mod, map_free_vars=True)
    reparsed = relay.transform.InferType()(tvm.relay.parse(text))
    tvm.ir.assert_structural_equal(reparsed, mod, map_free_vars=True)


def test_print_shows_both_annotations():
    text = barrier_inside_allow().astext()
    assert "fold_barrier(" in text and "fold_allow(" in text


def test_folded_output_round_trips_and_stays_folded():
    after = STRICT(barrier_on_constant_subgraph())
    reparsed = relay.transform.InferType()(tvm.relay.parse(after.astext()))
    tvm.ir.assert_structural_equal(reparsed, after, map_free_vars=True)
    loaded = tvm.ir.load_json(tvm.ir.save_json(after))
    tvm.ir.assert_structural_equal(loaded, after, map_free_vars=True)
    tvm.ir.assert_structural_equal(STRICT(loaded), after, map_free_vars=True)


def test_builders_make_plain_calls_of_the_registered_ops():
    for builder, name in ((fgr.fold_barrier, "fold_barrier"), (fgr.fold_allow, "fold_allow")):
        call = builder(_c(A))
        tvm.ir.assert_structural_equal(call, relay.Call(relay.op.get(name), [_c(A)]))


# ----------------------------------------------------------------------- import twice


def _op_attrs(name: str) -> dict[str, object]:
    op = relay.op.get(name)
    values = {key: op.get_attr(key) for key in ("TOpPattern", "TOpIsStateful")}
    return {key: None if value is None else int(value) for key, value in values.items()}


def test_importing_twice_is_harmless():
    names = ("fold_barrier", "fold_allow")
    attrs_before = {name: _op_attrs(name) for name in names}
    from fold_guard.relay import _ops

    importlib.reload(_ops)
    _ops.register_ops()
    importlib.reload(fgr)
    assert [n for n in tvm.ir.Op.list_op_names() if n in names].count("fold_barrier") == 1
    attrs_after = {name: _op_attrs(name) for name in names}
    # Re-registering a compute at the same level would have raised; the marks are unchanged.
    assert attrs_after == attrs_before
    assert attrs_after["fold_barrier"]["TOpIsStateful"]
    assert not attrs_after["fold_allow"]["TOpIsStateful"]
    assert relay.op.get("fold_barrier").get_attr("FTVMCompute") is not None
    # The ops, the printer/parser, the pass and the build all still work after the reload.
    check_before_after(
        barrier_on_constant_subgraph(),
        barrier_on_constant_subgraph_expected(),
        fgr.FoldConstant(strict=True),
    )
    mod = barrier_inside_allow()
    tvm.ir.assert_structural_equal(
        relay.transform.InferType()(tvm.relay.parse(mod.astext())), mod, map_free_vars=True
    )
    np.testing.assert_array_equal(_run(mod, x=X), X + (A + B) * B)


# --------------------------------------------------------- guarantee 4, byte for byte


def _byte_cases() -> dict[str, Callable[[], tvm.IRModule]]:
    def untyped() -> tvm.IRModule:
        x = _x()
        return tvm.IRModule.from_expr(
            relay.Function([x], relay.add(x, fgr.fold_barrier(relay.add(_c(A), _c(B)))))
        )

    return {"typed": barrier_on_constant_subgraph, "untyped": untyped, "conflict": allow_of_barrier}


@pytest.mark.parametrize("case", list(_byte_cases()))
@pytest.mark.parametrize("entry", ["FoldConstant", "fold", "plan"])
def test_input_is_byte_for_byte_unchanged(case, entry):
    """Guarantee 4 in full: not even TVM's cached ``checked_type_`` fields of the input change.

    Relay's ``InferType`` writes ``checked_type_`` into the expression nodes it visits, so running
    it on the caller's module (rather than on a copy) changes that module's ``save_json`` text
    while leaving it structurally equal, and sets types on an untyped input. Stock passes do
    this; fold_guard promises more. Errors (the conflict case) must not leave it behind either.
    """
    mod = _byte_cases()[case]()
    saved = tvm.ir.save_json(mod)
    call = {"FoldConstant": fgr.FoldConstant(), "fold": fgr.fold, "plan": fgr.plan}[entry]
    try:
        call(mod)
    except fold_guard.ConflictingAnnotationsError:
        assert case == "conflict"
    assert tvm.ir.save_json(mod) == saved, f"{entry} rewrote the caller's module ({case})"


def test_allow_constant_qnn_keeps_module_attributes() -> None:
    """allow_constant_qnn only adds annotations: the module's attributes come through too."""
    w = relay.qnn.op.quantize(
        relay.const(np.ones((2, 2), "float32")), relay.const(0.5), relay.const(0)
    )
    x = relay.var("x", shape=(2, 2), dtype="int8")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, w))).with_attr(
        "fold_guard_test", tvm.runtime.String("kept")
    )
    annotated = fgr.allow_constant_qnn(mod)
    assert annotated["main"].body.args[1].op.name == "fold_allow"
    assert str(annotated.attrs["fold_guard_test"]) == "kept"
    assert str(fgr.FoldConstant()(annotated).attrs["fold_guard_test"]) == "kept"
