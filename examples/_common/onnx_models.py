"""Reproducible QDQ-quantized ONNX models, their TVM imports, and reference runners.

Three small models, each built with ``onnx.helper`` from fixed-seed weights and quantized by
``onnxruntime.quantization.quantize_static`` into QDQ form (``QuantizeLinear`` /
``DequantizeLinear`` pairs around float operators, per-channel int8 weights, MinMax calibration
on 8 fixed-seed inputs), all through one helper, so they share every quantizer option:

- :func:`make_qdq_cnn`: 4 ``Conv`` + ``Relu``, ``GlobalAveragePool``, ``Gemm`` (5 weights).
  The reference workload of the Relax side of fold_guard.
- :func:`make_residual_cnn`: a stem ``Conv`` and two residual blocks (``Add`` of a block's
  output and its input; the second block downsamples, with a 1x1 stride-2 ``Conv`` on the
  shortcut), ``GlobalAveragePool``, ``Gemm`` (7 weights: 6 convolutions, 1 classifier).
- :func:`make_transformer_block`: a pre-norm encoder block on ``(1, 8, 32)`` tokens:
  ``LayerNormalization``, Q/K/V projections, 2-head attention (``MatMul``, scale ``Mul``,
  ``Softmax``), output projection, residual ``Add``, ``LayerNormalization``, ``Gemm`` ->
  ``Gelu`` -> ``Gemm`` feed-forward, residual ``Add`` (6 weights). See
  :func:`float_transformer_block` for the choices that make it import into both TVMs.

The float models of the last two are public (:func:`float_residual_cnn`,
:func:`float_transformer_block`), so tests can derive expectations from the definition
(:func:`weight_shapes`). :data:`MODEL_BUILDERS` names the three builders; :func:`input_feed`
makes a fixed-seed feed for any of them, and :func:`output_atol` the tolerance against the
reference for each (:data:`TOLERANCE_STEPS` for TVM modules that compute in float between the
Q/DQ pairs, :data:`INTEGER_TOLERANCE_STEPS` for those that compute in integers).

:func:`import_relax` imports with ``tvm.relax.frontend.onnx.from_onnx(...,
keep_params_in_input=False)``. After the import every weight is ``R.dequantize(<int8
constant>, <scale constant>, <zero-point constant>, axis=0)`` and every bias
``R.dequantize(<int32 constant>, ...)``: exactly the pattern stock
``relax.transform.FoldConstant`` destroys. With ``float_weights=True`` the weights stay fp32 and
feed ``R.quantize(<fp32 constant>) -> R.dequantize``, the pattern that should fold.
:func:`import_relay` imports into Relay (on a TVM build that has it) with weights bound as
constants; :func:`run_relax` and :func:`run_relay` build and run on the host CPU (:func:`build_relay`
builds once for many runs),
:func:`run_onnxruntime` is the reference: onnxruntime without its QDQ fusion, whose integer kernels
differ from CPU to CPU.

``onnx`` and ``onnxruntime`` belong to the ``test`` extra of the distribution, not to its runtime
dependencies, so this module imports them (and TVM's ONNX frontend) lazily, inside the functions
that need them. Importing the module itself needs only numpy.

Measured on apache-tvm 0.27.0.post1, onnx 1.23, onnxruntime 1.32 (seed 0, default options):

- QDQ CNN: the import has 55 bindings, 10 ``dequantize`` calls on constants (5 weights, 5
  biases) and no ``quantize`` of a constant; stock ``FoldConstant`` folds all 10 (plus the 5
  ``reshape`` / ``permute_dims`` on top of them), leaving 40 bindings; the folded and unfolded
  builds give bit-identical outputs.
- Residual CNN: 63 bindings, 14 ``dequantize`` of constants (7 int8 weights, 7 int32 biases);
  with ``float_weights=True`` 7 ``quantize`` of fp32 weights and 7 ``dequantize`` of biases.
  Stock ``FoldConstant`` removes all of them (63 -> 42 bindings, about 0.8 s).
- Transformer block: 104 bindings, 17 ``dequantize`` of constants (6 int8 weights, 2 int8
  ``LayerNormalization`` scales, 8 int32 biases, the uint8 ``Mul`` constant); with
  ``float_weights=True`` 9 ``quantize`` of fp32 constants (the 6 weights among them) and 8
  ``dequantize`` of biases. Stock ``FoldConstant`` removes all of them (104 -> 81 bindings,
  about 1 s).
- Quantizing takes 0.02-0.05 s, the Relax import about 0.01 s, ``tvm.compile`` 0.7-1.4 s.

On hhb-tvm 3.2.3 (TVM 0.16), onnx 1.16.2, onnxruntime 1.19.2 the imports have the same
dequantized and quantized constants (one ``qnn.dequantize`` / ``qnn.quantize`` per
``DequantizeLinear`` / ``QuantizeLinear`` of an initializer), and
``relay.transform.FakeQuantizationToInteger()`` turns the residual CNN into 6 ``qnn.conv2d``, 1
``qnn.dense`` and 2 ``qnn.add``, and the transformer block into 6 ``qnn.dense``, 2
``qnn.batch_matmul``, 2 ``qnn.add`` and 1 ``qnn.mul``, leaving ``Softmax`` (even with
``optional_qnn_ops=["nn.softmax"]``), ``Gelu`` and the ``LayerNormalization`` arithmetic in
float between their Q/DQ pairs. The Relay import takes about 1.2 s (residual CNN) and 2.7 s
(transformer block), FQ2I 0.5-0.8 s, ``relay.build`` at opt level 3 4-6.5 s per module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx
    import tvm

__all__ = [
    "FFN_WIDTH",
    "INPUT_NAME",
    "INPUT_SHAPE",
    "INTEGER_TOLERANCE_STEPS",
    "MODEL_BUILDERS",
    "NUM_CLASSES",
    "NUM_HEADS",
    "RELAY_TARGET",
    "TOKENS_NAME",
    "TOKENS_SHAPE",
    "TOLERANCE_STEPS",
    "build_relay",
    "float_residual_cnn",
    "float_transformer_block",
    "graph_inputs",
    "import_relax",
    "import_relay",
    "initializer_inputs",
    "input_feed",
    "make_qdq_cnn",
    "make_residual_cnn",
    "make_transformer_block",
    "output_atol",
    "output_scale",
    "run_onnxruntime",
    "run_relax",
    "run_relay",
    "sample_input",
    "weight_shapes",
]

#: Name of the only input of the CNNs (:func:`make_qdq_cnn`, :func:`make_residual_cnn`).
INPUT_NAME = "input"
#: Shape of that input (NCHW, float32).
INPUT_SHAPE = (1, 3, 16, 16)
#: Width of the CNNs' classifier output, shape ``(1, NUM_CLASSES)``.
NUM_CLASSES = 10

#: Name of the only input of :func:`make_transformer_block`.
TOKENS_NAME = "tokens"
#: Shape of that input and of the block's output: (batch, sequence, model width), float32.
TOKENS_SHAPE = (1, 8, 32)
#: Attention heads of :func:`make_transformer_block` (each ``TOKENS_SHAPE[2] // NUM_HEADS`` wide).
NUM_HEADS = 2
#: Hidden width of the transformer block's feed-forward network.
FFN_WIDTH = 64

#: How many quantization steps of the output scale TVM's result may differ from the reference
#: (:func:`run_onnxruntime`: onnxruntime's float operators between the Q/DQ pairs) when TVM also
#: computes in float between the pairs: the Relax and Relay imports, and every module folded or
#: partitioned from them.
#:
#: Both runtimes compute those operators in fp32, but with different kernels and summation
#: orders, so a value that lands within a rounding error of a ``.5`` boundary can round to a
#: neighbouring integer in one ``QuantizeLinear`` and not in the other. The final
#: ``DequantizeLinear`` then shows that as a difference of a multiple of the output scale.
#: ``scripts/measure_tolerance.py`` (100 inputs, input scale 0.5..3, on each model of
#: :data:`MODEL_BUILDERS` from seeds 0, 1 and 2 with uint8 and int8 activations) measured at most
#: 1 step, in at most 2 of the 100 inputs, for the Relax import (TVM 0.27) and the Relay import
#: (TVM 0.16). Two steps leave a margin for a flip in an inner layer that propagates; a larger
#: difference means a real numerical change, not rounding.
TOLERANCE_STEPS = 2

#: The same for a module that computes in integers: the Relay module after
#: ``FakeQuantizationToInteger`` (``qnn.conv2d`` / ``qnn.dense`` accumulate in int32 and
#: ``qnn.requantize`` rounds once where the reference rounds the float result, integer
#: ``qnn.add`` and average pooling round differently again). The same measurement: at most 3
#: steps for every model, and a difference of 1..3 steps in 88..100 of the 100 inputs.
INTEGER_TOLERANCE_STEPS = 4

_ACTIVATION_TYPES = ("uint8", "int8")

#: Target for building Relay modules on this machine. An explicit triple, because the reference
#: Relay build (``hhb-tvm``) defaults LLVM to riscv64, whose modules do not load on the host;
#: the host's own triple (``x86_64-linux-gnu`` here) works with any TVM build.
RELAY_TARGET = f"llvm -mtriple={platform.machine()}-linux-gnu"


def _fp32_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """Build the float model: 4 Conv+Relu, GlobalAveragePool, Flatten, Gemm."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    channels = [INPUT_SHAPE[1], 8, 16, 16, 32]
    strides = [1, 2, 1, 2]
    nodes = []
    initializers = []
    x = INPUT_NAME
    for i, stride in enumerate(strides):
        cin, cout = channels[i], channels[i + 1]
        # He-style initialisation keeps activations in a sensible range through the stack.
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        initializers.append(numpy_helper.from_array(w, f"conv{i}.weight"))
        initializers.append(numpy_helper.from_array(b, f"conv{i}.bias"))
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}_out"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}_out"], [f"relu{i}_out"], name=f"relu{i}"))
        x = f"relu{i}_out"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap_out"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap_out"], ["flat_out"], name="flatten", axis=1))
    wf = (rng.standard_normal((NUM_CLASSES, channels[-1])) * np.sqrt(1.0 / channels[-1])).astype(
        np.float32
    )
    bf = (rng.standard_normal(NUM_CLASSES) * 0.1).astype(np.float32)
    initializers.append(numpy_helper.from_array(wf, "fc.weight"))
    initializers.append(numpy_helper.from_array(bf, "fc.bias"))
    nodes.append(
        helper.make_node(
            "Gemm", ["flat_out", "fc.weight", "fc.bias"], ["output"], name="fc", transB=1
        )
    )
    graph = helper.make_graph(
        nodes,
        "fold_guard_qdq_cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, NUM_CLASSES])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="fold_guard"
    )
    # Pin the IR version: the default follows the installed onnx and may be newer than what
    # the installed onnxruntime accepts.
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


