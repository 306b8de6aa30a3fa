"""The reference QDQ ONNX model: reproducible, imports with constant Q/DQ, matches onnxruntime."""

import numpy as np
import onnx
import onnxruntime  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from golden import constant_operands
from tvm import relax

WEIGHT_SHAPES = sorted([(8, 3, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3), (32, 16, 3, 3), (10, 32)])
BIAS_SHAPES = sorted([(8,), (16,), (16,), (32,), (10,)])


@pytest.fixture(scope="module")
def qdq_model():
    return onnx_models.make_qdq_cnn(0)


@pytest.fixture(scope="module")
def relax_mod(qdq_model):
    return onnx_models.import_relax(qdq_model)


def test_make_qdq_cnn_is_deterministic(qdq_model):
    again = onnx_models.make_qdq_cnn(0)
    assert again.SerializeToString() == qdq_model.SerializeToString()
    other = onnx_models.make_qdq_cnn(1)
    assert other.SerializeToString() != qdq_model.SerializeToString()


def test_model_is_per_channel_qdq(qdq_model):
    ops = {node.op_type for node in qdq_model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Relu", "Gemm"} <= ops
    assert not any(op.startswith("QLinear") for op in ops)  # QDQ, not QOperator format
    assert [(o.domain, o.version) for o in qdq_model.opset_import] == [("", 13)]
    assert onnx_models.output_scale(qdq_model) > 0


def test_import_has_constant_dequantize_weights(relax_mod):
    dequantized = constant_operands(relax_mod, "relax.dequantize")
    weights = sorted(shape for dtype, shape in dequantized if dtype == "int8")
    biases = sorted(shape for dtype, shape in dequantized if dtype == "int32")
    assert weights == WEIGHT_SHAPES
    assert biases == BIAS_SHAPES
    assert len(dequantized) == 10
    assert constant_operands(relax_mod, "relax.quantize") == []


def test_float_weights_give_constant_quantize():
    mod = onnx_models.import_relax(onnx_models.make_qdq_cnn(0, float_weights=True))
    quantized = constant_operands(mod, "relax.quantize")
    assert sorted(shape for dtype, shape in quantized if dtype == "float32") == WEIGHT_SHAPES
    assert len(quantized) == 5
    biases = sorted(shape for dtype, shape in constant_operands(mod, "relax.dequantize"))
    assert biases == BIAS_SHAPES


def test_sample_input_is_fixed():
    first = onnx_models.sample_input()
    assert list(first) == [onnx_models.INPUT_NAME]
    assert first["input"].shape == onnx_models.INPUT_SHAPE
    assert first["input"].dtype == np.float32
    np.testing.assert_array_equal(first["input"], onnx_models.sample_input()["input"])


@pytest.mark.slow
def test_unfolded_build_matches_onnxruntime(qdq_model, relax_mod):
    atol = onnx_models.output_atol(qdq_model)
    exe = tvm.compile(relax_mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    for seed in range(1, 9):
        feed = onnx_models.sample_input(seed)
        (expected,) = onnx_models.run_onnxruntime(qdq_model, feed)
        actual = vm["main"](tvm.runtime.tensor(feed["input"])).numpy()
        assert actual.shape == (1, onnx_models.NUM_CLASSES)
        np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)
    # run_relax is the same pipeline as above.
    feed = onnx_models.sample_input()
    (via_helper,) = onnx_models.run_relax(relax_mod, [feed["input"]])
    np.testing.assert_array_equal(via_helper, vm["main"](tvm.runtime.tensor(feed["input"])).numpy())


def _kernels_run(model: onnx.ModelProto, tmp_path, *, fuse_qdq: bool) -> set:
    path = tmp_path / f"optimized-{fuse_qdq}.onnx"
    onnx_models.run_onnxruntime(
        model, onnx_models.sample_input(), fuse_qdq=fuse_qdq, optimized_model_path=str(path)
    )
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("activation_type", ["uint8", "int8"])
def test_the_reference_runs_float_operators_between_real_qdq_pairs(activation_type, tmp_path):
    # onnxruntime's integer kernels give different results with and without VNNI, so the
    # reference must not run any of them (see run_onnxruntime).
    model = onnx_models.make_qdq_cnn(0, activation_type=activation_type)
    integer_kernels = {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}
    reference = _kernels_run(model, tmp_path, fuse_qdq=False)
    assert reference >= {"Conv", "Gemm", "QuantizeLinear", "DequantizeLinear"}
    assert not any(op.startswith("QLinear") or op.endswith("Integer") for op in reference)
    assert _kernels_run(model, tmp_path, fuse_qdq=True) & integer_kernels
