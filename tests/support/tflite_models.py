"""A small int8-quantized TFLite model built without TensorFlow, its Relay import and a reference.

TensorFlow would be a 274 MB wheel (``tensorflow-cpu`` 2.21 for Python 3.10) and about a gigabyte
installed, only to write one small file. The ``tflite`` package that
``tvm.relay.frontend.from_tflite`` reads models with also ships the generated FlatBuffers
*builder* functions of the TFLite schema (``ModelStart``, ``TensorAddQuantization``, ...:
module-level functions of the ``tflite.<Table>`` modules, which the package's reader classes of
the same name shadow as attributes). :func:`make_quantized_tflite_model` writes a fully integer
model with them, laid out as TFLite's converter lays out a post-training int8 model with float
input and output::

    input fp32 (1, 8, 8, 3) NHWC
    QUANTIZE                      -> int8, per-tensor
    CONV_2D 3x3 SAME, fused RELU  int8 weights OHWI (4, 3, 3, 3) per-channel, int32 bias
    RESHAPE                       -> (1, 256)
    FULLY_CONNECTED               int8 weights (10, 256) per-tensor, int32 bias
    DEQUANTIZE                    -> output fp32 (1, 10)

Weights and calibration inputs come from ``np.random.default_rng(seed)``; activation ranges are
calibrated on the float model. :func:`reference_output` computes the integer model in NumPy
(quantize, integer accumulate, rescale in float with round-half-away-from-zero, clamp); TVM's QNN
lowering rescales in fixed point, so the two agree to about one output quantization step.

Relay-only (``tflite`` is installed in the Relay environment); ``conftest.py`` leaves this module
out of the Relax environment's doctest run.

Examples
--------
>>> mod = import_tflite_relay(make_quantized_tflite_model(0))
>>> print(mod["main"].body.op.name)  # the model's last operator, DEQUANTIZE
qnn.dequantize
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import numpy as np

__all__ = [
    "INPUT_NAME",
    "INPUT_SHAPE",
    "OUTPUT_SHAPE",
    "QuantizedTFLiteModel",
    "import_tflite_relay",
    "make_quantized_tflite_model",
    "reference_output",
]

INPUT_NAME = "input"
INPUT_SHAPE = (1, 8, 8, 3)
CONV_CHANNELS = 4
OUTPUT_SHAPE = (1, 10)

_INT8_MIN, _INT8_MAX = -128, 127


def _schema(table: str) -> Any:
    """The generated module ``tflite.<table>`` (builder functions), not the reader class."""
    return importlib.import_module(f"tflite.{table}")


@dataclass(frozen=True)
class _Quant:
    """Per-tensor or per-channel (``axis``) affine quantization of one tensor."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0

    @staticmethod
    def of(scale: Sequence[float], zero_point: Sequence[int], axis: int = 0) -> _Quant:
        return _Quant(np.asarray(scale, np.float32), np.asarray(zero_point, np.int64), axis)


@dataclass(frozen=True)
class QuantizedTFLiteModel:
    """The serialized model and the integer parameters written into it (for the reference)."""

    buffer: bytes
    input_q: _Quant
    conv_weight: np.ndarray  # int8, OHWI
    conv_weight_q: _Quant
    conv_bias: np.ndarray  # int32
    conv_out_q: _Quant
    fc_weight: np.ndarray  # int8, (units, in)
    fc_weight_q: _Quant
    fc_bias: np.ndarray  # int32
    output_q: _Quant


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, as TFLite's reference kernels (``std::round``) and TVM's QNN do."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _quantize(x: np.ndarray, q: _Quant, axis_of_x: int = -1) -> np.ndarray:
    shape = [1] * x.ndim
    if q.scale.size > 1:
        shape[axis_of_x] = q.scale.size
    scaled = _round_half_away(x / q.scale.reshape(shape)) + q.zero_point.reshape(shape)
    return np.clip(scaled, _INT8_MIN, _INT8_MAX).astype(np.int8)