#: Messages of onnxruntime's quantizer that say nothing about these models: the advice to run its
#: pre-processing (shape inference; the models here are small and fully shaped), and the note that
#: a ``LayerNormalization`` scale (rank 1) has no axis 1 to quantize per channel along, after which
#: it quantizes that scale per tensor, which is what the transformer block documents.
_QUANTIZER_NOISE = ("pre-processing", "is out-of-range for weight")


class _DropQuantizerNoise(logging.Filter):
    """Drop the onnxruntime quantizer warnings listed in :data:`_QUANTIZER_NOISE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in _QUANTIZER_NOISE)


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root = logging.getLogger()
    noise_filter = _DropQuantizerNoise()
    root.addFilter(noise_filter)
    try:
        yield
    finally:
        root.removeFilter(noise_filter)


def _check_activation_type(activation_type: str) -> None:
    if activation_type not in _ACTIVATION_TYPES:
        raise ValueError(
            f"activation_type must be one of {_ACTIVATION_TYPES}, got {activation_type!r}"
        )


def _quantize_qdq(
    float_model: onnx.ModelProto,
    calibration: Sequence[Dict[str, np.ndarray]],
    *,
    activation_type: str,
    float_weights: bool,
    extra_options: Optional[Dict[str, object]] = None,
    per_channel: bool = True,
) -> onnx.ModelProto:
    """Quantize a float model to QDQ form with onnxruntime's ``quantize_static``.

    The one place every model of this module is quantized: ``QuantFormat.QDQ``,
    ``per_channel`` (per-channel weight scales unless False: CMSIS-NN and Arm Compute Library
    take per-tensor ones), int8 weights, ``activation_type`` activations, MinMax calibration over
    ``calibration`` (feeds, in order). ``float_weights`` adds ``AddQDQPairToWeight``;
    ``extra_options`` are passed on as well. The intermediate files live in a temporary
    directory that is removed on return.
    """
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    _check_activation_type(activation_type)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(calibration)

        def get_next(self):
            return next(self._it, None)

    options: Dict[str, object] = dict(extra_options or {})
    if float_weights:
        options["AddQDQPairToWeight"] = True
    act = QuantType.QUInt8 if activation_type == "uint8" else QuantType.QInt8

    with tempfile.TemporaryDirectory(prefix="fold_guard_qdq_") as tmp:
        src = os.path.join(tmp, "float.onnx")
        dst = os.path.join(tmp, "qdq.onnx")
        onnx.save(float_model, src)
        with _quiet_quantizer():
            quantize_static(
                src,
                dst,
                _Reader(),
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                activation_type=act,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options=options,
            )
        return onnx.load(dst)


def make_qdq_cnn(
    seed: int = 0,
    *,
    activation_type: str = "uint8",
    float_weights: bool = False,
    keep_relu: bool = True,
    per_channel: bool = True,
) -> onnx.ModelProto:
    """Build a small CNN and quantize it to per-channel QDQ form with onnxruntime.

    The float model has input ``"input"`` of shape ``(1, 3, 16, 16)`` float32, four 3x3 ``Conv``
    layers with biases (channels 3 -> 8 -> 16 -> 16 -> 32, strides 1, 2, 1, 2, each followed by
    ``Relu``), ``GlobalAveragePool``, ``Flatten`` and a ``Gemm`` classifier to output
    ``"output"`` of shape ``(1, 10)``, opset 13. Weights and the 8 calibration inputs come from
    ``np.random.default_rng(seed)``. It is quantized by ``quantize_static`` with
    ``QuantFormat.QDQ``, ``per_channel=True``, int8 weights, MinMax calibration, int32 biases.

    Parameters
    ----------
    seed : int, optional
        Seed of the generator for weights and calibration data. The same seed gives a
        byte-identical model (for a given onnx / onnxruntime version).
    activation_type : {"uint8", "int8"}, optional
        Quantized type of activations. Both import into Relax; ``"uint8"`` (the default) keeps
        activation and weight dtypes distinct, which makes the constant weights easy to tell
        apart.
    float_weights : bool, optional
        If True, weights stay fp32 initializers feeding a ``QuantizeLinear -> DequantizeLinear``
        pair (onnxruntime's ``AddQDQPairToWeight``), so the Relax import has
        ``R.quantize(<fp32 constant>)`` for each of the 5 weights. Biases stay
        ``DequantizeLinear(<int32 initializer>)`` either way.
    keep_relu : bool, optional
        If True (the default), keep the ``Relu`` nodes with their own Q/DQ pair
        (``QDQKeepRemovableActivations``). If False, onnxruntime removes them, since the
        following uint8 ``QuantizeLinear`` with zero point 0 already clamps at zero.
    per_channel : bool, optional
        Per-channel weight scales (the default); False gives one scale per weight, the form
        CMSIS-NN and Arm Compute Library take (with ``activation_type="int8"``).

    Returns
    -------
    onnx.ModelProto
        The quantized model.

    Notes
    -----
    Takes about 0.1 s (plus importing onnxruntime once). The intermediate files live in a
    temporary directory that is removed on return.
    """
    _check_activation_type(activation_type)
    rng = np.random.default_rng(seed)
    float_model = _fp32_cnn(rng)
    calibration = [
        {INPUT_NAME: rng.standard_normal(INPUT_SHAPE).astype(np.float32)} for _ in range(8)
    ]
    return _quantize_qdq(
        float_model,
        calibration,
        activation_type=activation_type,
        float_weights=float_weights,
        extra_options={"QDQKeepRemovableActivations": keep_relu},
        per_channel=per_channel,
    )


def _normal(rng: np.random.Generator, shape: Tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _finish(
    nodes: List[onnx.NodeProto],
    name: str,
    inputs: Sequence[Tuple[str, Tuple[int, ...]]],
    outputs: Sequence[Tuple[str, Tuple[int, ...]]],
    initializers: List[onnx.TensorProto],
    opset: int,
) -> onnx.ModelProto:
    """Wrap float32 nodes into a checked model (IR version pinned, as in :func:`_fp32_cnn`)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="fold_guard"
    )
    # IR version 9 is the lowest that admits opset 20; both pins stay below what the installed
    # onnxruntime versions (1.19, 1.32) accept.
    model.ir_version = 8 if opset < 20 else 9
    onnx.checker.check_model(model, full_check=True)
    return model


