"""A small float TFLite model whose weights are stored in one of three forms, and its reference.

TFLite's converter stores a float model's weights as float32 tensors, or (with weight-only
quantization, or ``target_spec.supported_types = [tf.float16]``) as int8 or float16 tensors that
a DEQUANTIZE operator turns back into float32 inside the graph. :func:`make_weight_form_model`
writes the same network in each form (:data:`WEIGHT_FORMS`)::

    input fp32 (1, 8, 8, 3) NHWC
    CONV_2D 3x3 SAME, fused RELU            weights OHWI (4, 3, 3, 3), bias (4,)
    DEPTHWISE_CONV_2D 3x3 SAME, fused RELU  weights (1, 3, 3, 4), multiplier 1, bias (4,)
    ADD (the conv's output: a residual)
    RESHAPE                                 -> (1, 256)
    FULLY_CONNECTED                         weights (10, 256), bias (10,)
    output fp32 (1, 10)

``int8-dequantize``: the three weights are int8 (per output channel for the convolutions, per
tensor for the dense layer) behind DEQUANTIZE, biases float32. ``float16-dequantize``: every
weight and bias is float16 behind DEQUANTIZE, as TFLite's float16 converter writes them.
:func:`reference_output` computes the network in float64 NumPy from the weights as the graph
sees them after DEQUANTIZE.

Examples
--------
>>> model = make_weight_form_model("float16-dequantize", seed=0)
>>> model.buffer[4:8], model.conv_weight.dtype
(b'TFL3', dtype('float32'))
>>> reference_output(model, np.zeros(INPUT_SHAPE, np.float32)).shape
(1, 10)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np

from .tflite_writer import Quant, TFLiteWriter

__all__ = [
    "INPUT_NAME",
    "INPUT_SHAPE",
    "OUTPUT_SHAPE",
    "WEIGHT_FORMS",
    "WeightFormModel",
    "import_tflite_relax",
    "make_weight_form_model",
    "reference_output",
]

INPUT_NAME = "input"
INPUT_SHAPE = (1, 8, 8, 3)
CHANNELS = 4
OUTPUT_SHAPE = (1, 10)
#: How the weights are stored: float32 constants, or int8 / float16 tensors behind DEQUANTIZE.
WEIGHT_FORMS = ("float32", "int8-dequantize", "float16-dequantize")


@dataclass(frozen=True)
class WeightFormModel:
    """The serialized model and its float32 weights as the graph sees them after DEQUANTIZE."""

    form: str
    buffer: bytes
    conv_weight: np.ndarray  # OHWI
    conv_bias: np.ndarray
    depthwise_weight: np.ndarray  # (1, KH, KW, C)
    depthwise_bias: np.ndarray
    fc_weight: np.ndarray  # (units, in)
    fc_bias: np.ndarray


def _int8_symmetric(w: np.ndarray, axis: int | None) -> Tuple[np.ndarray, Quant]:
    """Symmetric int8 quantization (zero point 0, range [-127, 127]), per channel along ``axis``."""
    if axis is None:
        scale = np.array([np.abs(w).max() / 127.0], np.float32)
        shaped = scale.reshape((1,) * w.ndim)
    else:
        reduce = tuple(i for i in range(w.ndim) if i != axis)
        scale = (np.abs(w).max(axis=reduce) / 127.0).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = scale.size
        shaped = scale.reshape(shape)
    q = np.clip(np.round(w / shaped), -127, 127).astype(np.int8)
    return q, Quant.of(scale, [0] * scale.size, 0 if axis is None else axis)


def make_weight_form_model(form: str, seed: int = 0) -> WeightFormModel:
    """Build the model of the module docstring with its weights stored as ``form``.

    Parameters
    ----------
    form : str
        One of :data:`WEIGHT_FORMS`.
    seed : int, optional
        Seed of ``np.random.default_rng`` for the float weights; the same seed and form give
        byte-identical output.
    """
    if form not in WEIGHT_FORMS:
        raise ValueError(f"unknown weight form {form!r}; one of {WEIGHT_FORMS}")
    rng = np.random.default_rng(seed)
    cin = INPUT_SHAPE[3]
    fc_in = INPUT_SHAPE[1] * INPUT_SHAPE[2] * CHANNELS
    floats: Dict[str, np.ndarray] = {
        "conv/weight": rng.standard_normal((CHANNELS, 3, 3, cin)) * np.sqrt(2.0 / (9 * cin)),
        "conv/bias": rng.standard_normal(CHANNELS) * 0.1,
        "depthwise/weight": rng.standard_normal((1, 3, 3, CHANNELS)) * np.sqrt(2.0 / 9),
        "depthwise/bias": rng.standard_normal(CHANNELS) * 0.1,
        "fc/weight": rng.standard_normal((OUTPUT_SHAPE[1], fc_in)) * np.sqrt(1.0 / fc_in),
        "fc/bias": rng.standard_normal(OUTPUT_SHAPE[1]) * 0.1,
    }
    floats = {name: value.astype(np.float32) for name, value in floats.items()}
    # Per-channel axis of each weight in its stored layout (None: per tensor).
    int8_axis = {"conv/weight": 0, "depthwise/weight": 3, "fc/weight": None}

    writer = TFLiteWriter()
    seen: Dict[str, np.ndarray] = {}

    def constant(name: str) -> int:
        """The float32 tensor the graph reads for ``name``, through a DEQUANTIZE where the form has one."""
        value = floats[name]
        if form == "float32" or (form == "int8-dequantize" and name not in int8_axis):
            seen[name] = value
            return writer.tensor(name, value.shape, "float32", value)
        if form == "int8-dequantize":
            stored, quant = _int8_symmetric(value, int8_axis[name])
            source = writer.tensor(f"{name}_int8", value.shape, "int8", stored, quant)
            scale = quant.scale.reshape(
                [
                    quant.scale.size if i == quant.axis and quant.scale.size > 1 else 1
                    for i in range(value.ndim)
                ]
            )
            seen[name] = (stored.astype(np.float32) * scale).astype(np.float32)
        else:
            stored16 = value.astype(np.float16)
            source = writer.tensor(f"{name}_float16", value.shape, "float16", stored16)
            seen[name] = stored16.astype(np.float32)
        dequantized = writer.tensor(f"{name}_dequantize", value.shape, "float32")
        writer.operator("DEQUANTIZE", [source], [dequantized])
        return dequantized

    import tflite

    same, relu = tflite.Padding.SAME, tflite.ActivationFunctionType.RELU
    x = writer.tensor(INPUT_NAME, INPUT_SHAPE, "float32")
    conv = writer.tensor("conv", INPUT_SHAPE[:3] + (CHANNELS,), "float32")
    writer.operator(
        "CONV_2D",
        [x, constant("conv/weight"), constant("conv/bias")],
        [conv],
        "Conv2DOptions",
        Padding=same,
        StrideW=1,
        StrideH=1,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=relu,
    )
    depthwise = writer.tensor("depthwise", INPUT_SHAPE[:3] + (CHANNELS,), "float32")
    writer.operator(
        "DEPTHWISE_CONV_2D",
        [conv, constant("depthwise/weight"), constant("depthwise/bias")],
        [depthwise],
        "DepthwiseConv2DOptions",
        Padding=same,
        StrideW=1,
        StrideH=1,
        DepthMultiplier=1,
        DilationWFactor=1,
        DilationHFactor=1,
        FusedActivationFunction=relu,
    )
    residual = writer.tensor("residual", INPUT_SHAPE[:3] + (CHANNELS,), "float32")
    writer.operator("ADD", [conv, depthwise], [residual], "AddOptions")
    shape = writer.tensor("flatten/shape", (2,), "int32", np.array([1, fc_in], np.int32))
    flat = writer.tensor("flatten", (1, fc_in), "float32")
    writer.operator("RESHAPE", [residual, shape], [flat])
    out = writer.tensor("output", OUTPUT_SHAPE, "float32")
    writer.operator(
        "FULLY_CONNECTED",
        [flat, constant("fc/weight"), constant("fc/bias")],
        [out],
        "FullyConnectedOptions",
    )
    buffer = writer.finish(inputs=[x], outputs=[out], description=f"fold_guard {form} weights")
    return WeightFormModel(
        form,
        buffer,
        seen["conv/weight"],
        seen["conv/bias"],
        seen["depthwise/weight"],
        seen["depthwise/bias"],
        seen["fc/weight"],
        seen["fc/bias"],
    )


def _conv_nhwc_same(x: np.ndarray, w_ohwi: np.ndarray, depthwise: bool) -> np.ndarray:
    kh, kw = w_ohwi.shape[1:3]
    padded = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    n, h, w, _ = x.shape
    channels = w_ohwi.shape[3] if depthwise else w_ohwi.shape[0]
    out = np.zeros((n, h, w, channels))
    for i in range(kh):
        for j in range(kw):
            window = padded[:, i : i + h, j : j + w, :]
            if depthwise:
                out += window * w_ohwi[0, i, j, :]
            else:
                out += np.einsum("nhwc,oc->nhwo", window, w_ohwi[:, i, j, :])
    return out


def reference_output(model: WeightFormModel, x: np.ndarray) -> np.ndarray:
    """The network in float64 NumPy from the weights the graph sees, cast to float32."""
    f64 = {
        name: np.asarray(value, np.float64)
        for name, value in vars(model).items()
        if isinstance(value, np.ndarray)
    }
    conv = np.maximum(
        _conv_nhwc_same(x.astype(np.float64), f64["conv_weight"], False) + f64["conv_bias"], 0
    )
    depthwise = np.maximum(
        _conv_nhwc_same(conv, f64["depthwise_weight"], True) + f64["depthwise_bias"], 0
    )
    flat = (conv + depthwise).reshape(x.shape[0], -1)
    return (flat @ f64["fc_weight"].T + f64["fc_bias"]).astype(np.float32)


def import_tflite_relax(buffer: bytes, op_converter: Any = None) -> Any:
    """``tvm.relax.frontend.tflite.from_tflite`` of a model, with ``op_converter`` if given."""
    import tflite
    from tvm.relax.frontend.tflite import from_tflite

    kwargs = {} if op_converter is None else {"op_converter": op_converter}
    return from_tflite(
        tflite.Model.GetRootAsModel(buffer, 0),
        shape_dict={INPUT_NAME: INPUT_SHAPE},
        dtype_dict={INPUT_NAME: "float32"},
        **kwargs,
    )
