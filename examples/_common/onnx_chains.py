"""A QDQ ONNX model whose weights arrive through requantize chains, written with ``onnx.helper``.

Some quantizers (onnxruntime's QNN flow for Qwen3 among them) store a weight at one scale and
requantize it to another inside the graph: ``DequantizeLinear(int8 W, s1) -> QuantizeLinear(s2)
-> DequantizeLinear(s2) -> Conv / MatMul``. :func:`make_requantize_chain_model` writes a small
network in that form::

    input fp32 (1, 3, 8, 8) -> Q -> DQ
    Conv 3x3 pad 1, weight (4, 3, 3, 3): int8 per channel (s1) -> DQ -> Q per channel (s2) -> DQ
        bias int32 -> DQ; Relu -> Q -> DQ -> Flatten
    MatMul, weight (256, 10): int8 per tensor (s1) -> DQ -> Q per tensor (s2) -> DQ; Add bias
    -> Q -> DQ -> output fp32 (1, 10)

The weights are stored with a finer scale ``s1`` and requantized to ``s2 = 2.5 * s1``, so the
chain changes the values (it is no identity a pass could drop), and no value lands half way
between two levels of ``s2`` (``W / 2.5`` has fractional parts 0, .2, .4, .6, .8): ONNX and
Relax round half to even, Relay's QNN half away from zero, and ties would tell them apart.
:func:`chain_weights` gives what the chains compute, in NumPy:
``clip(round(dequantize(W, s1) / s2), -128, 127)``.

Examples
--------
>>> model = make_requantize_chain_model(0)
>>> [node.op_type for node in model.graph.node if node.output[0].startswith("fc.weight")]
['DequantizeLinear', 'QuantizeLinear', 'DequantizeLinear']
>>> {name: w.dtype.name for name, w in chain_weights(model).items()}
{'conv.weight': 'int8', 'fc.weight': 'int8'}
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "CHAIN_WEIGHTS",
    "INPUT_NAME",
    "INPUT_SHAPE",
    "OUTPUT_SCALE",
    "chain_weights",
    "make_requantize_chain_model",
]

INPUT_NAME = "input"
INPUT_SHAPE = (1, 3, 8, 8)
CHANNELS = 4
OUTPUT_SHAPE = (1, 10)
#: The output's quantization step (the last QuantizeLinear's scale).
OUTPUT_SCALE = 0.05
#: The weights stored behind a requantize chain, by initializer name prefix.
CHAIN_WEIGHTS = ("conv.weight", "fc.weight")


def _symmetric_int8(w: np.ndarray, axis: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and scales (per ``axis``, or one) with the largest magnitude at 127."""
    if axis is None:
        scale = np.array(np.abs(w).max() / 127.0, np.float32)
        return np.clip(np.round(w / scale), -127, 127).astype(np.int8), scale
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=reduce) / 127.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = scale.size
    return np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def make_requantize_chain_model(seed: int = 0, *, per_channel: bool = True) -> onnx.ModelProto:
    """The model of the module docstring, weights from ``np.random.default_rng(seed)``.

    ``per_channel=False`` quantizes the convolution's weight per tensor too: Relay's
    ``FakeQuantizationToInteger`` turns a chain into ``qnn.requantize``, whose output scale must
    be a scalar in TVM 0.16 (a per-channel chain fails its type check).
    """
    rng = np.random.default_rng(seed)
    conv_w = (rng.standard_normal((CHANNELS, 3, 3, 3)) * 0.3).astype(np.float32)
    conv_b = (rng.standard_normal(CHANNELS) * 0.1).astype(np.float32)
    fc_w = (rng.standard_normal((CHANNELS * 64, OUTPUT_SHAPE[1])) * 0.1).astype(np.float32)
    fc_b = (rng.standard_normal(OUTPUT_SHAPE[1]) * 0.1).astype(np.float32)

    initializers: List[onnx.TensorProto] = []
    nodes: List[onnx.NodeProto] = []

    def init(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def q(x: str, scale: str, zero: str, out: str, axis: Optional[int] = None) -> str:
        extra = {} if axis is None else {"axis": axis}
        nodes.append(helper.make_node("QuantizeLinear", [x, scale, zero], [out], **extra))
        return out

    def dq(x: str, scale: str, zero: str, out: str, axis: Optional[int] = None) -> str:
        extra = {} if axis is None else {"axis": axis}
        nodes.append(helper.make_node("DequantizeLinear", [x, scale, zero], [out], **extra))
        return out

    def qdq(x: str, name: str, scale: float) -> str:
        s = init(f"{name}.scale", np.array(scale, np.float32))
        z = init(f"{name}.zero_point", np.array(0, np.int8))
        return dq(q(x, s, z, f"{name}.q"), s, z, f"{name}.dq")

    def chain(name: str, w: np.ndarray, axis: Optional[int]) -> str:
        """int8 W at s1 -> DQ -> Q at s2 = 2.5 * s1 -> DQ: the requantize chain of one weight."""
        stored, s1 = _symmetric_int8(w, axis)
        zeros = np.zeros(s1.shape, np.int8)
        s1_name, z_name = init(f"{name}.s1", s1), init(f"{name}.zero_point", zeros)
        s2_name = init(f"{name}.s2", (2.5 * s1).astype(np.float32))
        first = dq(init(f"{name}.int8", stored), s1_name, z_name, f"{name}.dq1", axis)
        requantized = q(first, s2_name, z_name, f"{name}.q2", axis)
        return dq(requantized, s2_name, z_name, f"{name}.dq2", axis)

    x = qdq(INPUT_NAME, "input", 0.03)
    conv_bias_scale = np.float32(0.03 * 2.5 * np.abs(conv_w).max() / 127.0)
    conv_bias = dq(
        init("conv.bias.int32", np.round(conv_b / conv_bias_scale).astype(np.int32)),
        init("conv.bias.scale", np.array(conv_bias_scale, np.float32)),
        init("conv.bias.zero_point", np.array(0, np.int32)),
        "conv.bias",
    )
    conv_weight = chain("conv.weight", conv_w, 0 if per_channel else None)
    nodes.append(helper.make_node("Conv", [x, conv_weight, conv_bias], ["conv"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["conv"], ["relu"]))
    relu = qdq("relu", "relu", 0.02)
    nodes.append(helper.make_node("Flatten", [relu], ["flatten"], axis=1))
    nodes.append(helper.make_node("MatMul", ["flatten", chain("fc.weight", fc_w, None)], ["fc"]))
    nodes.append(helper.make_node("Add", ["fc", init("fc.bias", fc_b)], ["fc.biased"]))
    out = qdq("fc.biased", "output", OUTPUT_SCALE)
    nodes.append(helper.make_node("Identity", [out], ["output"]))

    graph = helper.make_graph(
        nodes,
        "requantize_chains",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, INPUT_SHAPE)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, OUTPUT_SHAPE)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def chain_weights(model: onnx.ModelProto) -> Dict[str, np.ndarray]:
    """What each requantize chain computes: the int8 weight at scale ``s2``, in NumPy.

    ``round`` is NumPy's half-to-even, as ONNX's QuantizeLinear and Relax's ``quantize`` round.
    """
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    result = {}
    for name in CHAIN_WEIGHTS:
        stored, s1, s2 = (values[f"{name}.{part}"] for part in ("int8", "s1", "s2"))
        shape = [1] * stored.ndim
        if s1.ndim:
            shape[0] = s1.size
        dequantized = stored.astype(np.float32) * s1.reshape(shape)
        result[name] = np.clip(np.round(dequantized / s2.reshape(shape)), -128, 127).astype(np.int8)
    return result