def float_residual_cnn(seed: int = 0) -> onnx.ModelProto:
    """The float model that :func:`make_residual_cnn` quantizes.

    Input ``"input"`` ``(1, 3, 16, 16)``; stem ``Conv`` 3 -> 8 (3x3) + ``Relu``; a residual block
    at 8 channels (``Conv`` + ``Relu``, ``Conv``, ``Add`` with the block input, ``Relu``); a
    downsampling block 8 -> 16 (3x3 stride-2 ``Conv`` + ``Relu``, 3x3 ``Conv``; shortcut 1x1
    stride-2 ``Conv``; ``Add``, ``Relu``); ``GlobalAveragePool``, ``Flatten``, ``Gemm`` to
    ``"output"`` ``(1, 10)``. Opset 13. Six ``Conv`` and one ``Gemm`` weight, each with a bias.

    Parameters
    ----------
    seed : int, optional
        Seed of ``np.random.default_rng`` for the weights.

    Returns
    -------
    onnx.ModelProto
        The float32 model.

    Examples
    --------
    >>> model = float_residual_cnn(0)
    >>> [n.op_type for n in model.graph.node].count("Conv")
    6
    """
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: List[onnx.NodeProto] = []
    initializers: List[onnx.TensorProto] = []

    def conv(x: str, name: str, cin: int, cout: int, kernel: int, stride: int) -> str:
        # He-style initialisation keeps activations in a sensible range through the stack.
        w = _normal(rng, (cout, cin, kernel, kernel), float(np.sqrt(2.0 / (cin * kernel**2))))
        b = _normal(rng, (cout,), 0.1)
        initializers.append(numpy_helper.from_array(w, f"{name}.weight"))
        initializers.append(numpy_helper.from_array(b, f"{name}.bias"))
        pad = kernel // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.weight", f"{name}.bias"],
                [f"{name}_out"],
                name=name,
                kernel_shape=[kernel, kernel],
                pads=[pad] * 4,
                strides=[stride, stride],
            )
        )
        return f"{name}_out"

    def relu(x: str, name: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [f"{name}_out"], name=name))
        return f"{name}_out"

    def block(x: str, name: str, cin: int, cout: int, stride: int) -> str:
        y = relu(conv(x, f"{name}.conv1", cin, cout, 3, stride), f"{name}.relu1")
        y = conv(y, f"{name}.conv2", cout, cout, 3, 1)
        if stride == 1 and cin == cout:
            shortcut = x
        else:
            shortcut = conv(x, f"{name}.down", cin, cout, 1, stride)
        added = f"{name}.add_out"
        nodes.append(helper.make_node("Add", [y, shortcut], [added], name=f"{name}.add"))
        return relu(added, f"{name}.relu2")

    x = relu(conv(INPUT_NAME, "stem", INPUT_SHAPE[1], 8, 3, 1), "stem.relu")
    x = block(x, "block1", 8, 8, 1)
    x = block(x, "block2", 8, 16, 2)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap_out"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap_out"], ["flat_out"], name="flatten", axis=1))
    fc_weight = _normal(rng, (NUM_CLASSES, 16), float(np.sqrt(1.0 / 16)))
    initializers.append(numpy_helper.from_array(fc_weight, "fc.weight"))
    initializers.append(numpy_helper.from_array(_normal(rng, (NUM_CLASSES,), 0.1), "fc.bias"))
    nodes.append(
        helper.make_node(
            "Gemm", ["flat_out", "fc.weight", "fc.bias"], ["output"], name="fc", transB=1
        )
    )
    return _finish(
        nodes,
        "fold_guard_residual_cnn",
        [(INPUT_NAME, INPUT_SHAPE)],
        [("output", (1, NUM_CLASSES))],
        initializers,
        opset=13,
    )


