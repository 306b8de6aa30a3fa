"""The model of ``fold-guard demo``: a small QDQ CNN built with onnx's public helper API.

The layout a QDQ quantizer (onnxruntime's ``quantize_static``) writes, without running one:
every activation goes through ``QuantizeLinear -> DequantizeLinear`` (uint8), every weight is
``DequantizeLinear(<int8 initializer>, <per-channel scale>, axis=0)`` and every bias
``DequantizeLinear(<int32 initializer>, <input scale * weight scale>, axis=0)``::

    input (1, 3, 16, 16) -> 4 x [Q/DQ -> Conv 3x3 (DQ weight, DQ bias) -> Relu]
                         -> GlobalAveragePool -> Flatten -> Q/DQ -> Gemm (DQ weight, DQ bias)

So the import has 10 ``dequantize`` of integer constants (5 weights, 5 biases): stock folding
turns each into an fp32 constant, and ``keep-qdq-weights`` keeps all 10 for a QDQ backend.
Weights come from ``np.random.default_rng(seed)``; the activation scales are fixed, which is
enough for a model that is inspected and folded rather than evaluated for accuracy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

__all__ = ["qdq_cnn"]

#: (input channels, output channels, stride) of the four convolutions.
_CONVS: Tuple[Tuple[int, int, int], ...] = ((3, 8, 1), (8, 16, 2), (16, 16, 1), (16, 32, 2))
_CLASSES = 10
#: uint8 scale and zero point of the input (about [-2, 2]) and of every later activation.
_INPUT_QUANT = (4.0 / 255.0, 128)
_ACTIVATION_QUANT = (0.02, 0)


def qdq_cnn(seed: int = 0) -> onnx.ModelProto:
    """The demo's QDQ CNN (opset 13), input ``"input"`` (1, 3, 16, 16), output (1, 10)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: List[onnx.NodeProto] = []
    initializers: List[onnx.TensorProto] = []

    def constant(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(value, name))
        return name

    def qdq(x: str, name: str, quant: Tuple[float, int]) -> str:
        scale = constant(f"{name}.scale", np.array(quant[0], np.float32))
        zero = constant(f"{name}.zero_point", np.array(quant[1], np.uint8))
        nodes.append(
            helper.make_node(
                "QuantizeLinear", [x, scale, zero], [f"{name}.q"], name=f"{name}.quantize"
            )
        )
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{name}.q", scale, zero],
                [f"{name}.dq"],
                name=f"{name}.dequantize",
            )
        )
        return f"{name}.dq"

    def weight_and_bias(
        name: str, w: np.ndarray, b: np.ndarray, input_scale: float
    ) -> Tuple[str, str]:
        # Per output channel (axis 0), symmetric int8 weights; int32 biases at the accumulator scale.
        w_scale = np.maximum(np.abs(w.reshape(w.shape[0], -1)).max(axis=1), 1e-8) / 127.0
        w_q = np.clip(np.round(w / w_scale.reshape((-1,) + (1,) * (w.ndim - 1))), -127, 127).astype(
            np.int8
        )
        b_scale = (input_scale * w_scale).astype(np.float32)
        b_q = np.round(b / b_scale).astype(np.int32)
        outputs = []
        for kind, data, scale, zero in (
            ("weight", w_q, w_scale.astype(np.float32), np.zeros(len(w_scale), np.int8)),
            ("bias", b_q, b_scale, np.zeros(len(b_scale), np.int32)),
        ):
            inputs = [
                constant(f"{name}.{kind}_quantized", data),
                constant(f"{name}.{kind}_scale", scale),
                constant(f"{name}.{kind}_zero_point", zero),
            ]
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    inputs,
                    [f"{name}.{kind}"],
                    name=f"{name}.{kind}.dequantize",
                    axis=0,
                )
            )
            outputs.append(f"{name}.{kind}")
        return outputs[0], outputs[1]

    x, quant = "input", _INPUT_QUANT
    for i, (cin, cout, stride) in enumerate(_CONVS):
        x = qdq(x, f"conv{i}.input", quant)
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        weight, bias = weight_and_bias(
            f"conv{i}", w, (rng.standard_normal(cout) * 0.1).astype(np.float32), quant[0]
        )
        nodes.append(
            helper.make_node(
                "Conv",
                [x, weight, bias],
                [f"conv{i}"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        x, quant = f"relu{i}", _ACTIVATION_QUANT
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1))
    x = qdq("flat", "fc.input", quant)
    width = _CONVS[-1][1]
    w = (rng.standard_normal((_CLASSES, width)) * np.sqrt(1.0 / width)).astype(np.float32)
    weight, bias = weight_and_bias(
        "fc", w, (rng.standard_normal(_CLASSES) * 0.1).astype(np.float32), quant[0]
    )
    nodes.append(helper.make_node("Gemm", [x, weight, bias], ["output"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes,
        "fold_guard_demo_qdq_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, _CLASSES])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="fold_guard"
    )
    model.ir_version = (
        8  # what onnx releases since 1.10 read; the default follows the installed onnx
    )
    onnx.checker.check_model(model)
    return model
