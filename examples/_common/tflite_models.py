"""A small full-int8 TFLite model built without TensorFlow, its imports and an integer reference.

:func:`make_quantized_tflite_model` writes (with :class:`_common.tflite_writer.TFLiteWriter`) a
fully integer model, laid out as TFLite's converter lays out a post-training int8 model with
float input and output::

    input fp32 (1, 8, 8, 3) NHWC
    QUANTIZE                      -> int8, per-tensor
    CONV_2D 3x3 SAME, fused RELU  int8 weights OHWI (4, 3, 3, 3) per-channel, int32 bias
    RESHAPE                       -> (1, 256)
    FULLY_CONNECTED               int8 weights (10, 256) per-tensor, int32 bias
    DEQUANTIZE                    -> output fp32 (1, 10)

Weights and calibration inputs come from ``np.random.default_rng(seed)``; activation ranges are
calibrated on the float model. :func:`reference_output` computes the integer model in NumPy
(quantize, integer accumulate, rescale in float with round-half-away-from-zero, clamp); TVM's QNN
lowering rescales in fixed point, and Relax's import computes float ops between quantize /
dequantize pairs, so either agrees with it to about one output quantization step.

Examples
--------
>>> model = make_quantized_tflite_model(0)
>>> model.buffer[4:8], model.conv_weight.dtype
(b'TFL3', dtype('int8'))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .tflite_writer import Quant, TFLiteWriter

__all__ = [
    "INPUT_NAME",
    "INPUT_SHAPE",
    "OUTPUT_SHAPE",
    "QuantizedTFLiteModel",
    "import_tflite_relax",
    "import_tflite_relay",
    "make_quantized_tflite_model",
    "reference_output",
]

INPUT_NAME = "input"
INPUT_SHAPE = (1, 8, 8, 3)
CONV_CHANNELS = 4
OUTPUT_SHAPE = (1, 10)

_INT8_MIN, _INT8_MAX = -128, 127


@dataclass(frozen=True)
class QuantizedTFLiteModel:
    """The serialized model and the integer parameters written into it (for the reference)."""

    buffer: bytes
    input_q: Quant
    conv_weight: np.ndarray  # int8, OHWI
    conv_weight_q: Quant
    conv_bias: np.ndarray  # int32
    conv_out_q: Quant
    fc_weight: np.ndarray  # int8, (units, in)
    fc_weight_q: Quant
    fc_bias: np.ndarray  # int32
    output_q: Quant


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, as TFLite's reference kernels (``std::round``) and TVM's QNN do."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _quantize(x: np.ndarray, q: Quant, axis_of_x: int = -1) -> np.ndarray:
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


def _requantize(acc: np.ndarray, real_scale: np.ndarray, out: Quant, relu: bool) -> np.ndarray:
    rounded = _round_half_away(acc.astype(np.float64) * real_scale / float(out.scale.item())) + int(
        out.zero_point.item()
    )
    low = int(out.zero_point.item()) if relu else _INT8_MIN
    return np.clip(rounded, low, _INT8_MAX).astype(np.int8)


def _asymmetric(low: float, high: float) -> Quant:
    """int8 quantization covering [min(low, 0), max(high, 0)], as TFLite's converter calibrates."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255.0
    zero_point = int(np.clip(round(_INT8_MIN - low / scale), _INT8_MIN, _INT8_MAX))
    return Quant.of([scale], [zero_point])


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
    conv_weight_q = Quant.of(conv_w_scale, [0] * CONV_CHANNELS, axis=0)
    conv_weight = _quantize(w_conv, conv_weight_q, axis_of_x=0)
    fc_weight_q = Quant.of([np.abs(w_fc).max() / _INT8_MAX], [0])
    fc_weight = _quantize(w_fc, fc_weight_q)
    conv_bias = np.round(b_conv / (input_q.scale * conv_weight_q.scale)).astype(np.int32)
    fc_bias = np.round(b_fc / (conv_out_q.scale * fc_weight_q.scale)).astype(np.int32)

    params = QuantizedTFLiteModel(
        b"",
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
    return replace(params, buffer=_serialize(params))


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


def import_tflite_relax(model: QuantizedTFLiteModel, op_converter: Any = None) -> Any:
    """``tvm.relax.frontend.tflite.from_tflite`` of the model (weights as constants)."""
    from .tflite_weights import import_tflite_relax as import_buffer

    return import_buffer(model.buffer, op_converter)


# ------------------------------------------------------------------------------ serialization


def _serialize(m: QuantizedTFLiteModel) -> bytes:
    """The TFLite flatbuffer of ``m``'s parameters (``m.buffer`` is not read)."""
    import tflite

    writer = TFLiteWriter()
    fc_in = m.conv_weight.shape[0] * int(np.prod(INPUT_SHAPE[1:3]))
    conv_shape = INPUT_SHAPE[:3] + (m.conv_weight.shape[0],)
    x = writer.tensor(INPUT_NAME, INPUT_SHAPE, "float32")
    x_q = writer.tensor("input_int8", INPUT_SHAPE, "int8", quant=m.input_q)
    conv_w = writer.tensor(
        "conv/weight", m.conv_weight.shape, "int8", m.conv_weight, m.conv_weight_q
    )
    bias_q = Quant(m.input_q.scale * m.conv_weight_q.scale, np.zeros(m.conv_bias.size, np.int64))
    conv_b = writer.tensor("conv/bias", m.conv_bias.shape, "int32", m.conv_bias, bias_q)
    conv = writer.tensor("conv", conv_shape, "int8", quant=m.conv_out_q)
    flat = writer.tensor("flatten", (1, fc_in), "int8", quant=m.conv_out_q)
    fc_w = writer.tensor("fc/weight", m.fc_weight.shape, "int8", m.fc_weight, m.fc_weight_q)
    fc_bias_q = Quant(m.conv_out_q.scale * m.fc_weight_q.scale, np.zeros(1, np.int64))
    fc_b = writer.tensor("fc/bias", m.fc_bias.shape, "int32", m.fc_bias, fc_bias_q)
    fc = writer.tensor("fc", OUTPUT_SHAPE, "int8", quant=m.output_q)
    out = writer.tensor("output", OUTPUT_SHAPE, "float32")
    # The reshape's target shape is a constant input, as TFLite's converter writes it.
    shape = writer.tensor("flatten/shape", (2,), "int32", np.array([1, fc_in], np.int32))

    writer.operator("QUANTIZE", [x], [x_q])
    writer.operator(
        "CONV_2D",
        [x_q, conv_w, conv_b],
        [conv],
        "Conv2DOptions",
        Padding=tflite.Padding.SAME,
        StrideW=1,
        StrideH=1,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=tflite.ActivationFunctionType.RELU,
    )
    writer.operator("RESHAPE", [conv, shape], [flat])
    writer.operator(
        "FULLY_CONNECTED",
        [flat, fc_w, fc_b],
        [fc],
        "FullyConnectedOptions",
        FusedActivationFunction=tflite.ActivationFunctionType.NONE,
    )
    writer.operator("DEQUANTIZE", [fc], [out])
    return writer.finish(inputs=[x], outputs=[out], description="fold_guard int8 test model")
