"""Annotated Relay modules through TVM's own build pipelines: ``relay.build`` and ``relay.vm.compile``.

Both pipelines (opt level 3, the host's LLVM target) lower QNN ops (QNN Legalize and
CanonicalizeOps) and then run the stock ``FoldConstant`` on the result, so without a barrier a
``qnn.dequantize(<int8 W>)`` becomes an fp32 constant and the ``cast`` of a ``qnn.dense`` /
``qnn.conv2d`` int8 weight becomes an int16 / int32 one (after ``AlterOpLayout`` even in a packed
layout). ``fold_barrier`` is stateful to stock folding, so what is under it is never evaluated at
build time: the built artefact holds the barrier's int8 constant byte for byte (graph executor:
``lib.get_params()``; VM: the executable's constants), and the computation it fed runs at run
time instead, to bit-identical outputs on every module here. ``fold_allow`` left in a module
(nothing could fold, or the module is built before fold_guard's pass ran) is an identity op there.
Either annotation is still a call of its own: an algebraic rewrite of the build whose pattern
spans it no longer matches, which can change float rounding
(:func:`test_fold_allow_that_could_not_fold_builds_and_runs` shows one).

Measured on hhb-tvm 3.2.3 (sizes of the built params of rank >= 2, the weights among them):
hand-written ``nn.dense(x, qnn.dequantize(W))`` builds with one float32 ``(1, 16, 8)`` param
(512 bytes), with a barrier on W with the int8 ``(8, 16)`` W itself (128 bytes); ``qnn.dense(x,
W)`` with an int16 ``(1, 16, 8)`` param (256 bytes), with a barrier the int8 W. The QDQ CNN after
``annotate`` and fold_guard's fold builds with 34728 bytes of float32 weights and biases, with
barriers on its 5 int8 weights with those 8600 bytes of int8 and 5616 bytes of the rest; after
FQ2I with 17200 bytes of int16 weights, with barriers with the 8600 bytes of int8. The barrier
does not always make the build smaller: the transformer block's weights are dequantized per
output channel on axis 1, and the build folds that scale broadcast to the weight's shape, so its
barrier build holds the int8 weights (8192 bytes) and a float32 scale tensor as large as each
weight (32768 bytes in all, what the float32 weights took without barriers).

``annotate`` under ``qdq-accelerator`` evaluates the weights' ``qnn.quantize`` and puts a barrier
on every ``qnn.dequantize(<int const>)`` the policy keeps (weights and biases), so its result
builds with them integer as it is. After FQ2I the weights feed ``qnn.conv2d`` / ``qnn.dense``
directly and no policy rule keeps them: the FQ2I tests put the barriers on the int8 weights
themselves (:func:`barrier_on_int8_weights`), as a backend that wants them int8 in the build would.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest
import tvm
from _common import onnx_models
from relay_ir import op_calls
from tvm import relay
from tvm.contrib import graph_executor
from tvm.runtime import vm as vm_runtime

import fold_guard.relay as fgr

TARGET = onnx_models.RELAY_TARGET  # the host's triple: hhb's default "llvm" is riscv64
RNG = np.random.default_rng(7)
W_DENSE = RNG.integers(-100, 100, size=(8, 16)).astype("int8")
W_CONV = RNG.integers(-100, 100, size=(4, 3, 3, 3)).astype("int8")

#: Outputs of a built module for its inputs.
Runner = Callable[[Dict[str, np.ndarray]], List[np.ndarray]]


# ----------------------------------------------------------------------------------- helpers


# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def build_graph(mod: tvm.IRModule) -> Tuple[List[np.ndarray], Runner]:
    """``relay.build`` at opt level 3: the built params and a runner of the graph executor."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    params = [array.numpy() for array in lib.get_params().values()]
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))

    def run(inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        runner.set_input(**inputs)
        runner.run()
        return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]

    return params, run


