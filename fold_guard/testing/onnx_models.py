"""A reproducible QDQ-quantized ONNX CNN, its Relax import, and reference runners.

The model is the reference workload for the Relax side of fold_guard: a small CNN quantized by
``onnxruntime.quantization.quantize_static`` into QDQ form (``QuantizeLinear`` /
``DequantizeLinear`` pairs around float operators, per-channel int8 weights), imported with
``tvm.relax.frontend.onnx.from_onnx(..., keep_params_in_input=False)``. After the import every
weight is ``R.dequantize(<int8 constant>, <scale constant>, <zero-point constant>, axis=0)`` and
every bias ``R.dequantize(<int32 constant>, ...)``: exactly the pattern stock
``relax.transform.FoldConstant`` destroys. With ``float_weights=True`` the weights stay fp32 and
feed ``R.quantize(<fp32 constant>) -> R.dequantize``, the pattern that should fold.

The same model imports into Relay (on a TVM build that has it) with :func:`import_relay`, weights
bound as constants; :func:`run_relay` builds and runs a Relay module on the host CPU.

``onnx`` and ``onnxruntime`` belong to the ``test`` extra of the distribution, not to its runtime
dependencies, so this module imports them (and TVM's ONNX frontend) lazily, inside the functions
that need them. Importing the module itself needs only numpy.

Measured on apache-tvm 0.27.0.post1, onnx 1.23, onnxruntime 1.32 (seed 0, default options): the
import has 55 bindings, 10 ``dequantize`` calls on constants (5 weights, 5 biases) and no
``quantize`` of a constant; stock ``FoldConstant`` folds all 10 (plus the 5 ``reshape`` /
``permute_dims`` on top of them), leaving 40 bindings; the folded and unfolded builds give
bit-identical outputs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
from typing import TYPE_CHECKING, Dict, Iterator, List, Mapping, Sequence, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx
    import tvm

__all__ = [
    "INPUT_NAME",
    "INPUT_SHAPE",
    "NUM_CLASSES",
    "RELAY_TARGET",
    "TOLERANCE_STEPS",
    "import_relax",
    "import_relay",
    "make_qdq_cnn",
    "output_atol",
    "output_scale",
    "run_onnxruntime",
    "run_relax",
    "run_relay",
    "sample_input",
]

#: Name of the model's only input.
INPUT_NAME = "input"
#: Shape of the model's only input (NCHW, float32).
INPUT_SHAPE = (1, 3, 16, 16)
#: Width of the classifier output, shape ``(1, NUM_CLASSES)``.
NUM_CLASSES = 10

#: How many quantization steps of the output scale TVM's result may differ from onnxruntime's.
#:
#: Both runtimes compute the float operators between the Q/DQ pairs in fp32, but with different
#: kernels and summation orders, so a value that lands within a rounding error of a ``.5``
#: boundary can round to a neighbouring integer in one ``QuantizeLinear`` and not in the other.
#: The final ``DequantizeLinear`` then shows that as a difference of a multiple of the output
#: scale. Measured over 300 random inputs (input scale 0.5..3) on each of the models from seeds
#: 0, 1 and 2, uint8 and int8 activations, with and without onnxruntime's graph optimizations:
#: the outputs were identical in all but 1..4 of the 300 inputs, and then differed by exactly one
#: step. Two steps leave a margin for a flip in an inner layer that propagates; a larger
#: difference means a real numerical change, not rounding.
TOLERANCE_STEPS = 2

_ACTIVATION_TYPES = ("uint8", "int8")

#: Target for building Relay modules on this machine. An explicit triple, because the reference
#: Relay build (``hhb-tvm``) defaults LLVM to riscv64, whose modules do not load on the host;
#: the host's own triple (``x86_64-linux-gnu`` here) works with any TVM build.
RELAY_TARGET = f"llvm -mtriple={platform.machine()}-linux-gnu"


def _fp32_cnn(rng: np.random.Generator) -> "onnx.ModelProto":
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


class _DropPreprocessHint(logging.Filter):
    """Drop onnxruntime's "Please consider pre-processing" warnings (irrelevant here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root = logging.getLogger()
    hint_filter = _DropPreprocessHint()
    root.addFilter(hint_filter)
    try:
        yield
    finally:
        root.removeFilter(hint_filter)