def make_residual_cnn(
    seed: int = 0, *, activation_type: str = "uint8", float_weights: bool = False
) -> onnx.ModelProto:
    """A small residual CNN (:func:`float_residual_cnn`) quantized to per-channel QDQ form.

    Quantized as :func:`make_qdq_cnn` is (``quantize_static``, QDQ, per-channel int8 weights,
    int32 biases, MinMax calibration), with 8 calibration inputs of shape :data:`INPUT_SHAPE` from
    ``np.random.default_rng((seed, 1))``. Both ``Add`` nodes get Q/DQ on their inputs and output.
    onnxruntime's default drops the ``Relu`` nodes (what ``make_qdq_cnn(keep_relu=False)`` asks
    for): the ``QuantizeLinear`` after each has its zero point at the bottom of its range, so it
    clamps at zero already. The QDQ model has 6 ``Conv``, 2 ``Add``, 1 ``Gemm``, no ``Relu``.

    Parameters
    ----------
    seed : int, optional
        Seed of the weights (``float_residual_cnn(seed)``) and of the calibration data. The same
        seed gives a byte-identical model (for a given onnx / onnxruntime version).
    activation_type : {"uint8", "int8"}, optional
        Quantized type of activations.
    float_weights : bool, optional
        If True, the 7 weights stay fp32 initializers feeding ``QuantizeLinear ->
        DequantizeLinear`` (``AddQDQPairToWeight``); biases stay int32 either way.

    Returns
    -------
    onnx.ModelProto
        The quantized model: input ``"input"`` ``(1, 3, 16, 16)``, output ``"output"``
        ``(1, 10)``, 7 weights.

    Examples
    --------
    >>> model = make_residual_cnn(0)
    >>> feed = input_feed(model)
    >>> run_onnxruntime(model, feed)[0].shape
    (1, 10)
    """
    _check_activation_type(activation_type)
    float_model = float_residual_cnn(seed)
    rng = np.random.default_rng((seed, 1))
    calibration = [
        {INPUT_NAME: rng.standard_normal(INPUT_SHAPE).astype(np.float32)} for _ in range(8)
    ]
    return _quantize_qdq(
        float_model, calibration, activation_type=activation_type, float_weights=float_weights
    )


