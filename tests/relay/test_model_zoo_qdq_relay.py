"""The residual CNN and the transformer block of :mod:`_common.onnx_models` on Relay.

For each model, on hhb-tvm (TVM 0.16): ``import_relay`` keeps every weight as
``qnn.dequantize(<int8 constant>)`` (``qnn.quantize(<fp32 constant>)`` with ``float_weights=True``);
``FakeQuantizationToInteger`` turns every ``Conv`` / ``Gemm`` / ``MatMul`` into ``qnn.conv2d`` /
``qnn.dense`` / ``qnn.batch_matmul`` (and the ``Add`` / ``Mul`` of activations into ``qnn.add`` /
``qnn.mul``); and both the import and the FQ2I module, built at opt level 3, match onnxruntime.

FQ2I does not convert everything in the transformer block: ``Softmax``, ``Gelu`` (imported as
``erf`` arithmetic) and ``LayerNormalization`` (imported as ``mean`` / ``variance`` arithmetic) stay
float between their quantize / dequantize pairs, so the ``LayerNormalization`` parameters stay
``qnn.dequantize`` of constants after FQ2I. The tests assert that too.

Expected counts come from the models: weights from :func:`weight_shapes` of the float model, the
other quantized constants from the ``DequantizeLinear`` / ``QuantizeLinear`` nodes on initializers,
operator counts from the nodes of the QDQ model. The checks the Relax zoo makes too are in
:mod:`support.ir_harness`.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import List

import pytest
import tvm
from _common import onnx_models
from harness_relay import RELAY
from relay_ir import op_calls
from support import ir_harness as harness
from tvm import relay

#: ONNX operator -> the QNN operator FQ2I makes of it (each node of the model becomes one).
FQ2I_QNN = {
    "Conv": "qnn.conv2d",
    "Gemm": "qnn.dense",
    "MatMul": "qnn.batch_matmul",
    "Add": "qnn.add",
    "Mul": "qnn.mul",
}
#: ONNX operators FQ2I leaves in float, -> a Relay operator their import has once per node.
FQ2I_FLOAT = {"Softmax": "nn.softmax", "Gelu": "erf", "LayerNormalization": "variance"}


# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def calls(mod: tvm.IRModule) -> List[relay.Call]:
    return op_calls(mod["main"])


def op_counts(mod: tvm.IRModule) -> Counter:
    return Counter(call.op.name for call in calls(mod))


def is_constant(expr: relay.Expr) -> bool:
    """A constant, or a ``qnn.quantize`` of one (what ``float_weights=True`` leaves)."""
    if (
        isinstance(expr, relay.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == "qnn.quantize"
    ):
        expr = expr.args[0]
    return isinstance(expr, relay.Constant)


#: The model (seed 0) and its import, built once per module.
model_for = functools.partial(harness.zoo_model, RELAY)


@functools.cache
def fq2i_for(name: str, float_weights: bool = False) -> tvm.IRModule:
    """The import after ``FakeQuantizationToInteger`` (computed once)."""
    imported = model_for(name, float_weights).imported
    return relay.transform.InferType()(relay.transform.FakeQuantizationToInteger()(imported))


@pytest.fixture(scope="module", autouse=True)
def _drop_cache():
    yield
    harness.zoo_model.cache_clear()
    fq2i_for.cache_clear()


# ----------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_import_dequantizes_every_weight_constant(name: str) -> None:
    harness.check_import_dequantizes_every_weight(RELAY, model_for(name))


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_float_weights_give_one_constant_quantize_per_weight(name: str) -> None:
    harness.check_float_weights_quantize_every_weight(RELAY, model_for(name, float_weights=True))


@pytest.mark.parametrize("float_weights", [False, True], ids=["int8_weights", "float_weights"])
@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_fq2i_turns_every_weighted_op_into_qnn(name: str, float_weights: bool) -> None:
    model, fq2i = model_for(name, float_weights), fq2i_for(name, float_weights)
    ops = op_counts(fq2i)
    for onnx_op, qnn_op in FQ2I_QNN.items():
        assert ops[qnn_op] == model.nodes[onnx_op], (qnn_op, ops)
    assert ops["qnn.conv2d"] + ops["qnn.dense"] == len(model.weights)
    assert not {"nn.conv2d", "nn.dense", "nn.batch_matmul", "nn.matmul"} & set(ops)
    # What stays float, once per ONNX node.
    for onnx_op, relay_op in FQ2I_FLOAT.items():
        assert ops[relay_op] == model.nodes[onnx_op], (relay_op, ops)
    # The kernels: int8 constants, or the quantize of an fp32 constant that folding should turn
    # into one.
    kernels = [call.args[1] for call in calls(fq2i) if call.op.name in ("qnn.conv2d", "qnn.dense")]
    if float_weights:
        assert all(
            isinstance(k, relay.Call)
            and k.op.name == "qnn.quantize"
            and isinstance(k.args[0], relay.Constant)
            and k.args[0].data.dtype == "float32"
            for k in kernels
        )
        shapes = sorted(tuple(k.args[0].data.shape) for k in kernels)
    else:
        assert all(isinstance(k, relay.Constant) and k.data.dtype == "int8" for k in kernels)
        shapes = sorted(tuple(k.data.shape) for k in kernels)
    assert shapes == model.weights
    # Only the float islands keep dequantized constants: the LayerNormalization scales and biases.
    kept = [
        call
        for call in calls(fq2i)
        if call.op.name == "qnn.dequantize" and is_constant(call.args[0])
    ]
    assert len(kept) == 2 * model.nodes["LayerNormalization"]


@pytest.mark.slow
@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_import_and_fq2i_run_like_onnxruntime(name: str) -> None:
    model = model_for(name)
    atol = onnx_models.output_atol(model.onnx)
    # FQ2I computes in integers, which round differently from the float reference.
    integer_atol = onnx_models.output_atol(model.onnx, onnx_models.INTEGER_TOLERANCE_STEPS)
    runs = {
        "import": (onnx_models.build_relay(model.imported), atol),
        "fq2i": (onnx_models.build_relay(fq2i_for(name)), integer_atol),
    }
    harness.check_runs_like_onnxruntime(model, runs)