def make_qdq_cnn(
    seed: int = 0,
    *,
    activation_type: str = "uint8",
    float_weights: bool = False,
    keep_relu: bool = True,
) -> "onnx.ModelProto":
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

    Returns
    -------
    onnx.ModelProto
        The quantized model.

    Notes
    -----
    Takes about 0.1 s (plus importing onnxruntime once). The intermediate files live in a
    temporary directory that is removed on return.
    """
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if activation_type not in _ACTIVATION_TYPES:
        raise ValueError(
            f"activation_type must be one of {_ACTIVATION_TYPES}, got {activation_type!r}"
        )
    rng = np.random.default_rng(seed)
    float_model = _fp32_cnn(rng)
    calibration = [
        {INPUT_NAME: rng.standard_normal(INPUT_SHAPE).astype(np.float32)} for _ in range(8)
    ]

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(calibration)

        def get_next(self):  # noqa: ANN201 - onnxruntime's signature
            return next(self._it, None)

    extra_options = {"QDQKeepRemovableActivations": keep_relu}
    if float_weights:
        extra_options["AddQDQPairToWeight"] = True
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
                per_channel=True,
                activation_type=act,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options=extra_options,
            )
        return onnx.load(dst)


def import_relax(model: "onnx.ModelProto") -> "tvm.IRModule":
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


def import_relay(model: "onnx.ModelProto") -> "tvm.IRModule":
    """Import a model into Relay with its weights bound as constants.

    Parameters
    ----------
    model : onnx.ModelProto
        The ONNX model, for instance from :func:`make_qdq_cnn`. Its inputs must have static
        shapes (those of :func:`make_qdq_cnn` do).

    Returns
    -------
    tvm.IRModule
        ``tvm.relay.frontend.from_onnx(model, shape=...)`` with the returned parameters bound
        into ``main`` (``relay.build_module.bind_params_by_name``) and ``InferType`` run, so
        every weight is a ``relay.Constant`` that folding can see. ``main`` takes the model's
        graph inputs (for :func:`make_qdq_cnn`, the single input ``input``).

    Notes
    -----
    On ``hhb-tvm`` 3.2.3 (TVM 0.16) the QDQ CNN imports as float operators between
    ``qnn.quantize`` / ``qnn.dequantize`` pairs (12 ``qnn.quantize``, 22 ``qnn.dequantize``;
    17 ``qnn.quantize`` with ``float_weights=True``, 5 of them on constant fp32 weights); run
    ``relay.transform.FakeQuantizationToInteger()`` to turn it into ``qnn.conv2d`` /
    ``qnn.dense`` / ``qnn.requantize``. The import takes about 1 s.
    """
    from tvm import relay

    initializers = {init.name for init in model.graph.initializer}
    shape = {
        value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim]
        for value in model.graph.input
        if value.name not in initializers
    }
    mod, params = relay.frontend.from_onnx(model, shape=shape)
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
    return relay.transform.InferType()(mod)


def run_relay(
    mod: "tvm.IRModule",
    inputs: Union[Mapping[str, np.ndarray], Sequence[np.ndarray]],
    *,
    opt_level: int = 3,
) -> List[np.ndarray]:
    """Build a Relay module for the host CPU and run its ``main`` on the graph executor.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relay module whose ``main`` takes tensors (QNN ops are fine: ``relay.build`` lowers
        them).
    inputs : mapping of str to numpy.ndarray, or sequence of numpy.ndarray
        The arguments of ``main``, by parameter name or in parameter order.
    opt_level : int, optional
        ``PassContext`` opt level of the build; 3 (the default) is the usual deployment
        pipeline. QNN ops need at least 1.

    Returns
    -------
    list of numpy.ndarray
        The outputs of ``main``; a tuple result is flattened in order.

    Notes
    -----
    Builds with ``relay.build(mod, target=RELAY_TARGET)``. Building the QDQ CNN after
    ``FakeQuantizationToInteger`` takes about 3-4 s at opt level 3 (about 1.3 s at 1).
    """
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    if isinstance(inputs, Mapping):
        feed = dict(inputs)
    else:
        names = [param.name_hint for param in mod["main"].params]
        if len(names) != len(inputs):
            raise ValueError(f"main takes {len(names)} inputs {names}, got {len(inputs)}")
        feed = dict(zip(names, inputs))
    with tvm.transform.PassContext(opt_level=opt_level):
        lib = relay.build(mod, target=RELAY_TARGET)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for name, value in feed.items():
        runner.set_input(name, np.ascontiguousarray(value))
    runner.run()
    return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]


def run_onnxruntime(model: "onnx.ModelProto", inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Run a model on onnxruntime's CPU provider.

    Parameters
    ----------
    model : onnx.ModelProto
        The model to run.
    inputs : dict of str to numpy.ndarray
        Feed, by input name.

    Returns
    -------
    list of numpy.ndarray
        All graph outputs, in graph order.

    Notes
    -----
    The session uses onnxruntime's default graph optimizations (which fuse QDQ groups into
    integer kernels); with optimizations disabled the difference from TVM is of the same size
    (see :data:`TOLERANCE_STEPS`).
    """
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in session.run(None, inputs)]