def _conv_nhwc_same(x: np.ndarray, w_ohwi: np.ndarray) -> np.ndarray:
    """3x3 stride-1 SAME convolution of integer (or float) NHWC input, OHWI weights, exact in int64/float64."""
    kh, kw = w_ohwi.shape[1:3]
    padded = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    n, h, w, _ = x.shape
    out = np.zeros((n, h, w, w_ohwi.shape[0]), dtype=np.result_type(x.dtype, w_ohwi.dtype))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum(
                "nhwc,oc->nhwo", padded[:, i : i + h, j : j + w, :], w_ohwi[:, i, j, :]
            )
    return out


def _requantize(acc: np.ndarray, real_scale: np.ndarray, out: _Quant, relu: bool) -> np.ndarray:
    rounded = _round_half_away(acc.astype(np.float64) * real_scale / float(out.scale.item())) + int(
        out.zero_point.item()
    )
    low = int(out.zero_point.item()) if relu else _INT8_MIN
    return np.clip(rounded, low, _INT8_MAX).astype(np.int8)


def _asymmetric(low: float, high: float) -> _Quant:
    """int8 quantization covering [min(low, 0), max(high, 0)], as TFLite's converter calibrates."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255.0
    zero_point = int(np.clip(round(_INT8_MIN - low / scale), _INT8_MIN, _INT8_MAX))
    return _Quant.of([scale], [zero_point])


def make_quantized_tflite_model(seed: int = 0) -> QuantizedTFLiteModel:
    """Build the int8 TFLite model of the module docstring.

    Parameters
    ----------
    seed : int, optional
        Seed of ``np.random.default_rng`` for the float weights and the 8 calibration inputs. The
        same seed gives byte-identical output.

    Returns
    -------
    QuantizedTFLiteModel
        ``.buffer`` is the ``.tflite`` file content; the other fields are the quantized parameters
        written into it.

    Examples
    --------
    >>> model = make_quantized_tflite_model(0)
    >>> model.buffer[4:8]  # the TFLite file identifier
    b'TFL3'
    >>> model.conv_weight.dtype, model.conv_weight.shape, model.conv_bias.dtype
    (dtype('int8'), (4, 3, 3, 3), dtype('int32'))
    """
    rng = np.random.default_rng(seed)
    cin = INPUT_SHAPE[3]
    w_conv = (rng.standard_normal((CONV_CHANNELS, 3, 3, cin)) * np.sqrt(2.0 / (9 * cin))).astype(
        np.float32
    )
    b_conv = (rng.standard_normal(CONV_CHANNELS) * 0.1).astype(np.float32)
    fc_in = int(np.prod(INPUT_SHAPE[1:3])) * CONV_CHANNELS
    w_fc = (rng.standard_normal((OUTPUT_SHAPE[1], fc_in)) * np.sqrt(1.0 / fc_in)).astype(np.float32)
    b_fc = (rng.standard_normal(OUTPUT_SHAPE[1]) * 0.1).astype(np.float32)
    calibration = rng.standard_normal((8,) + INPUT_SHAPE[1:]).astype(np.float32)

    # Calibrate activation ranges on the float model, as post-training quantization does.
    conv_float = np.maximum(
        _conv_nhwc_same(calibration.astype(np.float64), w_conv.astype(np.float64)) + b_conv, 0
    )
    fc_float = conv_float.reshape(len(calibration), -1) @ w_fc.T.astype(np.float64) + b_fc
    input_q = _asymmetric(float(calibration.min()), float(calibration.max()))
    conv_out_q = _asymmetric(0.0, float(conv_float.max()))
    output_q = _asymmetric(float(fc_float.min()), float(fc_float.max()))

    # Weights: symmetric int8, per output channel for the conv, per tensor for the dense layer.
    conv_w_scale = np.abs(w_conv).reshape(CONV_CHANNELS, -1).max(axis=1) / _INT8_MAX
    conv_weight_q = _Quant.of(conv_w_scale, [0] * CONV_CHANNELS, axis=0)
    conv_weight = _quantize(w_conv, conv_weight_q, axis_of_x=0)
    fc_weight_q = _Quant.of([np.abs(w_fc).max() / _INT8_MAX], [0])
    fc_weight = _quantize(w_fc, fc_weight_q)
    conv_bias = np.round(b_conv / (input_q.scale * conv_weight_q.scale)).astype(np.int32)
    fc_bias = np.round(b_fc / (conv_out_q.scale * fc_weight_q.scale)).astype(np.int32)

    buffer = _serialize(
        input_q,
        conv_weight,
        conv_weight_q,
        conv_bias,
        conv_out_q,
        fc_weight,
        fc_weight_q,
        fc_bias,
        output_q,
    )
    return QuantizedTFLiteModel(
        buffer,
        input_q,
        conv_weight,
        conv_weight_q,
        conv_bias,
        conv_out_q,
        fc_weight,
        fc_weight_q,
        fc_bias,
        output_q,
    )


def reference_output(model: QuantizedTFLiteModel, x: np.ndarray) -> np.ndarray:
    """The integer model in NumPy, dequantized: what a TFLite interpreter computes, up to rounding.

    Examples
    --------
    >>> model = make_quantized_tflite_model(0)
    >>> reference_output(model, np.zeros(INPUT_SHAPE, np.float32)).shape
    (1, 10)
    """
    x_q = _quantize(x, model.input_q).astype(np.int64) - int(model.input_q.zero_point.item())
    acc = _conv_nhwc_same(x_q, model.conv_weight.astype(np.int64)) + model.conv_bias
    conv = _requantize(
        acc, model.input_q.scale * model.conv_weight_q.scale, model.conv_out_q, relu=True
    )
    flat = conv.reshape(conv.shape[0], -1).astype(np.int64) - int(
        model.conv_out_q.zero_point.item()
    )
    acc = flat @ model.fc_weight.astype(np.int64).T + model.fc_bias
    out = _requantize(
        acc, model.conv_out_q.scale * model.fc_weight_q.scale, model.output_q, relu=False
    )
    return (
        (out.astype(np.float32) - float(model.output_q.zero_point.item())) * model.output_q.scale
    ).astype(np.float32)


def import_tflite_relay(model: QuantizedTFLiteModel) -> Any:
    """``relay.frontend.from_tflite`` of the model, parameters bound as constants, type-checked.

    Returns
    -------
    tvm.IRModule
        ``main`` takes ``input`` (fp32, :data:`INPUT_SHAPE`) and returns fp32 :data:`OUTPUT_SHAPE`.
    """
    import tflite
    from tvm import relay

    tfl_model = tflite.Model.GetRootAsModel(model.buffer, 0)
    mod, params = relay.frontend.from_tflite(
        tfl_model, shape_dict={INPUT_NAME: INPUT_SHAPE}, dtype_dict={INPUT_NAME: "float32"}
    )
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
    return relay.transform.InferType()(mod)


# ------------------------------------------------------------------------------ serialization


def _serialize(
    input_q: _Quant,
    conv_weight: np.ndarray,
    conv_weight_q: _Quant,
    conv_bias: np.ndarray,
    conv_out_q: _Quant,
    fc_weight: np.ndarray,
    fc_weight_q: _Quant,
    fc_bias: np.ndarray,
    output_q: _Quant,
) -> bytes:
    import flatbuffers
    import tflite

    builder = flatbuffers.Builder(4096)
    model_t, subgraph_t, tensor_t, buffer_t = (
        _schema(n) for n in ("Model", "SubGraph", "Tensor", "Buffer")
    )
    quant_t, operator_t, opcode_t = (
        _schema(n) for n in ("QuantizationParameters", "Operator", "OperatorCode")
    )
    T = tflite.TensorType

    def vector(start: Any, values: Sequence[Any], prepend: Any) -> int:
        start(builder, len(values))
        for value in reversed(values):
            prepend(value)
        return builder.EndVector()

    def int_vector(start: Any, values: Sequence[int]) -> int:
        return vector(start, [int(v) for v in values], builder.PrependInt32)

    def offsets(start: Any, values: Sequence[int]) -> int:
        return vector(start, list(values), builder.PrependUOffsetTRelative)

    # Buffers: 0 is the empty buffer every activation tensor refers to (TFLite's convention).
    buffer_data: List[bytes] = [
        b"",
        conv_weight.tobytes(),
        conv_bias.tobytes(),
        fc_weight.tobytes(),
        fc_bias.tobytes(),
    ]
    buffers = []
    for data in buffer_data:
        data_offset = builder.CreateByteVector(data) if data else None
        buffer_t.BufferStart(builder)
        if data_offset is not None:
            buffer_t.BufferAddData(builder, data_offset)
        buffers.append(buffer_t.BufferEnd(builder))

    def quantization(q: _Quant) -> int:
        scale = vector(
            quant_t.QuantizationParametersStartScaleVector,
            [float(s) for s in q.scale],
            builder.PrependFloat32,
        )
        zero = vector(
            quant_t.QuantizationParametersStartZeroPointVector,
            [int(z) for z in q.zero_point],
            builder.PrependInt64,
        )
        quant_t.QuantizationParametersStart(builder)
        quant_t.QuantizationParametersAddScale(builder, scale)
        quant_t.QuantizationParametersAddZeroPoint(builder, zero)
        quant_t.QuantizationParametersAddQuantizedDimension(builder, q.axis)
        return quant_t.QuantizationParametersEnd(builder)

    fc_in = conv_weight.shape[0] * int(np.prod(INPUT_SHAPE[1:3]))
    conv_shape = INPUT_SHAPE[:3] + (conv_weight.shape[0],)
    # (name, shape, type, buffer, quantization): index = position.
    tensor_specs: List[Tuple[str, Sequence[int], int, int, Any]] = [
        (INPUT_NAME, INPUT_SHAPE, T.FLOAT32, 0, None),  # 0
        ("input_int8", INPUT_SHAPE, T.INT8, 0, input_q),  # 1
        ("conv/weight", conv_weight.shape, T.INT8, 1, conv_weight_q),  # 2
        (
            "conv/bias",
            conv_bias.shape,
            T.INT32,
            2,
            _Quant(input_q.scale * conv_weight_q.scale, np.zeros(conv_bias.size, np.int64)),
        ),  # 3
        ("conv", conv_shape, T.INT8, 0, conv_out_q),  # 4
        ("flatten", (1, fc_in), T.INT8, 0, conv_out_q),  # 5
        ("fc/weight", fc_weight.shape, T.INT8, 3, fc_weight_q),  # 6
        (
            "fc/bias",
            fc_bias.shape,
            T.INT32,
            4,
            _Quant(conv_out_q.scale * fc_weight_q.scale, np.zeros(1, np.int64)),
        ),  # 7
        ("fc", OUTPUT_SHAPE, T.INT8, 0, output_q),  # 8
        ("output", OUTPUT_SHAPE, T.FLOAT32, 0, None),  # 9
        ("flatten/shape", (2,), T.INT32, 5, None),  # 10: RESHAPE's shape input
    ]
    # The reshape's target shape is a constant input, as TFLite's converter writes it.
    shape_data = np.array([1, fc_in], np.int32).tobytes()
    shape_offset = builder.CreateByteVector(shape_data)
    buffer_t.BufferStart(builder)
    buffer_t.BufferAddData(builder, shape_offset)
    buffers.append(buffer_t.BufferEnd(builder))

    tensors = []
    for name, shape, dtype, buffer_index, q in tensor_specs:
        name_offset = builder.CreateString(name)
        shape_offset = int_vector(tensor_t.TensorStartShapeVector, shape)
        q_offset = quantization(q) if q is not None else None
        tensor_t.TensorStart(builder)
        tensor_t.TensorAddShape(builder, shape_offset)
        tensor_t.TensorAddType(builder, dtype)
        tensor_t.TensorAddBuffer(builder, buffer_index)
        tensor_t.TensorAddName(builder, name_offset)
        if q_offset is not None:
            tensor_t.TensorAddQuantization(builder, q_offset)
        tensors.append(tensor_t.TensorEnd(builder))

    codes = [
        tflite.BuiltinOperator.QUANTIZE,
        tflite.BuiltinOperator.CONV_2D,
        tflite.BuiltinOperator.RESHAPE,
        tflite.BuiltinOperator.FULLY_CONNECTED,
        tflite.BuiltinOperator.DEQUANTIZE,
    ]
    opcodes = []
    for code in codes:
        opcode_t.OperatorCodeStart(builder)
        # Old readers look at the int8 field, new ones at the int32 one: fill both (as TFLite does).
        opcode_t.OperatorCodeAddDeprecatedBuiltinCode(builder, min(code, 127))
        opcode_t.OperatorCodeAddBuiltinCode(builder, code)
        opcode_t.OperatorCodeAddVersion(builder, 1)
        opcodes.append(opcode_t.OperatorCodeEnd(builder))

    conv_options_t, fc_options_t = _schema("Conv2DOptions"), _schema("FullyConnectedOptions")
    conv_options_t.Conv2DOptionsStart(builder)
    conv_options_t.Conv2DOptionsAddPadding(builder, tflite.Padding.SAME)
    conv_options_t.Conv2DOptionsAddStrideW(builder, 1)
    conv_options_t.Conv2DOptionsAddStrideH(builder, 1)
    conv_options_t.Conv2DOptionsAddDilationWFactor(builder, 1)
    conv_options_t.Conv2DOptionsAddDilationHFactor(builder, 1)
    conv_options_t.Conv2DOptionsAddFusedActivationFunction(
        builder, tflite.ActivationFunctionType.RELU
    )
    conv_options = conv_options_t.Conv2DOptionsEnd(builder)
    fc_options_t.FullyConnectedOptionsStart(builder)
    fc_options_t.FullyConnectedOptionsAddFusedActivationFunction(
        builder, tflite.ActivationFunctionType.NONE
    )
    fc_options = fc_options_t.FullyConnectedOptionsEnd(builder)
    # (opcode index, inputs, outputs, options type, options)
    operator_specs = [
        (0, [0], [1], tflite.BuiltinOptions.NONE, None),
        (1, [1, 2, 3], [4], tflite.BuiltinOptions.Conv2DOptions, conv_options),
        (2, [4, 10], [5], tflite.BuiltinOptions.NONE, None),
        (3, [5, 6, 7], [8], tflite.BuiltinOptions.FullyConnectedOptions, fc_options),
        (4, [8], [9], tflite.BuiltinOptions.NONE, None),
    ]
    operators = []
    for opcode_index, inputs, outputs, options_type, options in operator_specs:
        inputs_offset = int_vector(operator_t.OperatorStartInputsVector, inputs)
        outputs_offset = int_vector(operator_t.OperatorStartOutputsVector, outputs)
        operator_t.OperatorStart(builder)
        operator_t.OperatorAddOpcodeIndex(builder, opcode_index)
        operator_t.OperatorAddInputs(builder, inputs_offset)
        operator_t.OperatorAddOutputs(builder, outputs_offset)
        if options is not None:
            operator_t.OperatorAddBuiltinOptionsType(builder, options_type)
            operator_t.OperatorAddBuiltinOptions(builder, options)
        operators.append(operator_t.OperatorEnd(builder))

    tensors_offset = offsets(subgraph_t.SubGraphStartTensorsVector, tensors)
    inputs_offset = int_vector(subgraph_t.SubGraphStartInputsVector, [0])
    outputs_offset = int_vector(subgraph_t.SubGraphStartOutputsVector, [9])
    operators_offset = offsets(subgraph_t.SubGraphStartOperatorsVector, operators)
    name_offset = builder.CreateString("main")
    subgraph_t.SubGraphStart(builder)
    subgraph_t.SubGraphAddTensors(builder, tensors_offset)
    subgraph_t.SubGraphAddInputs(builder, inputs_offset)
    subgraph_t.SubGraphAddOutputs(builder, outputs_offset)
    subgraph_t.SubGraphAddOperators(builder, operators_offset)
    subgraph_t.SubGraphAddName(builder, name_offset)
    subgraph = subgraph_t.SubGraphEnd(builder)

    opcodes_offset = offsets(model_t.ModelStartOperatorCodesVector, opcodes)
    subgraphs_offset = offsets(model_t.ModelStartSubgraphsVector, [subgraph])
    buffers_offset = offsets(model_t.ModelStartBuffersVector, buffers)
    description = builder.CreateString("fold_guard int8 test model")
    model_t.ModelStart(builder)
    model_t.ModelAddVersion(builder, 3)
    model_t.ModelAddOperatorCodes(builder, opcodes_offset)
    model_t.ModelAddSubgraphs(builder, subgraphs_offset)
    model_t.ModelAddDescription(builder, description)
    model_t.ModelAddBuffers(builder, buffers_offset)
    builder.Finish(model_t.ModelEnd(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
