"""``fold_guard.relax.annotate``: a freshly imported module made to carry a policy's decisions.

Golden IR for the placement itself, then the real flow: the QDQ ONNX CNN imported with
``from_onnx``, annotated for ``qdq-accelerator``, and folded by the *stock* pass, by fold_guard's
default policy, and by fold_guard with the policy directly; all must keep the same weight patterns
and run to bit-identical outputs.
"""

from __future__ import annotations

import numpy as np
import onnxruntime  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from golden import op_calls
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Annotation

W_INT8 = (np.arange(16, dtype="int8") - 8).reshape(4, 4)
W_FP32 = np.linspace(-1.0, 1.0, 16, dtype="float32").reshape(4, 4)


def _bound_value(func: relax.Function, var: relax.Expr) -> relax.Expr:
    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var.same_as(var):
                return binding.value
    return var


def _dequantize_operands(mod: tvm.IRModule) -> list:
    """For each dequantize in main, what its data is: 'const <dtype>', 'barrier(const)',
    '<op>(const)' for a call on a constant, or 'runtime'."""
    main = mod["main"]
    kinds = []
    for call in op_calls(mod, "relax.dequantize"):
        data = _bound_value(main, call.args[0])
        if isinstance(data, relax.Call) and data.op.name == "relax.fold_barrier":
            inner = _bound_value(main, data.args[0])
            kinds.append(
                "barrier(const)"
                if isinstance(inner, tvm.ir.GenericConst)
                else f"barrier({inner.op.name})"
            )
        elif isinstance(data, tvm.ir.GenericConst):
            kinds.append(f"const {data.value.dtype}")
        elif isinstance(data, relax.Call) and isinstance(
            _bound_value(main, data.args[0]), tvm.ir.GenericConst
        ):
            kinds.append(f"{data.op.name}(const)")
        else:
            kinds.append("runtime")
    return kinds


# ----------------------------------------------------------------------------------- golden IR


def test_qdq_weight_gets_a_barrier_on_its_int8_operand():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                w_q = R.quantize(
                    R.const(W_FP32), R.const(0.0078125), R.const(0, "int8"), out_dtype="int8"
                )
                w = R.dequantize(w_q, R.const(0.0078125), R.const(0, "int8"), out_dtype="float32")
                y = R.matmul(x, w)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                w_q = R.quantize(
                    R.const(W_FP32), R.const(0.0078125), R.const(0, "int8"), out_dtype="int8"
                )
                w_operand = R.fold_barrier(w_q)
                w = R.dequantize(
                    w_operand, R.const(0.0078125), R.const(0, "int8"), out_dtype="float32"
                )
                y = R.matmul(x, w)
                R.output(y)
            return y

    annotated = fgr.annotate(Before, policy="qdq-accelerator")
    tvm.ir.assert_structural_equal(annotated.mod, Expected)
    assert [(p.annotation, p.label, p.op, p.rule) for p in annotated.placed] == [
        (Annotation.BARRIER, "w", "relax.dequantize", "keep-dequantize-of-integer-constant")
    ]
    # the quantize still folds (under the barrier), the dequantize never does, even in stock
    stock = relax.transform.FoldConstant()(annotated.mod)
    assert _dequantize_operands(stock) == ["barrier(const)"] and not op_calls(
        stock, "relax.quantize"
    )


def test_weights_only_puts_a_barrier_on_a_constant_that_is_not_a_weight():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                w = R.exp(R.const(W_FP32))
                shift = R.exp(R.const(W_FP32))
                y = R.matmul(x, w)
                z = R.add(x, shift)
                out = R.multiply(y, z)
                R.output(out)
            return out

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                w = R.exp(R.const(W_FP32))
                shift_operand = R.fold_barrier(R.const(W_FP32))
                shift = R.exp(shift_operand)
                y = R.matmul(x, w)
                z = R.add(x, shift)
                out = R.multiply(y, z)
                R.output(out)
            return out

    annotated = fgr.annotate(Before, policy="weights-only")
    tvm.ir.assert_structural_equal(annotated.mod, Expected)
    assert [p.label for p in annotated.barriers] == ["shift"] and not annotated.allows
    # the stock pass now folds the weight only
    stock = relax.transform.FoldConstant()(annotated.mod)
    assert len(op_calls(stock, "relax.exp")) == 1


def test_default_policy_places_nothing_and_returns_the_same_module():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            with R.dataflow():
                y = R.add(x, R.exp(R.const(W_FP32[0])))
                R.output(y)
            return y

    annotated = fgr.annotate(Before, policy="default")
    assert annotated.placed == ()
    tvm.ir.assert_structural_equal(annotated.mod, Before)


