"""``fold_guard.relay.annotate``: a frontend's module and params made to carry a policy's decisions."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _common import onnx_models
from relay_ir import op_calls
from tvm import relay

import fold_guard
import fold_guard.relay as fgr
from fold_guard import Annotation

W = np.linspace(-1.0, 1.0, 16, dtype="float32").reshape(4, 4)
SCALE, ZERO = 1.0 / 128, 0


def _qdq_dense(weight: relay.Expr) -> relay.Function:
    x = relay.var("x", shape=(1, 4), dtype="float32")
    w_q = relay.qnn.op.quantize(weight, relay.const(SCALE), relay.const(ZERO), out_dtype="int8")
    w_dq = relay.qnn.op.dequantize(w_q, relay.const(SCALE), relay.const(ZERO))
    params = [x] + ([weight] if isinstance(weight, relay.Var) else [])
    return relay.Function(params, relay.nn.dense(x, w_dq))


def _count(mod: tvm.IRModule, op_name: str, *, constant_arg: bool = False) -> int:
    calls = op_calls(mod["main"], op_name)
    return sum(not constant_arg or isinstance(call.args[0], relay.Constant) for call in calls)


# ----------------------------------------------------------------------------------- golden IR


def _quantized(weight: np.ndarray) -> np.ndarray:
    return np.clip(np.round(weight / SCALE) + ZERO, -128, 127).astype("int8")


def test_params_are_bound_the_weight_quantize_evaluated_and_its_dequantize_guarded():
    """
    dense(x, dequantize(quantize(%w)))   params={"w": W}
      ==> dense(x, dequantize(fold_barrier(<int8: quantize(W)>)))
    (evaluated now: no stock pass knows fold_allow; guarded: relay.build would fold the dequantize)
    """
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.var("w", shape=(4, 4), dtype="float32")))
    annotated = fgr.annotate(mod, params={"w": W}, policy="qdq-accelerator")

    x = relay.var("x", shape=(1, 4), dtype="float32")
    w_dq = relay.qnn.op.dequantize(
        fgr.fold_barrier(relay.const(_quantized(W))), relay.const(SCALE), relay.const(ZERO)
    )
    expected = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w_dq)))
    )
    tvm.ir.assert_structural_equal(annotated.mod, expected, map_free_vars=True)
    assert [(p.annotation, p.op, p.rule) for p in annotated.placed] == [
        (Annotation.BARRIER, "qnn.dequantize", "keep-dequantize-of-integer-constant")
    ]
    # released, it is exactly what fold gives; stock FoldConstant, even fold_qnn=True, changes nothing
    bound = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(mod["main"], {"w": W}))
    )
    tvm.ir.assert_structural_equal(
        fgr.release_barriers(annotated.mod), fgr.fold(bound, policy="qdq-accelerator").mod
    )
    for stock in (relay.transform.FoldConstant(), relay.transform.FoldConstant(fold_qnn=True)):
        tvm.ir.assert_structural_equal(stock(annotated.mod), annotated.mod)


def test_a_policy_that_keeps_nothing_the_build_folds_places_nothing():
    """fold-qnn folds every constant QNN call: annotate is then fold, with no annotation left."""
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.const(W)))
    annotated = fgr.annotate(mod, policy="fold-qnn")
    assert annotated.placed == ()
    tvm.ir.assert_structural_equal(annotated.mod, fgr.fold(mod, policy="fold-qnn").mod)


def test_weights_only_puts_a_barrier_on_a_constant_that_is_not_a_weight():
    """
    dense(x, exp(W)) * (x + exp(W))  ==>  dense(x, <exp(W)>) * (x + exp(fold_barrier(W)))
    (the weight is evaluated now; the other exp is kept, and a barrier keeps it from stock folds)
    """
    x = relay.var("x", shape=(4, 4), dtype="float32")
    weight = relay.exp(relay.const(W))
    shift = relay.exp(relay.const(W))
    mod = tvm.IRModule.from_expr(
        relay.Function([x], relay.multiply(relay.nn.dense(x, weight), relay.add(x, shift)))
    )
    annotated = fgr.annotate(mod, policy="weights-only")

    folded_weight = fgr.fold(mod, policy="weights-only").mod["main"].body.args[0].args[1]
    assert isinstance(folded_weight, relay.Constant)
    expected_shift = relay.exp(fgr.fold_barrier(relay.const(W)))
    expected = tvm.IRModule.from_expr(
        relay.Function(
            [x], relay.multiply(relay.nn.dense(x, folded_weight), relay.add(x, expected_shift))
        )
    )
    tvm.ir.assert_structural_equal(
        annotated.mod, relay.transform.InferType()(expected), map_free_vars=True
    )
    assert [(p.op, p.rule) for p in annotated.placed] == [("exp", "keep-non-weight-constants")]
    # the barrier holds through stock FoldConstant
    stock = relay.transform.FoldConstant()(annotated.mod)
    assert _count(stock, "exp") == 1 and _count(stock, "fold_barrier") == 1


def test_unknown_params_are_a_clear_error_and_leave_the_module_alone():
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.var("w", shape=(4, 4), dtype="float32")))
    before = tvm.ir.save_json(mod)
    with pytest.raises(
        fold_guard.PreconditionError, match=r"\['weight'\] are not parameters of main"
    ):
        fgr.annotate(mod, params={"weight": W})
    with pytest.raises(fold_guard.UnknownPolicyError, match="no-such-npu"):
        fgr.annotate(mod, params={"w": W}, policy="no-such-npu")
    with pytest.raises(
        fold_guard.PreconditionError,
        match=r"param 'w' is float32\[3, 3\], but main declares w as float32\[4, 4\]",
    ):
        fgr.annotate(mod, params={"w": W[:3, :3]})
    with pytest.raises(
        fold_guard.PreconditionError,
        match=r"param 'w' is int8\[4, 4\], but main declares w as float32",
    ):
        fgr.annotate(mod, params={"w": W.astype("int8")})
    with pytest.raises(fold_guard.PreconditionError, match=r"param 'w' is a str, not an array"):
        fgr.annotate(mod, params={"w": "weights.npy"})
    assert tvm.ir.save_json(mod) == before


def test_allow_constant_qnn_marks_what_fold_qnn_folds():
    """dense(x, dequantize(quantize(W))) ==> dense(x, fold_allow(dequantize(quantize(W))))"""
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.const(W)))
    marked = fgr.allow_constant_qnn(mod)
    x = relay.var("x", shape=(1, 4), dtype="float32")
    w_q = relay.qnn.op.quantize(
        relay.const(W), relay.const(SCALE), relay.const(ZERO), out_dtype="int8"
    )
    w_dq = fgr.fold_allow(relay.qnn.op.dequantize(w_q, relay.const(SCALE), relay.const(ZERO)))
    expected = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w_dq)))
    tvm.ir.assert_structural_equal(marked, relay.transform.InferType()(expected))
    tvm.ir.assert_structural_equal(fgr.FoldConstant()(marked), fgr.fold(mod, policy="fold-qnn").mod)


# ----------------------------------------------------------------------------------- from_onnx


@pytest.fixture(scope="module")
def onnx_import():
    """What relay.frontend.from_onnx returns for the QDQ CNN with fp32 weights: (model, mod, params)."""
    model = onnx_models.make_qdq_cnn(float_weights=True)
    mod, params = relay.frontend.from_onnx(
        model, shape={onnx_models.INPUT_NAME: list(onnx_models.INPUT_SHAPE)}
    )
    return model, mod, params


def test_from_onnx_annotation_evaluates_every_weight_quantize(onnx_import):
    model, mod, params = onnx_import
    annotated = fgr.annotate(mod, params=params, policy="qdq-accelerator")
    bound = onnx_models.import_relay(model)
    weight_quantizes = _count(bound, "qnn.quantize", constant_arg=True)
    assert weight_quantizes == 5
    assert _count(annotated.mod, "qnn.quantize", constant_arg=True) == 0
    # weights and biases: every dequantize of an integer constant stays, behind a barrier
    assert len(annotated.barriers) == 2 * weight_quantizes and not annotated.allows
    assert {p.op for p in annotated.placed} == {"qnn.dequantize"}
    assert _count(annotated.mod, "fold_barrier") == 2 * weight_quantizes
    # stock FoldConstant, even with fold_qnn=True, now keeps them: the policy travels in the IR
    for stock in (relay.transform.FoldConstant(), relay.transform.FoldConstant(fold_qnn=True)):
        assert _count(stock(annotated.mod), "fold_barrier") == 2 * weight_quantizes
    # unannotated, stock folds nothing QNN, and fold_qnn=True folds the dequantize too
    assert (
        _count(relay.transform.FoldConstant()(bound), "qnn.quantize", constant_arg=True)
        == weight_quantizes
    )
    assert (
        _count(
            relay.transform.FoldConstant(fold_qnn=True)(bound), "qnn.dequantize", constant_arg=True
        )
        == 0
    )


@pytest.mark.slow
def test_from_onnx_annotated_module_runs_bit_identical(onnx_import):
    model, mod, params = onnx_import
    annotated = fgr.annotate(mod, params=params, policy="qdq-accelerator").mod
    feed = onnx_models.sample_input()
    reference = onnx_models.run_relay(onnx_models.import_relay(model), feed)[0]
    for candidate in (annotated, relay.transform.FoldConstant()(annotated)):
        np.testing.assert_array_equal(onnx_models.run_relay(candidate, feed)[0], reference)
    ort = onnx_models.run_onnxruntime(model, feed)[0]
    np.testing.assert_allclose(reference, ort, rtol=0, atol=onnx_models.output_atol(model))


def test_a_registered_backend_policy_is_accepted_wherever_a_policy_is():
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(_qdq_dense(relay.const(W))))
    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(
            fold_guard.compose(
                fold_guard.get_policy("qdq-accelerator"), fold_guard.size_guard(2.0), name="my-npu"
            )
        )
        assert fgr.plan(mod, "my-npu").policy_name == "my-npu"
        folded = fgr.FoldConstant("my-npu")(mod)
        tvm.ir.assert_structural_equal(fgr.fold(mod, policy="my-npu").mod, folded)
        tvm.ir.assert_structural_equal(
            fgr.fold_function(mod["main"], policy="my-npu"), folded["main"]
        )
        annotated = fgr.annotate(mod, policy="my-npu")
        assert annotated.policy_name == "my-npu" and [p.op for p in annotated.barriers] == [
            "qnn.dequantize"
        ]
        tvm.ir.assert_structural_equal(fgr.release_barriers(annotated.mod), folded)
    assert (
        _count(folded, "qnn.quantize") == 0
        and _count(folded, "qnn.dequantize", constant_arg=True) == 1
    )
    with pytest.raises(fold_guard.UnknownPolicyError, match="my-npu"):
        fgr.FoldConstant("my-npu")  # gone with the scope