def float_transformer_block(seed: int = 0) -> onnx.ModelProto:
    """The float model that :func:`make_transformer_block` quantizes.

    A pre-norm transformer encoder block on input ``"tokens"`` of shape :data:`TOKENS_SHAPE`
    ``(1, 8, 32)`` (sequence 8, model width 32), :data:`NUM_HEADS` = 2 heads of width 16,
    feed-forward width :data:`FFN_WIDTH` = 64, opset 20::

        x = Reshape(tokens, (8, 32))                          the (sequence, width) matrix
        a = LayerNormalization(x)
        q, k, v = Gemm(a, Wq|Wk|Wv, b, transB=1)              three 32x32 weights
        heads: Reshape (8, 2, 16); Transpose Q, V to (2, 8, 16) and K to (2, 16, 8)
        p = Softmax(Mul(MatMul(q, k), 1/4))                   (2, 8, 8)
        c = MatMul(p, v): Transpose (8, 2, 16), Reshape (8, 32)
        h = x + Gemm(c, Wo, bo)
        y = h + Gemm(Gelu(Gemm(LayerNormalization(h), W1, b1)), W2, b2)   W1 64x32, W2 32x64
        output = Reshape(y, (1, 8, 32))

    Six weight initializers (``Gemm``, stored ``(out, in)`` as ``torch.nn.Linear`` exports them)
    with their biases, two ``LayerNormalization`` with scale and bias initializers, one scalar
    ``Mul`` constant; the two ``MatMul`` nodes multiply activations.

    Two choices make the same model import into both TVMs (checked on hhb-tvm 3.2.3, TVM 0.16):

    - The linear layers are ``Gemm`` on the 2-D token matrix, not ``MatMul`` + ``Add`` on the
      3-D input. Relay's ONNX frontend imports a 3-D x 2-D ``MatMul`` as ``nn.batch_matmul``
      with a 2-D operand when the weight is not a plain constant (here it is
      ``DequantizeLinear(<int8>)``), which fails type inference; a 2-D ``MatMul`` imports as
      ``nn.dense`` without ``units``, and ``FakeQuantizationToInteger`` then crashes the
      process (segmentation fault) on the per-channel weight of that dense. ``Gemm`` imports
      as ``nn.dense(units=out)``, which FQ2I turns into ``qnn.dense``.
    - ``Gelu`` is ONNX's (opset 20, ``approximate="none"``), hence opset 20 and IR version 9;
      Relax imports it as ``R.nn.gelu``, Relay as ``0.5 x (1 + erf(x / sqrt 2))``.
      ``LayerNormalization`` (opset 17) imports in both (Relax keeps ``R.nn.layer_norm``,
      Relay decomposes it into ``mean`` / ``variance`` arithmetic).

    Parameters
    ----------
    seed : int, optional
        Seed of ``np.random.default_rng`` for the weights.

    Returns
    -------
    onnx.ModelProto
        The float32 model, output ``"output"`` of shape :data:`TOKENS_SHAPE`.

    Examples
    --------
    >>> weight_shapes(float_transformer_block(0))
    [(32, 32), (32, 32), (32, 32), (32, 32), (64, 32), (32, 64)]
    """
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    batch, seq, width = TOKENS_SHAPE
    head = width // NUM_HEADS
    nodes: List[onnx.NodeProto] = []
    initializers: List[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: List[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def layer_norm(x: str, name: str) -> str:
        gamma = const(f"{name}.scale", (1.0 + _normal(rng, (width,), 0.1)).astype(np.float32))
        beta = const(f"{name}.bias", _normal(rng, (width,), 0.1))
        return node("LayerNormalization", [x, gamma, beta], name, axis=-1, epsilon=1e-5)

    def linear(x: str, name: str, cin: int, cout: int) -> str:
        # (out, in) with transB=1, as torch.nn.Linear exports: see the docstring for why Gemm.
        w = const(f"{name}.weight", _normal(rng, (cout, cin), float(np.sqrt(1.0 / cin))))
        b = const(f"{name}.bias", _normal(rng, (cout,), 0.1))
        return node("Gemm", [x, w, b], name, transB=1)

    # Everything between the two Reshapes works on the (sequence, width) matrix: see the docstring.
    rows_shape = const("rows_shape", np.array([batch * seq, width], np.int64))
    split_shape = const("heads_shape", np.array([batch * seq, NUM_HEADS, head], np.int64))
    tokens_shape = const("tokens_shape", np.array(TOKENS_SHAPE, np.int64))

    rows = node("Reshape", [TOKENS_NAME, rows_shape], "rows")
    x = layer_norm(rows, "ln1")
    heads = {}
    for part, perm in (("q", [1, 0, 2]), ("k", [1, 2, 0]), ("v", [1, 0, 2])):
        y = linear(x, f"attn.{part}", width, width)
        y = node("Reshape", [y, split_shape], f"attn.{part}.split")
        heads[part] = node("Transpose", [y], f"attn.{part}.heads", perm=perm)
    scores = node("MatMul", [heads["q"], heads["k"]], "attn.scores")
    scale = const("attn.scale", np.array(1.0 / np.sqrt(head), np.float32))
    probs = node("Softmax", [node("Mul", [scores, scale], "attn.scaled")], "attn.softmax", axis=-1)
    ctx = node("MatMul", [probs, heads["v"]], "attn.context")
    ctx = node("Transpose", [ctx], "attn.merge", perm=[1, 0, 2])
    ctx = node("Reshape", [ctx, rows_shape], "attn.merged")
    h = node("Add", [rows, linear(ctx, "attn.out", width, width)], "attn.residual")

    y = layer_norm(h, "ln2")
    y = node("Gelu", [linear(y, "ffn.fc1", width, FFN_WIDTH)], "ffn.gelu", approximate="none")
    y = linear(y, "ffn.fc2", FFN_WIDTH, width)
    out = node("Add", [h, y], "ffn.residual")
    nodes.append(helper.make_node("Reshape", [out, tokens_shape], ["output"], name="tokens"))
    return _finish(
        nodes,
        "fold_guard_transformer_block",
        [(TOKENS_NAME, TOKENS_SHAPE)],
        [("output", TOKENS_SHAPE)],
        initializers,
        opset=20,
    )


def make_transformer_block(
    seed: int = 0, *, activation_type: str = "uint8", float_weights: bool = False
) -> onnx.ModelProto:
    """A small transformer encoder block (:func:`float_transformer_block`) in QDQ form.

    Quantized by the same ``quantize_static`` call as :func:`make_qdq_cnn` (QDQ, per-channel
    int8 weights, MinMax calibration) with 8 calibration inputs of shape :data:`TOKENS_SHAPE` from
    ``np.random.default_rng((seed, 1))``. onnxruntime quantizes the 6 ``Gemm`` weights per
    channel (int8, axis 0) with int32 biases, each ``LayerNormalization`` scale per tensor (int8;
    a rank-1 tensor has no channel axis) with an int32 bias, and the ``Mul`` constant as a
    scalar of the activation type; every activation, ``Softmax`` and ``Gelu`` included, sits
    between a ``QuantizeLinear`` / ``DequantizeLinear`` pair. So the imports have 17
    dequantized integer constants: 6 weights, 6 + 2 biases, 2 scales, the ``Mul`` constant.

    Parameters
    ----------
    seed : int, optional
        Seed of the weights (``float_transformer_block(seed)``) and of the calibration data. The
        same seed gives a byte-identical model (for a given onnx / onnxruntime version).
    activation_type : {"uint8", "int8"}, optional
        Quantized type of activations (and of the ``Mul`` constant).
    float_weights : bool, optional
        If True, every constant onnxruntime quantizes to int8 or to the activation type stays
        fp32 and feeds ``QuantizeLinear -> DequantizeLinear`` (``AddQDQPairToWeight``): the 6
        weights, the 2 ``LayerNormalization`` scales and the ``Mul`` constant, 9 in all. The 8
        int32 biases stay ``DequantizeLinear(<int32 initializer>)`` either way.

    Returns
    -------
    onnx.ModelProto
        The quantized model: input ``"tokens"`` and output ``"output"``, both ``(1, 8, 32)``.

    Examples
    --------
    >>> model = make_transformer_block(0)
    >>> run_onnxruntime(model, input_feed(model))[0].shape
    (1, 8, 32)
    """
    _check_activation_type(activation_type)
    float_model = float_transformer_block(seed)
    rng = np.random.default_rng((seed, 1))
    calibration = [
        {TOKENS_NAME: rng.standard_normal(TOKENS_SHAPE).astype(np.float32)} for _ in range(8)
    ]
    return _quantize_qdq(
        float_model, calibration, activation_type=activation_type, float_weights=float_weights
    )


def import_relax(model: onnx.ModelProto) -> tvm.IRModule:
    """Import a model into Relax with weights as constants.

    Parameters
    ----------
    model : onnx.ModelProto
        The ONNX model, for instance from :func:`make_qdq_cnn`.

    Returns
    -------
    tvm.IRModule
        ``tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)``, with no
        further normalisation: it builds as is with ``tvm.compile(mod, target="llvm")``
        (``R.quantize`` / ``R.dequantize`` are legalized by the default pipeline, no
        ``DecomposeOpsForInference`` needed). ``main`` takes the single input ``input``.
    """
    # ``tvm.relax.frontend`` does not import its ``onnx`` submodule on its own.
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(model, keep_params_in_input=False)


#: The QDQ model builders of this module by name, for parametrized tests. Each takes ``seed`` and
#: the keyword options ``activation_type`` and ``float_weights``.
MODEL_BUILDERS: Dict[str, Callable[..., onnx.ModelProto]] = {
    "qdq_cnn": make_qdq_cnn,
    "residual_cnn": make_residual_cnn,
    "transformer_block": make_transformer_block,
}


#: ``convert_config`` of :func:`import_relay`. Upstream TVM 0.16 imports ``MatMul`` of two 3-D
#: activations as ``nn.batch_matmul`` in NT form (``transpose_b=True``, after a ``transpose``);
#: ``hhb-tvm`` changed that default to the NN form, which ``FakeQuantizationToInteger`` then turns
#: into a ``qnn.batch_matmul`` of the wrong shapes (it drops ``transpose_b``; ``InternalError:
#: BatchDot: shapes of x and y is inconsistent``). Models without such a ``MatMul`` import the
#: same either way.
_RELAY_CONVERT = {"use_nt_batch_matmul": True}


def import_relay(model: onnx.ModelProto) -> tvm.IRModule:
    """Import a model into Relay with its weights bound as constants.

    Parameters
    ----------
    model : onnx.ModelProto
        The ONNX model, for instance from :func:`make_qdq_cnn`. Its inputs must have static
        shapes (those of every model here do).

    Returns
    -------
    tvm.IRModule
        ``tvm.relay.frontend.from_onnx(model, shape=...,
        convert_config={"use_nt_batch_matmul": True})`` (upstream TVM's default, see
        ``_RELAY_CONVERT``) with the returned parameters bound into ``main``
        (``relay.build_module.bind_params_by_name``) and ``InferType`` run, so
        every weight is a ``relay.Constant`` that folding can see. ``main`` takes the model's
        graph inputs (for :func:`make_qdq_cnn`, the single input ``input``).

    Notes
    -----
    On ``hhb-tvm`` 3.2.3 (TVM 0.16) the QDQ CNN imports as float operators between
    ``qnn.quantize`` / ``qnn.dequantize`` pairs (12 ``qnn.quantize``, 22 ``qnn.dequantize``;
    17 ``qnn.quantize`` with ``float_weights=True``, 5 of them on constant fp32 weights); run
    ``relay.transform.FakeQuantizationToInteger()`` to turn it into ``qnn.conv2d`` /
    ``qnn.dense`` / ``qnn.requantize``. The import takes about 1 s. For the other models see
    the module docstring.
    """
    from tvm import relay
    from tvm.relay.frontend import onnx as onnx_frontend

    shape = {name: list(dims) for name, dims in graph_inputs(model).items()}
    # ``convert_config`` updates the frontend's module-level defaults for the rest of the
    # process; restore them, so an import here does not change a later plain ``from_onnx``.
    defaults = getattr(onnx_frontend, "ONNX_DEFAULT_CONFIGS", {})
    saved = dict(defaults)
    try:
        mod, params = relay.frontend.from_onnx(model, shape=shape, convert_config=_RELAY_CONVERT)
    finally:
        defaults.clear()
        defaults.update(saved)
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
    return relay.transform.InferType()(mod)


RelayRunner = Callable[[Union[Mapping[str, np.ndarray], Sequence[np.ndarray]]], List[np.ndarray]]


def _relay_feed(
    mod: tvm.IRModule, inputs: Union[Mapping[str, np.ndarray], Sequence[np.ndarray]]
) -> Dict[str, np.ndarray]:
    """``inputs`` by parameter name of ``mod["main"]``."""
    if isinstance(inputs, Mapping):
        return dict(inputs)
    names = [param.name_hint for param in mod["main"].params]
    if len(names) != len(inputs):
        raise ValueError(f"main takes {len(names)} inputs {names}, got {len(inputs)}")
    return dict(zip(names, inputs))


def build_relay(mod: tvm.IRModule, *, opt_level: int = 3) -> RelayRunner:
    """Build a Relay module once for the host CPU; the result runs its ``main`` per call.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relay module whose ``main`` takes tensors (QNN ops are fine: ``relay.build`` lowers
        them).
    opt_level : int, optional
        ``PassContext`` opt level of the build; 3 (the default) is the usual deployment
        pipeline. QNN ops need at least 1.

    Returns
    -------
    callable
        Takes the arguments of ``main``, as a mapping by parameter name or a sequence in
        parameter order, runs the graph executor and returns the outputs of ``main`` as a list
        of numpy arrays (a tuple result flattened in order).

    Notes
    -----
    Builds with ``relay.build(mod, target=RELAY_TARGET)``. Building the QDQ CNN after
    ``FakeQuantizationToInteger`` takes about 3-4 s at opt level 3 (about 1.3 s at 1).
    """
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=opt_level):
        lib = relay.build(mod, target=RELAY_TARGET)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))

    def run(inputs: Union[Mapping[str, np.ndarray], Sequence[np.ndarray]]) -> List[np.ndarray]:
        for name, value in _relay_feed(mod, inputs).items():
            runner.set_input(name, np.ascontiguousarray(value))
        runner.run()
        return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]

    return run