def test_unknown_policy_is_a_clear_error():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            return x

    with pytest.raises(fold_guard.UnknownPolicyError, match="no-such-npu"):
        fgr.annotate(Before, policy="no-such-npu")
    with pytest.raises(
        fold_guard.UnsupportedIRError, match=r"expects a tvm\.IRModule, got Function"
    ):
        fgr.annotate(Before["main"], policy="qdq-accelerator")


# ----------------------------------------------------------------------------------- ONNX QDQ


@pytest.fixture(scope="module", params=[False, True], ids=["int8-weights", "fp32-weights"])
def imported(request):
    model = onnx_models.make_qdq_cnn(float_weights=request.param)
    mod = onnx_models.import_relax(model)
    return model, mod


def test_import_annotation_pins_every_weight_and_bias_dequantize(imported):
    _, mod = imported
    before_json = tvm.ir.save_json(mod)
    annotated = fgr.annotate(mod, policy="qdq-accelerator")
    assert tvm.ir.save_json(mod) == before_json  # the caller's module is untouched
    weight_dq = [k for k in _dequantize_operands(mod) if k != "runtime"]
    assert len(annotated.barriers) == len(weight_dq) == 10 and not annotated.allows
    assert all(p.rule == "keep-dequantize-of-integer-constant" for p in annotated.placed)

    stock = relax.transform.FoldConstant()(annotated.mod)
    assert (
        sorted(k for k in _dequantize_operands(stock) if k != "runtime") == ["barrier(const)"] * 10
    )
    assert not [
        c for c in op_calls(stock, "relax.quantize") if not isinstance(c.args[0], relax.Var)
    ]


def test_annotated_default_fold_matches_the_policy_fold(imported):
    """Folding the annotated module under 'default' folds what 'qdq-accelerator' folds directly."""
    _, mod = imported
    annotated = fgr.annotate(mod, policy="qdq-accelerator").mod
    via_annotations = fgr.fold(annotated)
    direct = fgr.fold(mod, policy="qdq-accelerator")

    def folded_ops(result: fgr.FoldResult) -> list:
        return sorted(d.op for d in result.plan.folded)

    assert folded_ops(via_annotations) == folded_ops(direct)

    def op_counts(m: tvm.IRModule) -> dict:
        ops = ("relax.quantize", "relax.dequantize", "relax.nn.conv2d", "relax.matmul")
        return {op: len(op_calls(m, op)) for op in ops}

    assert op_counts(via_annotations.mod) == op_counts(direct.mod)
    assert len(op_calls(via_annotations.mod, "relax.fold_barrier")) == 10


@pytest.mark.slow
def test_annotated_modules_run_bit_identical_to_the_import(imported):
    model, mod = imported
    inputs = [onnx_models.sample_input()[onnx_models.INPUT_NAME]]
    reference = onnx_models.run_relax(mod, inputs)[0]
    annotated = fgr.annotate(mod, policy="qdq-accelerator").mod
    for candidate in (
        annotated,
        relax.transform.FoldConstant()(annotated),
        fgr.fold(annotated).mod,
    ):
        np.testing.assert_array_equal(onnx_models.run_relax(candidate, inputs)[0], reference)
    ort = onnx_models.run_onnxruntime(model, onnx_models.sample_input())[0]
    np.testing.assert_allclose(reference, ort, rtol=0, atol=onnx_models.output_atol(model))


def test_a_registered_backend_policy_is_accepted_by_annotate():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                w = R.dequantize(
                    R.const(W_INT8), R.const(0.5), R.const(0, "int8"), out_dtype="float32"
                )
                y = R.matmul(x, w)
                R.output(y)
            return y

    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(
            fold_guard.FoldPolicy(
                "my-npu",
                "keep every dequantize",
                (
                    fold_guard.Rule(
                        "keep-dq",
                        fold_guard.Action.KEEP,
                        "",
                        lambda call: call.op == "relax.dequantize",
                    ),
                ),
            )
        )
        annotated = fgr.annotate(Before, policy="my-npu")
        assert [(p.annotation, p.rule) for p in annotated.placed] == [
            (Annotation.BARRIER, "keep-dq")
        ]
        assert fgr.plan(Before, "my-npu").policy_name == "my-npu"
    assert _dequantize_operands(relax.transform.FoldConstant()(annotated.mod)) == ["barrier(const)"]