def _to_tensor(array: np.ndarray):
    import tvm

    # TVM 0.27's name; older releases will go through the compatibility module.
    return tvm.runtime.tensor(array, tvm.cpu())


def _flatten_outputs(result) -> List[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    outputs: List[np.ndarray] = []
    for item in result:
        outputs.extend(_flatten_outputs(item))
    return outputs


def run_relax(mod: "tvm.IRModule", inputs: List[np.ndarray]) -> List[np.ndarray]:
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
    Uses ``tvm.compile(mod, target="llvm")`` and ``tvm.relax.VirtualMachine`` on ``tvm.cpu()``.
    Compiling the QDQ CNN takes about 0.5-0.8 s.
    """
    import tvm
    from tvm import relax

    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    result = vm["main"](*[_to_tensor(np.ascontiguousarray(x)) for x in inputs])
    return _flatten_outputs(result)


def sample_input(seed: int = 1) -> Dict[str, np.ndarray]:
    """A fixed-seed input for the model of :func:`make_qdq_cnn`.

    Parameters
    ----------
    seed : int, optional
        Seed of ``np.random.default_rng``.

    Returns
    -------
    dict of str to numpy.ndarray
        ``{"input": array}``, standard normal, shape ``(1, 3, 16, 16)``, float32.
    """
    rng = np.random.default_rng(seed)
    return {INPUT_NAME: rng.standard_normal(INPUT_SHAPE).astype(np.float32)}


def output_scale(model: "onnx.ModelProto", index: int = 0) -> float:
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


def output_atol(model: "onnx.ModelProto", steps: int = TOLERANCE_STEPS, index: int = 0) -> float:
    """Absolute tolerance between TVM's and onnxruntime's output of a QDQ model.

    Parameters
    ----------
    model : onnx.ModelProto
        The QDQ model (see :func:`output_scale`).
    steps : int, optional
        Allowed difference in quantization steps; :data:`TOLERANCE_STEPS` by default.
    index : int, optional
        Which graph output.

    Returns
    -------
    float
        ``steps * output_scale(model)`` plus a relative float32 slack of 1e-5, since
        dequantized values carry float rounding (one step measures as ``scale * (1 + 7e-7)``).
        Use as ``atol`` with ``rtol=0``.
    """
    return steps * output_scale(model, index) * (1.0 + 1e-5)
