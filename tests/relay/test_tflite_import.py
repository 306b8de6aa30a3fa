"""A full-int8 TFLite model, written without TensorFlow, imports with ``from_tflite`` and runs.

What Relay's TFLite frontend gives for such a model decides what a frontend annotation helper
would have to do: the converter stores weights as int8 tensors and the frontend turns them into
int8 constants in NumPy (the OHWI kernel transposed to HWIO at import), so the import has
``qnn.conv2d`` / ``qnn.dense`` with int8 constant weights directly, ``qnn.quantize`` /
``qnn.dequantize`` only on the activations at the model's edges, and no all-constant QNN call.
Nothing is left to fold (stock, ``fold_qnn=True``, or fold_guard), ``allow_constant_qnn`` has
nothing to mark, and the test backend offloads every quantized op straight away.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

import numpy as np
import pytest
import tvm
from _common import onnx_models, relay_byoc, tflite_models
from relay_ir import op_calls
from tvm import relay
from tvm.contrib import graph_executor

import fold_guard.relay as fgr

# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model() -> tflite_models.QuantizedTFLiteModel:
    return tflite_models.make_quantized_tflite_model(0)


@pytest.fixture(scope="module")
def mod(model: tflite_models.QuantizedTFLiteModel) -> tvm.IRModule:
    return tflite_models.import_tflite_relay(model)


def qnn_counts(mod: tvm.IRModule) -> Dict[str, int]:
    return dict(
        Counter(call.op.name for call in op_calls(mod["main"]) if call.op.name.startswith("qnn."))
    )


def test_the_builder_is_deterministic_and_writes_a_tflite_file(
    model: tflite_models.QuantizedTFLiteModel,
) -> None:
    assert model.buffer[4:8] == b"TFL3"
    assert tflite_models.make_quantized_tflite_model(0).buffer == model.buffer
    assert tflite_models.make_quantized_tflite_model(1).buffer != model.buffer


def test_import_gives_quantized_ops_with_int8_constant_weights(
    model: tflite_models.QuantizedTFLiteModel, mod: tvm.IRModule
) -> None:
    assert qnn_counts(mod) == {
        "qnn.quantize": 1,  # the float input
        "qnn.conv2d": 1,
        "qnn.dense": 1,
        "qnn.requantize": 2,
        "qnn.dequantize": 1,  # the float output
    }
    conv, dense = relay_byoc.quantized_calls(mod["main"])
    assert relay_byoc.has_int8_constant_weight(conv) and relay_byoc.has_int8_constant_weight(dense)
    # The frontend transposed the OHWI kernel to HWIO in NumPy: the same int8 values, no op left.
    np.testing.assert_array_equal(
        conv.args[1].data.numpy(), model.conv_weight.transpose(1, 2, 3, 0)
    )
    np.testing.assert_array_equal(dense.args[1].data.numpy(), model.fc_weight)
    (quantize,) = _calls(mod, "qnn.quantize")
    (dequantize,) = _calls(mod, "qnn.dequantize")
    assert isinstance(quantize.args[0], relay.Var) and not isinstance(
        dequantize.args[0], relay.Constant
    )


def _calls(mod: tvm.IRModule, op_name: str) -> List[relay.Call]:
    return op_calls(mod["main"], op_name)


def test_nothing_is_left_to_fold_or_annotate(mod: tvm.IRModule) -> None:
    plan = fgr.plan(mod, "fold-qnn")
    assert plan.folded == ()
    for fold in (
        relay.transform.FoldConstant(),
        relay.transform.FoldConstant(fold_qnn=True),
        fgr.FoldConstant("qdq-accelerator"),
    ):
        tvm.ir.assert_structural_equal(fold(mod), mod, map_free_vars=True)
    tvm.ir.assert_structural_equal(fgr.allow_constant_qnn(mod), mod, map_free_vars=True)


def test_the_backend_offloads_every_quantized_op_without_folding(mod: tvm.IRModule) -> None:
    partitioned = relay_byoc.partition_for_qnn_npu(mod)
    assert relay_byoc.count_offloaded(partitioned) == relay_byoc.Offload(
        total=2, offloaded=2, int8_weights=2
    )


@pytest.mark.slow
def test_the_import_runs_like_the_integer_reference(
    model: tflite_models.QuantizedTFLiteModel, mod: tvm.IRModule
) -> None:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=onnx_models.RELAY_TARGET)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    rng = np.random.default_rng(1)
    step = float(model.output_q.scale.item())
    for _ in range(4):
        x = rng.standard_normal(tflite_models.INPUT_SHAPE).astype(np.float32)
        runner.set_input(tflite_models.INPUT_NAME, x)
        runner.run()
        out = runner.get_output(0).numpy()
        assert out.shape == tflite_models.OUTPUT_SHAPE
        # TVM rescales in fixed point, the reference in float64: at most one output step apart.
        np.testing.assert_allclose(
            out, tflite_models.reference_output(model, x), rtol=0, atol=step * (1 + 1e-5)
        )


@pytest.mark.parametrize("policy", ["qdq-accelerator", "weights-only", "fold-qnn"])
def test_annotate_binds_the_frontend_params_and_places_nothing(
    model: tflite_models.QuantizedTFLiteModel, policy: str
) -> None:
    """The frontend annotation helper on a raw ``from_tflite`` result: params bound, nothing to mark."""
    import tflite

    raw, params = relay.frontend.from_tflite(
        tflite.Model.GetRootAsModel(model.buffer, 0),
        shape_dict={tflite_models.INPUT_NAME: tflite_models.INPUT_SHAPE},
        dtype_dict={tflite_models.INPUT_NAME: "float32"},
    )
    assert params  # the weights arrive as parameters, not constants
    annotated = fgr.annotate(raw, params=params, policy=policy)
    assert annotated.placed == ()
    # a fresh import: stock FoldConstant(fold_qnn=True) above rewrote the fixture's requantize attrs
    tvm.ir.assert_structural_equal(
        annotated.mod, tflite_models.import_tflite_relay(model), map_free_vars=True
    )