def run_relay(
    mod: tvm.IRModule,
    inputs: Union[Mapping[str, np.ndarray], Sequence[np.ndarray]],
    *,
    opt_level: int = 3,
) -> List[np.ndarray]:
    """Build a Relay module for the host CPU and run its ``main`` on the graph executor once.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relay module whose ``main`` takes tensors.
    inputs : mapping of str to numpy.ndarray, or sequence of numpy.ndarray
        The arguments of ``main``, by parameter name or in parameter order.
    opt_level : int, optional
        ``PassContext`` opt level of the build (see :func:`build_relay`, which also builds once
        for many runs).

    Returns
    -------
    list of numpy.ndarray
        The outputs of ``main``; a tuple result is flattened in order.
    """
    feed = _relay_feed(mod, inputs)  # a wrong argument count fails before the build
    return build_relay(mod, opt_level=opt_level)(feed)


def run_onnxruntime(
    model: onnx.ModelProto,
    inputs: Dict[str, np.ndarray],
    *,
    fuse_qdq: bool = False,
    optimized_model_path: Optional[str] = None,
) -> List[np.ndarray]:
    """Run a model on onnxruntime's CPU provider: the reference of every comparison here.

    Parameters
    ----------
    model : onnx.ModelProto
        The model to run.
    inputs : dict of str to numpy.ndarray
        Feed, by input name.
    fuse_qdq : bool, optional
        If False (the default), onnxruntime's default graph optimizations without its QDQ
        fusion (session option ``session.disable_quant_qdq``): the float operators run between
        real Q/DQ pairs, the reference semantics of a QDQ model, which is also what TVM's
        imports compute. If True, onnxruntime's plain default, which fuses QDQ groups into
        integer kernels (``QLinearConv``, ``QLinearMatMul``, ...) whose results depend on the
        CPU (see the notes).
    optimized_model_path : str, optional
        Where onnxruntime writes the graph it runs, after its optimizations
        (``SessionOptions.optimized_model_filepath``), to see which kernels it chose.

    Returns
    -------
    list of numpy.ndarray
        All graph outputs, in graph order.

    Notes
    -----
    The fused kernels are not a reference: onnxruntime chooses its int8 kernels by the CPU's
    instructions (with or without VNNI on x86), and they do not compute the same results. The
    same models and inputs run under ``qemu-x86_64 -cpu Haswell`` (AVX2, no VNNI) and natively
    on an AVX-512 VNNI CPU differed by up to 4 output steps on :func:`make_qdq_cnn` and 12 on
    :func:`make_transformer_block` with the fusion, with uint8 and int8 activations alike
    (onnxruntime 1.19 and 1.32), and were bit-identical without it. A CI run of this project
    got exactly the Haswell run's fused outputs as its reference, 4 steps from TVM's.

    Examples
    --------
    >>> model = make_qdq_cnn(0)
    >>> run_onnxruntime(model, sample_input())[0].shape
    (1, 10)
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not fuse_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if optimized_model_path is not None:
        options.optimized_model_filepath = optimized_model_path
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return [np.asarray(out) for out in session.run(None, inputs)]


def run_relax(mod: tvm.IRModule, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """Compile a Relax module for the host CPU and run its ``main``.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module whose ``main`` takes tensors.
    inputs : list of numpy.ndarray
        Positional arguments of ``main``.

    Returns
    -------
    list of numpy.ndarray
        The outputs of ``main``; a tuple result is flattened in order.

    Notes
    -----
    Uses ``tvm.compile(mod, target="llvm")`` and ``tvm.relax.VirtualMachine`` on ``tvm.cpu()``:
    the build and run of ``fold-guard fold --check``, whose function this is.
    Compiling the QDQ CNN takes about 0.5-0.8 s.
    """
    from fold_guard.cli._check import run_relax as build_and_run

    return build_and_run(mod, inputs)


def graph_inputs(model: onnx.ModelProto) -> Dict[str, Tuple[int, ...]]:
    """The inputs a caller feeds to a model: name -> static shape, in graph order.

    Parameters
    ----------
    model : onnx.ModelProto
        A model with static input shapes (every model of this module).

    Returns
    -------
    dict of str to tuple of int
        Graph inputs that are not initializers, with their shapes.

    Examples
    --------
    >>> graph_inputs(make_transformer_block(0))
    {'tokens': (1, 8, 32)}
    """
    initializers = {init.name for init in model.graph.initializer}
    return {
        value.name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
        for value in model.graph.input
        if value.name not in initializers
    }


def initializer_inputs(model: onnx.ModelProto, op_type: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """(dtype, shape) of the initializer feeding input 0 of every ``op_type`` node, in node order.

    What an importer turns into a constant operand: for ``"DequantizeLinear"`` the stored integer
    weights and biases, for ``"QuantizeLinear"`` the fp32 weights of a ``float_weights=True`` model.

    >>> sorted(initializer_inputs(make_qdq_cnn(0, float_weights=True), "QuantizeLinear"))[-1]
    ('float32', (32, 16, 3, 3))
    """
    from onnx import numpy_helper

    initializers = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return [
        (str(initializers[node.input[0]].dtype), tuple(initializers[node.input[0]].shape))
        for node in model.graph.node
        if node.op_type == op_type and node.input[0] in initializers
    ]


def weight_shapes(model: onnx.ModelProto) -> List[Tuple[int, ...]]:
    """Shapes of the constant weights of a model's ``Conv``, ``Gemm`` and ``MatMul`` nodes.

    Works on a float model and on its QDQ form alike: a weight is input 1 of such a node that is
    an initializer, directly or through ``DequantizeLinear(<initializer>)`` or
    ``DequantizeLinear(QuantizeLinear(<initializer>))``. A ``MatMul`` of two activations has no
    weight.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    list of tuple of int
        One shape per weight, in node order (onnxruntime's quantizer may reorder nodes, so
        compare float and QDQ models as sorted lists), as stored (``Gemm`` weights of these
        models are ``(out, in)`` with ``transB=1``).

    Examples
    --------
    >>> weights = sorted(weight_shapes(float_residual_cnn(0)))
    >>> weights == sorted(weight_shapes(make_residual_cnn(0)))
    True
    """
    initializers = {init.name: tuple(init.dims) for init in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    shapes: List[Tuple[int, ...]] = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        name = node.input[1]
        # Follow DequantizeLinear and QuantizeLinear back to where the value comes from.
        while name not in initializers and name in producers:
            producer = producers[name]
            if producer.op_type not in ("DequantizeLinear", "QuantizeLinear"):
                break
            name = producer.input[0]
        if name in initializers:
            shapes.append(initializers[name])
    return shapes


def input_feed(model: onnx.ModelProto, seed: int = 1) -> Dict[str, np.ndarray]:
    """A fixed-seed feed for any model of this module (or any model with float32 inputs).

    Parameters
    ----------
    model : onnx.ModelProto
        The model; its non-initializer graph inputs must be float32 with static shapes.
    seed : int, optional
        Seed of ``np.random.default_rng``; each input in graph order takes the next standard
        normal draws.

    Returns
    -------
    dict of str to numpy.ndarray
        ``{input name: float32 array}``, in graph order, ready for :func:`run_onnxruntime` and
        :func:`run_relay` (``list(feed.values())`` for :func:`run_relax`). For the CNNs this is
        exactly ``sample_input(seed)``.

    Examples
    --------
    >>> model = make_residual_cnn(0)
    >>> {name: a.shape for name, a in input_feed(model).items()}
    {'input': (1, 3, 16, 16)}
    """
    from onnx import TensorProto

    shapes = graph_inputs(model)
    rng = np.random.default_rng(seed)
    feed: Dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name not in shapes:
            continue
        if value.type.tensor_type.elem_type != TensorProto.FLOAT:
            raise ValueError(f"input {value.name!r} is not float32; input_feed only makes float32")
        feed[value.name] = rng.standard_normal(shapes[value.name]).astype(np.float32)
    return feed


def sample_input(seed: int = 1, model: Optional[onnx.ModelProto] = None) -> Dict[str, np.ndarray]:
    """A fixed-seed input for the model of :func:`make_qdq_cnn`, or for ``model``.

    Parameters
    ----------
    seed : int, optional
        Seed of ``np.random.default_rng``.
    model : onnx.ModelProto, optional
        If given, the same as ``input_feed(model, seed)``.

    Returns
    -------
    dict of str to numpy.ndarray
        Without ``model``: ``{"input": array}``, standard normal, shape ``(1, 3, 16, 16)``,
        float32 (also the input of :func:`make_residual_cnn`).
    """
    if model is not None:
        return input_feed(model, seed)
    rng = np.random.default_rng(seed)
    return {INPUT_NAME: rng.standard_normal(INPUT_SHAPE).astype(np.float32)}


def output_scale(model: onnx.ModelProto, index: int = 0) -> float:
    """The scale of the ``DequantizeLinear`` that produces a graph output.

    Parameters
    ----------
    model : onnx.ModelProto
        A QDQ model whose output is produced by a per-tensor ``DequantizeLinear`` with a constant
        scale, as :func:`make_qdq_cnn` builds.
    index : int, optional
        Which graph output.

    Returns
    -------
    float
        The scale: one quantization step of that output.

    Raises
    ------
    ValueError
        If the output is not produced by ``DequantizeLinear`` with a scalar initializer scale.
    """
    from onnx import numpy_helper

    name = model.graph.output[index].name
    producer = next((n for n in model.graph.node if name in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        raise ValueError(f"output {name!r} is not produced by DequantizeLinear")
    scale_name = producer.input[1]
    init = next((i for i in model.graph.initializer if i.name == scale_name), None)
    if init is None:
        raise ValueError(f"scale {scale_name!r} of output {name!r} is not an initializer")
    scale = numpy_helper.to_array(init)
    if scale.size != 1:
        raise ValueError(f"output {name!r} is quantized per channel, expected one scale")
    return float(scale.reshape(()))


def output_atol(model: onnx.ModelProto, steps: int = TOLERANCE_STEPS, index: int = 0) -> float:
    """Absolute tolerance between TVM's output of a QDQ model and :func:`run_onnxruntime`'s.

    Parameters
    ----------
    model : onnx.ModelProto
        The QDQ model (see :func:`output_scale`).
    steps : int, optional
        Allowed difference in quantization steps: :data:`TOLERANCE_STEPS` (the default) for a
        module that computes in float between the Q/DQ pairs, as the imports do,
        :data:`INTEGER_TOLERANCE_STEPS` for one that computes in integers (after
        ``FakeQuantizationToInteger``).
    index : int, optional
        Which graph output.

    Returns
    -------
    float
        ``steps * output_scale(model)`` plus a relative float32 slack of 1e-5, since
        dequantized values carry float rounding (one step measures as ``scale * (1 + 7e-7)``).
        Use as ``atol`` with ``rtol=0``.

    Examples
    --------
    >>> model = make_qdq_cnn(0)
    >>> output_atol(model, INTEGER_TOLERANCE_STEPS) == 2 * output_atol(model)
    True
    """
    return steps * output_scale(model, index) * (1.0 + 1e-5)
