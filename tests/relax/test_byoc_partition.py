"""The Relax BYOC path: a QDQ backend's pattern table before and after folding.

A backend that offloads quantized convs and matmuls matches ``dequantize(<int8 const>)`` weights
(``_common.relax_byoc``). On every reference model, int8 weights and float weights:

    import                                      N of N quantized convs / matmuls matched
    stock relax.transform.FoldConstant()        0 matched (every weight dequantize folded to fp32)
    fold_guard FoldConstant("qdq-accelerator")  N of N, the weights int8 constants in the composites

N is derived from the ONNX graph (Conv / Gemm / MatMul whose weight input is a DequantizeLinear of
an initializer), never hard-coded. The weights the backend receives are checked bit for bit
against what the stock pass computes for ``quantize(<constant>)``, and the partitioned module,
built for the CPU with its offloaded regions run by TVM, gives the unfolded module's output
exactly (and onnxruntime's within ``output_atol``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import onnxruntime  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models, relax_byoc
from golden import op_calls
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import fold_guard.relax as fgr

POLICY = "qdq-accelerator"
MAKERS: Dict[str, Callable[..., Any]] = {
    "qdq_cnn": onnx_models.make_qdq_cnn,
    "residual_cnn": onnx_models.make_residual_cnn,
    "transformer_block": onnx_models.make_transformer_block,
}
WEIGHT_OPS = ("Conv", "Gemm", "MatMul")


# ----------------------------------------------------------------------------------- helpers


# Every test here builds, imports or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def _onnx_weight_ops(model) -> Tuple[int, int]:
    """(ops with a quantized constant weight, all Conv / Gemm / MatMul ops) in the ONNX graph.

    A weight is quantized when input 1 is ``DequantizeLinear(<initializer>)`` or
    ``DequantizeLinear(QuantizeLinear(<initializer>))`` (weights stored in float).
    """
    producers = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name for init in model.graph.initializer}

    def quantized_constant(name: str) -> bool:
        node = producers.get(name)
        if node is None or node.op_type != "DequantizeLinear":
            return False
        source = node.input[0]
        if source in initializers:
            return True
        quantize = producers.get(source)
        return (
            quantize is not None
            and quantize.op_type == "QuantizeLinear"
            and quantize.input[0] in initializers
        )

    ops = [node for node in model.graph.node if node.op_type in WEIGHT_OPS]
    return sum(quantized_constant(node.input[1]) for node in ops), len(ops)


def _codegen_functions(mod: tvm.IRModule) -> List[relax.Function]:
    return [
        func
        for func in mod.functions.values()
        if isinstance(func, relax.Function) and func.attrs is not None and "Codegen" in func.attrs
    ]


def _sorted_arrays(arrays) -> List[np.ndarray]:
    """A canonical order for comparing two collections of arrays as multisets."""
    return sorted(arrays, key=lambda a: (a.dtype.str, a.shape, a.tobytes()))


@mutator
class _BarrierOnWeights(PyExprMutator):
    """``dequantize(w, ...)`` -> ``dequantize(fold_barrier(w), ...)``, by hand, for weights.

    ``w`` is an integer constant, or a variable bound to ``quantize(<constant>)``. ``limit``
    stops after that many (None: every one).
    """

    def __init__(self, mod: tvm.IRModule, limit: Optional[int]) -> None:
        super().__init__(mod)
        self.limit = limit
        self.placed = 0

    def _is_weight(self, data: relax.Expr) -> bool:
        if isinstance(data, tvm.ir.GenericConst):
            return "int" in str(data.value.numpy().dtype)
        bound = self.lookup_binding(data) if isinstance(data, relax.Var) else None
        return (
            isinstance(bound, relax.Call)
            and bound.op.name == "relax.quantize"
            and isinstance(bound.args[0], tvm.ir.GenericConst)
        )

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if (
            isinstance(call.op, tvm.ir.Op)
            and call.op.name == "relax.dequantize"
            and (self.limit is None or self.placed < self.limit)
            and self._is_weight(call.args[0])
            # conv / matmul weights have 2 or more dimensions; biases and norm scales have 1
            # (the callers check the count against the conv / matmul weights)
            and len(call.args[0].ty.shape) > 1
        ):
            self.placed += 1
            barrier = self.builder_.emit(fgr.fold_barrier(call.args[0]))
            return relax.Call(
                call.op, [barrier, *call.args[1:]], call.attrs, call.ty_args, call.span
            )
        return call


def _barrier_on_weights(mod: tvm.IRModule, limit: Optional[int] = None) -> Tuple[tvm.IRModule, int]:
    annotator = _BarrierOnWeights(mod, limit)
    main = annotator.visit_expr(mod["main"])
    functions = dict(mod.functions)
    functions[mod.get_global_var("main")] = main
    return tvm.IRModule(functions, attrs=mod.attrs), annotator.placed


class _Model:
    """One reference model, its import, its folds and their partitions (computed once each)."""

    def __init__(self, name: str, float_weights: bool) -> None:
        self.name = name
        self.onnx = MAKERS[name](0, float_weights=float_weights)
        self.n_quantized, self.n_ops = _onnx_weight_ops(self.onnx)
        self.imported = onnx_models.import_relax(self.onnx)
        self._cache: Dict[str, object] = {}

    def _once(self, key: str, compute: Callable[[], object]):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def stock(self) -> tvm.IRModule:
        return self._once("stock", lambda: relax.transform.FoldConstant()(self.imported))

    @property
    def ours(self) -> tvm.IRModule:
        return self._once("ours", lambda: fgr.FoldConstant(POLICY)(self.imported))

    def partitioned(self, stage: str) -> tvm.IRModule:
        return self._once(
            f"partitioned-{stage}", lambda: relax_byoc.partition_for_qdq_npu(getattr(self, stage))
        )


_MODELS: Dict[Tuple[str, bool], _Model] = {}


def _model(name: str, float_weights: bool = False) -> _Model:
    if (name, float_weights) not in _MODELS:
        _MODELS[name, float_weights] = _Model(name, float_weights)
    return _MODELS[name, float_weights]


@pytest.fixture(scope="module", params=list(MAKERS))
def model(request) -> _Model:
    return _model(request.param)


@pytest.fixture(scope="module", params=list(MAKERS))
def float_model(request) -> _Model:
    return _model(request.param, float_weights=True)


def _expect_offloaded(counts: Dict[str, int], model: _Model, offloaded: int) -> None:
    assert counts["offloaded"] == offloaded, counts
    assert counts["offloaded"] + counts["outside"] == model.n_ops, counts


# -------------------------------------------------------------------------- int8 weights


def test_counting_agrees_with_the_onnx_graph(model):
    assert model.n_quantized > 0
    assert relax_byoc.count_quantized_ops(model.imported) == model.n_quantized
    # Nothing is partitioned yet: every conv / matmul is outside.
    _expect_offloaded(relax_byoc.count_offloaded(model.imported), model, 0)


def test_import_matches_every_quantized_op(model):
    partitioned = model.partitioned("imported")
    _expect_offloaded(relax_byoc.count_offloaded(partitioned), model, model.n_quantized)
    # Partitioning moves ops, it does not lose their weight patterns.
    assert relax_byoc.count_quantized_ops(partitioned) == model.n_quantized
    # One output per offloaded region: the activation dequantize was duplicated, not leaked.
    regions = _codegen_functions(partitioned)
    assert regions and all(isinstance(func.ret_ty, relax.TensorType) for func in regions)


def test_stock_fold_leaves_nothing_to_offload(model):
    assert relax_byoc.count_quantized_ops(model.stock) == 0
    partitioned = model.partitioned("stock")
    _expect_offloaded(relax_byoc.count_offloaded(partitioned), model, 0)
    assert _codegen_functions(partitioned) == []


def test_qdq_accelerator_fold_keeps_every_pattern(model):
    assert relax_byoc.count_quantized_ops(model.ours) == model.n_quantized
    partitioned = model.partitioned("ours")
    _expect_offloaded(relax_byoc.count_offloaded(partitioned), model, model.n_quantized)
    weights = relax_byoc.composite_weights(partitioned)
    assert len(weights) == model.n_quantized
    assert {array.dtype for _, array in weights} == {np.dtype("int8")}
    # Exactly the int8 constants of the import: nothing evaluated, nothing lost.
    imported = relax_byoc.composite_weights(model.partitioned("imported"))
    assert [name for name, _ in weights] == [name for name, _ in imported]
    for got, want in zip(
        _sorted_arrays(a for _, a in weights), _sorted_arrays(a for _, a in imported)
    ):
        np.testing.assert_array_equal(got, want)


def test_dedicated_dequantize_is_what_lets_shared_activations_match(model):
    """Without the per-consumer dequantize copies, a dequantized activation read by several ops
    (residual shortcut, Q/K/V) would leak out of any composite that took it in, so the pattern
    check refuses those matches; the plain chain CNN has no shared activation and needs no copy."""
    mod = relax.transform.FuseOpsByPattern(relax_byoc.qdq_pattern_table(), bind_constants=True)(
        model.ours
    )
    counts = relax_byoc.count_offloaded(relax.transform.MergeCompositeFunctions()(mod))
    shared = len(
        op_calls(relax_byoc.dedicate_activation_dequantize(model.ours), "relax.dequantize")
    ) - len(op_calls(model.ours, "relax.dequantize"))
    if model.name == "qdq_cnn":
        assert shared == 0 and counts["offloaded"] == model.n_quantized
    else:
        assert shared > 0 and counts["offloaded"] < model.n_quantized, counts


# ------------------------------------------------------------------------- float weights


def test_float_weights_match_only_after_quantize_folds(float_model):
    model = float_model
    assert model.n_quantized == _model(model.name).n_quantized
    # quantize(<fp32 const>) is no int8 constant yet: the backend cannot take the weight.
    assert relax_byoc.count_quantized_ops(model.imported) == 0
    assert (
        relax_byoc.count_quantized_ops(model.imported, through_quantize=True) == model.n_quantized
    )
    _expect_offloaded(relax_byoc.count_offloaded(model.partitioned("imported")), model, 0)
    # Stock folds quantize and dequantize alike; ours folds the quantize into the int8 weight.
    _expect_offloaded(relax_byoc.count_offloaded(model.partitioned("stock")), model, 0)
    _expect_offloaded(
        relax_byoc.count_offloaded(model.partitioned("ours")), model, model.n_quantized
    )
    assert relax_byoc.count_quantized_ops(model.ours) == model.n_quantized


def test_float_weights_fold_to_the_stock_pass_int8_values(float_model):
    """The reference: stock FoldConstant on the import with ``dequantize(fold_barrier(quantize(W)))``
    by hand. Stock evaluates each ``quantize(W)`` itself and the barrier keeps the dequantize, so
    its int8 constants are TVM's own, independent of fold_guard's planner and evaluator."""
    model = float_model
    annotated, placed = _barrier_on_weights(model.imported)
    assert placed == model.n_quantized
    reference_mod = relax.transform.FoldConstant()(annotated)
    reference = [
        call.args[0].value.numpy()
        for call in op_calls(reference_mod, "relax.fold_barrier")
        if isinstance(call.args[0], tvm.ir.GenericConst)
    ]
    assert len(reference) == model.n_quantized  # every weight quantize folded under its barrier
    # The pattern table looks through the barriers, so the reference partitions N of N too.
    reference_partitioned = relax_byoc.partition_for_qdq_npu(reference_mod)
    _expect_offloaded(relax_byoc.count_offloaded(reference_partitioned), model, model.n_quantized)

    ours = [array for _, array in relax_byoc.composite_weights(model.partitioned("ours"))]
    assert {array.dtype for array in ours} == {np.dtype("int8")}
    for got, want in zip(_sorted_arrays(ours), _sorted_arrays(reference), strict=True):
        np.testing.assert_array_equal(got, want)
    # And they are the int8 weights onnxruntime's quantizer stored in the int8-weights model.
    stored = [
        array
        for _, array in relax_byoc.composite_weights(_model(model.name).partitioned("imported"))
    ]
    for got, want in zip(_sorted_arrays(ours), _sorted_arrays(stored), strict=True):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------- barriers


def test_hand_placed_barrier_keeps_one_pattern_through_stock_fold():
    """``dequantize(fold_barrier(<int8 const>))`` on one weight: a later stock FoldConstant folds
    every other weight, and keeps that one. The pattern table then sees the barrier call between
    the dequantize and the constant; with ``look_through_barrier`` (the default) it matches and
    the barrier lands inside the composite, without it the weight is missed."""
    model = _model("qdq_cnn")
    annotated, placed = _barrier_on_weights(model.imported, limit=1)
    assert placed == 1
    assert relax_byoc.count_quantized_ops(annotated) == model.n_quantized
    stock = relax.transform.FoldConstant()(annotated)
    assert len(op_calls(stock, "relax.fold_barrier")) == 1
    assert relax_byoc.count_quantized_ops(stock) == 1

    partitioned = relax_byoc.partition_for_qdq_npu(stock)
    _expect_offloaded(relax_byoc.count_offloaded(partitioned), model, 1)
    [(_, weight)] = relax_byoc.composite_weights(partitioned)
    assert weight.dtype == np.int8
    [region] = _codegen_functions(partitioned)
    assert len(op_calls(tvm.IRModule({"region": region}), "relax.fold_barrier")) == 1
    blind = relax_byoc.partition_for_qdq_npu(stock, look_through_barrier=False)
    _expect_offloaded(relax_byoc.count_offloaded(blind), model, 0)

    # fold_guard's pass under the backend policy keeps the barrier and every other weight too.
    ours = relax_byoc.partition_for_qdq_npu(fgr.FoldConstant(POLICY)(annotated))
    _expect_offloaded(relax_byoc.count_offloaded(ours), model, model.n_quantized)


# ------------------------------------------------------------------------------- numerics


@pytest.mark.slow
def test_partitioned_module_runs_like_the_unfolded_one(model):
    """The partitioned module (after ours), its offloaded regions compiled by TVM for the CPU
    (``strip_codegen``), gives the unfolded import's output bit for bit, and onnxruntime's within
    ``output_atol``."""
    runnable = relax_byoc.strip_codegen(model.partitioned("ours"))
    assert _codegen_functions(runnable) == []
    assert relax_byoc.count_offloaded(runnable)["offloaded"] == 0
    feed = onnx_models.input_feed(model.onnx)
    (expected,) = onnx_models.run_onnxruntime(model.onnx, feed)
    (unfolded,) = onnx_models.run_relax(model.imported, list(feed.values()))
    (partitioned,) = onnx_models.run_relax(runnable, list(feed.values()))
    np.testing.assert_array_equal(partitioned, unfolded)
    np.testing.assert_allclose(
        partitioned, expected, rtol=0, atol=onnx_models.output_atol(model.onnx)
    )