def build_vm(mod: tvm.IRModule) -> Tuple[List[np.ndarray], Runner]:
    """``relay.vm.compile`` at opt level 3: the executable's constants and a runner of the VM."""
    with tvm.transform.PassContext(opt_level=3):
        exe = relay.vm.compile(mod, target=TARGET)
    # Reading the constants out moves them out of the executable: put them back before running.
    constants = exe.get_late_bound_consts(0)
    arrays = [array.numpy() for array in constants.values()]
    exe.load_late_bound_consts_from_map(constants)
    machine = vm_runtime.VirtualMachine(exe, tvm.cpu())

    def run(inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        result = machine.invoke("main", **inputs)
        return (
            [result.numpy()]
            if isinstance(result, tvm.nd.NDArray)
            else [field.numpy() for field in result]
        )

    return arrays, run


BUILDERS = {"relay.build": build_graph, "relay.vm.compile": build_vm}


def barrier_operands(mod: tvm.IRModule) -> List[np.ndarray]:
    """The constant operands of every fold_barrier in ``main``."""
    return [
        call.args[0].data.numpy()
        for call in op_calls(mod["main"], "fold_barrier")
        if isinstance(call.args[0], relay.Constant)
    ]


def contains(built: List[np.ndarray], array: np.ndarray) -> bool:
    """``array`` is among the built constants: same dtype, same shape, same bytes."""
    return any(
        c.dtype == array.dtype and c.shape == array.shape and c.tobytes() == array.tobytes()
        for c in built
    )


def assert_barriers_hold_in_build(
    annotated: tvm.IRModule,
    plain_built: Tuple[List[np.ndarray], Runner],
    inputs: Dict[str, np.ndarray],
    build,
) -> None:
    """Every barrier's integer operand is in what ``build`` makes of ``annotated``, and none is in
    ``plain_built`` (the same pipeline's build of the module without barriers, where stock folds
    the weights); both run to the same bits."""
    kept = barrier_operands(annotated)
    assert kept and all(np.issubdtype(array.dtype, np.integer) for array in kept)
    annotated_constants, run_annotated = build(annotated)
    plain_constants, run_plain = plain_built
    assert all(contains(annotated_constants, array) for array in kept)
    assert not any(contains(plain_constants, array) for array in kept)
    for ours, theirs in zip(run_annotated(inputs), run_plain(inputs), strict=True):
        assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


class _BarrierOnInt8Weights(relay.ExprMutator):
    def visit_constant(self, const: relay.Constant) -> relay.Expr:
        data = const.data
        return (
            fgr.fold_barrier(const) if str(data.dtype) == "int8" and len(data.shape) >= 2 else const
        )


def barrier_on_int8_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every int8 constant of rank >= 2 (the weights of these models) under a fold_barrier."""
    return relay.transform.InferType()(
        tvm.IRModule.from_expr(_BarrierOnInt8Weights().visit(mod["main"]))
    )


# ------------------------------------------------------------------------- hand-written modules


def dequantized_dense(weight: relay.Expr) -> tvm.IRModule:
    x = relay.var("x", shape=(2, 16), dtype="float32")
    w = relay.qnn.op.dequantize(weight, relay.const(0.05), relay.const(0), axis=0)
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w)))


def dequantized_conv2d(weight: relay.Expr) -> tvm.IRModule:
    x = relay.var("x", shape=(1, 3, 8, 8), dtype="float32")
    w = relay.qnn.op.dequantize(
        weight, relay.const(np.array([0.02, 0.05, 0.1, 0.01], "float32")), relay.const(0), axis=0
    )
    y = relay.nn.relu(relay.nn.conv2d(x, w, kernel_size=(3, 3), channels=4, padding=(1, 1)))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def qnn_dense(weight: relay.Expr) -> tvm.IRModule:
    x = relay.var("x", shape=(2, 16), dtype="int8")
    y = relay.qnn.op.dense(
        x, weight, relay.const(0), relay.const(0), relay.const(0.5), relay.const(0.25), units=8
    )
    y = relay.qnn.op.requantize(
        y, relay.const(0.125), relay.const(0), relay.const(0.5), relay.const(0), out_dtype="int8"
    )
    return tvm.IRModule.from_expr(relay.Function([x], y))


HAND_WRITTEN = {
    "dequantize->nn.dense": (
        dequantized_dense,
        W_DENSE,
        {"x": RNG.uniform(-1, 1, (2, 16)).astype("float32")},
    ),
    "dequantize->nn.conv2d": (
        dequantized_conv2d,
        W_CONV,
        {"x": RNG.uniform(-1, 1, (1, 3, 8, 8)).astype("float32")},
    ),
    "qnn.dense->requantize": (
        qnn_dense,
        W_DENSE,
        {"x": RNG.integers(-60, 60, (2, 16)).astype("int8")},
    ),
}


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
@pytest.mark.parametrize("case", list(HAND_WRITTEN))
def test_hand_written_barrier_keeps_int8_weight_in_build(case: str, build) -> None:
    """
    op(x, [qnn.dequantize](fold_barrier(W_int8)))  --build-->  params hold W_int8 itself
    op(x, [qnn.dequantize](W_int8))                --build-->  W folded to float32 / int16
    """
    make, weight, inputs = HAND_WRITTEN[case]
    annotated = make(fgr.fold_barrier(relay.const(weight)))
    assert_barriers_hold_in_build(annotated, build(make(relay.const(weight))), inputs, build)


def allow_not_constant() -> Tuple[tvm.IRModule, tvm.IRModule]:
    """fold_allow(x + C) * D: the allow cannot fold (x is an input) and stays in what fold_guard returns."""
    x = relay.var("x", shape=(2, 16), dtype="float32")
    c, d = relay.const(RNG.uniform(-1, 1, (2, 16)).astype("float32")), relay.const(np.float32(3.0))
    return (
        tvm.IRModule.from_expr(
            relay.Function([x], relay.multiply(fgr.fold_allow(relay.add(x, c)), d))
        ),
        tvm.IRModule.from_expr(relay.Function([x], relay.multiply(relay.add(x, c), d))),
    )


def allow_before_our_pass() -> Tuple[tvm.IRModule, tvm.IRModule]:
    """nn.dense(x, qnn.dequantize(fold_allow(qnn.quantize(W_fp32)))) built before fold_guard ran."""
    x = relay.var("x", shape=(2, 16), dtype="float32")
    weight = relay.const(RNG.uniform(-1, 1, (8, 16)).astype("float32"))

    def module(annotate: Callable[[relay.Expr], relay.Expr]) -> tvm.IRModule:
        w = annotate(
            relay.qnn.op.quantize(
                weight, relay.const(0.01), relay.const(0), axis=0, out_dtype="int8"
            )
        )
        w = relay.qnn.op.dequantize(w, relay.const(0.01), relay.const(0), axis=0)
        return tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w)))

    return module(fgr.fold_allow), module(lambda w: w)


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
def test_fold_allow_left_before_our_pass_builds_as_identity(build) -> None:
    """An allow fold_guard never saw builds and runs exactly like the module without it."""
    annotated, plain = allow_before_our_pass()
    inputs = {"x": np.linspace(-1, 1, 32, dtype="float32").reshape(2, 16)}
    (ours,), (theirs,) = build(annotated)[1](inputs), build(plain)[1](inputs)
    assert ours.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
def test_fold_allow_that_could_not_fold_builds_and_runs(build) -> None:
    """
    fold_allow(x + C) * 3, kept by fold_guard (x is an input), builds and runs; not to the same bits:
    opt level 3 rewrites the plain (x + C) * 3 into x * 3 + <C * 3>, and the allow, a call of its
    own, hides that pattern (as any op between the two would). The two differ by the roundings of
    the intermediate values (|x * 3|, |C * 3| < 8: a float32 step there is 2**-21).
    """
    annotated, plain = allow_not_constant()
    assert op_calls(fgr.FoldConstant()(annotated)["main"], "fold_allow")
    inputs = {"x": np.linspace(-1, 1, 32, dtype="float32").reshape(2, 16)}
    (ours,), (theirs,) = build(annotated)[1](inputs), build(plain)[1](inputs)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2 * 2.0**-21)
    # The cause, as the build's own optimizer shows it (ops of the fused kernel, in post order).
    with tvm.transform.PassContext(opt_level=3):
        optimized = {
            name: relay.optimize(mod, target=TARGET)[0]
            for name, mod in (("ours", annotated), ("plain", plain))
        }
    assert [call.op.name for call in op_calls(optimized["plain"])] == ["multiply", "add"]
    assert [call.op.name for call in op_calls(optimized["ours"])] == [
        "add",
        "fold_allow",
        "multiply",
    ]


# ------------------------------------------------------------------------- the three QDQ models


@functools.cache
def _model(name: str) -> Tuple[object, tvm.IRModule]:
    """A QDQ model with fp32 weights (each feeds qnn.quantize) and its Relay import."""
    model = onnx_models.MODEL_BUILDERS[name](0, float_weights=True)
    return model, onnx_models.import_relay(model)


@pytest.fixture(scope="module", autouse=True)
def _drop_cache():
    yield
    _model.cache_clear()
    _built_import.cache_clear()


def _annotate(mod: tvm.IRModule) -> tvm.IRModule:
    """``annotate(mod, policy="qdq-accelerator")``: weight quantizes evaluated, no fold_allow left."""
    annotated = fgr.annotate(mod, policy="qdq-accelerator")
    assert not annotated.allows and not op_calls(annotated.mod["main"], "fold_allow")
    return annotated.mod


@functools.cache
def _built_import(name: str) -> Tuple[List[np.ndarray], Runner]:
    return build_graph(_model(name)[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(onnx_models.MODEL_BUILDERS))
def test_models_after_annotate(name: str) -> None:
    """
    import                                             --relay.build-->  fp32 weights
    annotate: dequantize(fold_barrier(<int8 W>)), ...  --relay.build-->  int8 W; the same bits
    (the import's weights are qnn.quantize(<fp32>) -> qnn.dequantize: the build folds both)
    """
    model, imported = _model(name)
    annotated = _annotate(imported)
    weights = [a for a in barrier_operands(annotated) if a.dtype == np.int8 and a.ndim >= 2]
    assert len(weights) == len(onnx_models.weight_shapes(model))
    assert_barriers_hold_in_build(
        annotated, _built_import(name), onnx_models.input_feed(model), build_graph
    )


@pytest.mark.slow
def test_model_annotated_vm_compile_keeps_the_weights_int8() -> None:
    """annotate's result through relay.vm.compile: int8 weights in the executable, the same bits."""
    model, imported = _model("qdq_cnn")
    assert_barriers_hold_in_build(
        _annotate(imported), build_vm(imported), onnx_models.input_feed(model), build_vm
    )


FQ2I_PIPELINES = [("relay.build", name) for name in sorted(onnx_models.MODEL_BUILDERS)] + [
    ("relay.vm.compile", "qdq_cnn")
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "pipeline, name", FQ2I_PIPELINES, ids=[f"{p}-{n}" for p, n in FQ2I_PIPELINES]
)
def test_models_after_fq2i(pipeline: str, name: str) -> None:
    """
    FQ2I(import)                                       --build-->  weights int16 / int32 (casts folded)
    fold_barrier(<int8 W>) after FQ2I, annotate, fold  --build-->  int8 W; the same bits
    """
    model, imported = _model(name)
    fq2i = relay.transform.InferType()(relay.transform.FakeQuantizationToInteger()(imported))
    barred = barrier_on_int8_weights(fgr.FoldConstant()(_annotate(fq2i)))
    # annotate's own barriers guard the layer norms' qnn.dequantize(<int const>) parameters
    weights = [a for a in barrier_operands(barred) if a.dtype == np.int8 and a.ndim >= 2]
    assert len(weights) == len(onnx_models.weight_shapes(model))
    build = BUILDERS[pipeline]
    assert_barriers_hold_in_build(barred, build(fq2i), onnx_models.input_feed(model), build)
