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


def test_params_are_bound_and_the_weight_quantize_is_allowed():
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.var("w", shape=(4, 4), dtype="float32")))
    annotated = fgr.annotate(mod, params={"w": W}, policy="qdq-accelerator")

    x = relay.var("x", shape=(1, 4), dtype="float32")
    w_q = relay.qnn.op.quantize(
        relay.const(W), relay.const(SCALE), relay.const(ZERO), out_dtype="int8"
    )
    w_dq = relay.qnn.op.dequantize(fgr.fold_allow(w_q), relay.const(SCALE), relay.const(ZERO))
    expected = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w_dq)))
    )
    tvm.ir.assert_structural_equal(annotated.mod, expected, map_free_vars=True)
    assert [(p.annotation, p.op, p.rule) for p in annotated.placed] == [
        (Annotation.ALLOW, "qnn.quantize", "fold-quantize-of-constant")
    ]
    # a plain fold_guard FoldConstant() now gives the int8 weight; the dequantize stays for the backend
    folded = fgr.FoldConstant()(annotated.mod)
    assert (
        _count(folded, "qnn.quantize") == 0
        and _count(folded, "qnn.dequantize", constant_arg=True) == 1
    )
    assert folded["main"].body.args[1].args[0].data.dtype == "int8"


def test_weights_only_puts_a_barrier_on_a_constant_that_is_not_a_weight():
    x = relay.var("x", shape=(4, 4), dtype="float32")
    weight = relay.exp(relay.const(W))
    shift = relay.exp(relay.const(W))
    mod = tvm.IRModule.from_expr(
        relay.Function([x], relay.multiply(relay.nn.dense(x, weight), relay.add(x, shift)))
    )
    annotated = fgr.annotate(mod, policy="weights-only")

    expected_shift = relay.exp(fgr.fold_barrier(relay.const(W)))
    expected = tvm.IRModule.from_expr(
        relay.Function([x], relay.multiply(relay.nn.dense(x, weight), relay.add(x, expected_shift)))
    )
    tvm.ir.assert_structural_equal(
        annotated.mod, relay.transform.InferType()(expected), map_free_vars=True
    )
    assert [(p.op, p.rule) for p in annotated.placed] == [("exp", "keep-non-weight-constants")]
    # stock FoldConstant folds the weight only: the barrier holds through it
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


def test_allow_constant_qnn_is_annotate_with_fold_qnn():
    mod = tvm.IRModule.from_expr(_qdq_dense(relay.const(W)))
    tvm.ir.assert_structural_equal(
        fgr.allow_constant_qnn(mod), fgr.annotate(mod, policy="fold-qnn").mod
    )


# ----------------------------------------------------------------------------------- from_onnx


@pytest.fixture(scope="module")
def onnx_import():
    """What relay.frontend.from_onnx returns for the QDQ CNN with fp32 weights: (model, mod, params)."""
    model = onnx_models.make_qdq_cnn(float_weights=True)
    mod, params = relay.frontend.from_onnx(
        model, shape={onnx_models.INPUT_NAME: list(onnx_models.INPUT_SHAPE)}
    )
    return model, mod, params


def test_from_onnx_annotation_allows_every_weight_quantize(onnx_import):
    model, mod, params = onnx_import
    annotated = fgr.annotate(mod, params=params, policy="qdq-accelerator")
    bound = onnx_models.import_relay(model)
    weight_quantizes = _count(bound, "qnn.quantize", constant_arg=True)
    assert weight_quantizes == 5
    assert len(annotated.allows) == weight_quantizes and not annotated.barriers
    assert {p.op for p in annotated.placed} == {"qnn.quantize"}

    folded = fgr.FoldConstant()(annotated.mod)  # the default policy: the annotations decide
    assert _count(folded, "qnn.quantize", constant_arg=True) == 0
    assert _count(folded, "fold_allow") == 0
    # weights and biases: every dequantize of an integer constant is still there
    assert _count(folded, "qnn.dequantize", constant_arg=True) == 2 * weight_quantizes
    # stock folds nothing QNN here, and fold_qnn=True folds the dequantize too
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
    for candidate in (annotated, fgr.FoldConstant()(annotated)):
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
        assert annotated.policy_name == "my-npu" and [p.op for p in annotated.allows] == [
            "qnn.quantize"
        ]
        tvm.ir.assert_structural_equal(fgr.FoldConstant()(annotated.mod), folded)
    assert (
        _count(folded, "qnn.quantize") == 0
        and _count(folded, "qnn.dequantize", constant_arg=True) == 1
    )
    with pytest.raises(fold_guard.UnknownPolicyError, match="my-npu"):
        fgr.FoldConstant("my-npu")  # gone with the scope
