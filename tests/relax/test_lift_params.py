"""Weights as parameters: the decision holds through LiftTransformParams (RFC.md, guarantee 3).

Where a model's weights are parameters of ``main`` (``num_input``), weight-only work is evaluated
ahead of run time by ``relax.transform.LiftTransformParams`` (and ``LazyTransformParams``), not by
a fold. ``annotate`` carries a policy onto that path:

    main(x, w: f32)  q = quantize(w); dq = dequantize(q); y = matmul(x, dq)
      annotate(keep-qdq-weights)  ==>  q; s = stop_lift_params(q); b = fold_barrier(s); dq(b)
      LiftTransformParams         ==>  main_transform_params(w) -> q (int8)
                                       main(x, q: i8)  b = fold_barrier(q); dq(b); y = matmul(x, dq)

Stock lifting alone moves ``dq`` into the transform and hands ``main`` an fp32 weight.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest
import tvm
import tvm_ffi
from _common import onnx_models
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr
from fold_guard import Action, Reason

KEEP = "keep-qdq-weights"

# ----------------------------------------------------------------------------------- modules


@I.ir_module
class QuantizedWeight:
    @R.function
    def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            # a weight parameter: lifted by stock; under keep-qdq-weights, q is lifted ...
            q = R.quantize(w, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="int8")
            # ... and dq stays in main for the backend's pattern
            dq = R.dequantize(q, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, dq)  # reads the run-time input x: never lifted
            R.output(y)
        return y


@I.ir_module
class QuantizedWeightAnnotated:
    @R.function
    def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            q = R.quantize(w, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="int8")
            s = R.builtin.stop_lift_params(q)
            b = R.fold_barrier(s)
            dq = R.dequantize(b, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, dq)
            R.output(y)
        return y


@I.ir_module
class QuantizedWeightLifted:
    @R.function
    def main_transform_params(
        params: R.Tuple(R.Tensor((4, 4), "float32")),
    ) -> R.Tuple(R.Tensor((4, 4), "int8")):
        R.func_attr({"num_input": 0})
        with R.dataflow():
            w = params[0]
            q = R.quantize(w, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="int8")
            out = (q,)
            R.output(out)
        return out

    @R.function
    def main(x: R.Tensor((1, 4), "float32"), q: R.Tensor((4, 4), "int8")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            b = R.fold_barrier(q)
            dq = R.dequantize(b, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, dq)
            R.output(y)
        return y


def _hand_placed_barrier(*, raw: bool = False) -> tvm.IRModule:
    """The tracker's example: a barrier placed by hand on an int8 weight parameter.

    With ``raw``, the barrier is a bare ``relax.Call`` of the op, not built by
    ``fgr.fold_barrier`` (as in a module made elsewhere and loaded from JSON).
    """
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            barrier = (
                relax.Call(tvm.ir.Op.get("relax.fold_barrier"), [w]) if raw else fgr.fold_barrier(w)
            )
            wb = bb.emit(barrier)
            wdq = bb.emit(
                relax.op.dequantize(wb, relax.const(0.01), relax.const(0, "int8"), axis=1)
            )
            y = bb.emit_output(relax.op.matmul(x, wdq))
        bb.emit_func_output(y)
    return bb.get()


@I.ir_module
class HandPlacedScript:
    @R.function
    def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "int8")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            wb = R.fold_barrier(w)  # over a weight parameter: parsed onto stop_lift_params
            wdq = R.dequantize(wb, R.const(0.01), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, wdq)
            R.output(y)
        return y


@I.ir_module
class HandPlacedLifted:
    @R.function
    def main_transform_params(
        params: R.Tuple(R.Tensor((4, 4), "int8")),
    ) -> R.Tuple(R.Tensor((4, 4), "int8")):
        R.func_attr({"num_input": 0})
        return params

    @R.function
    def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "int8")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            wb = R.fold_barrier(w)
            wdq = R.dequantize(wb, R.const(0.01), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, wdq)
            R.output(y)
        return y


# ----------------------------------------------------------------------------------- helpers


def _op_names(func: relax.Function) -> List[str]:
    return [
        b.value.op.name
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]


def _call_labels(func: relax.Function) -> set:
    return {
        b.var.name
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
    }


def _build(mod: tvm.IRModule) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def _run_lifted(mod: tvm.IRModule, inputs: Sequence[np.ndarray], weights: Sequence[np.ndarray]):
    """Build a lifted module, run its transform on ``weights`` and ``main`` on its result."""
    vm = _build(mod)
    transformed = vm["main_transform_params"]([tvm.runtime.tensor(w) for w in weights])
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs], *transformed)
    return out.numpy(), [t.numpy() for t in transformed]


# ----------------------------------------------------------------------------------- structure


def test_annotate_keeps_the_weight_dequantize_at_run_time_through_lift_transform_params():
    annotated = fgr.annotate(QuantizedWeight, policy=KEEP)
    tvm.ir.assert_structural_equal(annotated.mod, QuantizedWeightAnnotated)
    assert [str(p) for p in annotated.placed] == [
        "main: fold_barrier over stop_lift_params on q: int8[4, 4] (input 0 of dq = "
        "relax.dequantize; computed from weight parameters) [keep-dequantize-of-integer-constant]"
    ]
    lifted = relax.transform.LiftTransformParams()(annotated.mod)
    tvm.ir.assert_structural_equal(lifted, QuantizedWeightLifted)


def test_stock_lifting_alone_hands_main_an_fp32_weight():
    """The failure the annotation fixes, asserted so the test above cannot pass by accident."""
    lifted = relax.transform.LiftTransformParams()(QuantizedWeight)
    assert _op_names(lifted["main"]) == ["relax.matmul"]
    assert [str(p.ty.dtype) for p in lifted["main"].params] == ["float32", "float32"]


_LAZY = [
    relax.transform.ToNonDataflow(),
    relax.transform.RemovePurityChecking(),
    relax.transform.LazyTransformParams(),
]


@pytest.mark.parametrize("built", ["builder", "tvmscript"])
def test_a_hand_placed_barrier_on_a_weight_holds_through_lifting(built):
    """fgr.fold_barrier(w) / R.fold_barrier(w) on a weight parameter stands on stop_lift_params,
    as annotate writes it, so LiftTransformParams and LazyTransformParams keep it in main."""
    mod = _hand_placed_barrier() if built == "builder" else HandPlacedScript
    assert _op_names(mod["main"]) == [
        "relax.builtin.stop_lift_params",
        "relax.fold_barrier",
        "relax.dequantize",
        "relax.matmul",
    ]
    lifted = relax.transform.LiftTransformParams()(mod)
    tvm.ir.assert_structural_equal(lifted, HandPlacedLifted)
    lazy = tvm.ir.transform.Sequential(_LAZY)(lifted)
    assert _op_names(lazy["main"]) == ["relax.fold_barrier", "relax.dequantize", "relax.matmul"]
    assert [str(p.ty.dtype) for p in lazy["main"].params] == ["float32", "int8"]
    # Nothing left for annotate to carry: the stop is there already.
    assert fgr.annotate(mod, policy="default").placed == ()
    # A lifting's result prints and parses back as it is (no stop is added to its main).
    tvm.ir.assert_structural_equal(tvm.script.from_source(lifted.script()), lifted)


def test_a_barrier_the_builders_did_not_make_holds_once_annotated():
    """A bare relax.Call of the op (a module built elsewhere) has no stop: stock lifting takes
    the barrier along, and annotate puts the stop under it."""
    mod = _hand_placed_barrier(raw=True)
    stock = relax.transform.LiftTransformParams()(mod)
    assert _op_names(stock["main"]) == ["relax.matmul"]  # the barrier alone is lifted away
    annotated = fgr.annotate(mod, policy="default")
    assert [str(p) for p in annotated.placed] == [
        "main: stop_lift_params under the barrier lv (its operand w: int8[4, 4] is computed "
        "from weight parameters) [fold_barrier]"
    ]
    assert annotated.barriers == () and len(annotated.lift_stops) == 1
    lifted = relax.transform.LiftTransformParams()(annotated.mod)
    tvm.ir.assert_structural_equal(lifted, HandPlacedLifted)
    # Annotating the annotated module again changes nothing.
    again = fgr.annotate(annotated.mod, policy="default")
    assert again.placed == ()
    tvm.ir.assert_structural_equal(again.mod, annotated.mod)


def test_a_hand_placed_barrier_on_a_weight_runs_bit_for_bit_lifted_or_not():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4)).astype("float32")
    w = rng.integers(-128, 128, (4, 4), dtype="int8")
    mod = _hand_placed_barrier()
    expected = _build(mod)["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    lifted, (q,) = _run_lifted(relax.transform.LiftTransformParams()(mod), [x], [w])
    assert q.dtype == np.int8
    np.testing.assert_array_equal(lifted, expected)


def test_without_a_decision_to_carry_the_stock_lifting_is_unchanged():
    annotated = fgr.annotate(QuantizedWeight, policy="default")
    assert annotated.placed == ()
    tvm.ir.assert_structural_equal(annotated.mod, QuantizedWeight)
    tvm.ir.assert_structural_equal(
        relax.transform.LiftTransformParams()(annotated.mod),
        relax.transform.LiftTransformParams()(QuantizedWeight),
    )


def test_the_plan_says_what_is_lifted_and_what_stays():
    plan = fgr.plan(QuantizedWeight, policy=KEEP)
    assert [(d.label, d.action, d.rule) for d in plan.decisions] == [
        ("q", Action.LIFT, "fold-quantize-of-constant"),
        ("dq", Action.KEEP, "keep-dequantize-of-integer-constant"),
        ("y", Action.KEEP, ""),
    ]
    result = fgr.fold(QuantizedWeight, policy=KEEP)
    assert not result.modified  # nothing is constant here: lifting is LiftTransformParams' job
    assert "1 lifted ahead of run time" in result.report.explain()
    default = fgr.plan(QuantizedWeightAnnotated, policy="default")
    assert [(d.label, d.reason, d.rule) for d in default.decisions][:3] == [
        ("q", Reason.LIFTED, "default"),
        ("s", Reason.KEPT_BY_POLICY, "default"),
        ("b", Reason.KEPT_BY_BARRIER, "fold_barrier"),
    ]
    assert "never lifts stop_lift_params" in default.decisions[1].detail


def test_outside_a_dataflow_block_nothing_is_lifted_so_nothing_is_placed():
    @I.ir_module
    class NoDataflow:
        @R.function
        def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "int8")):
            R.func_attr({"num_input": 1})
            dq = R.dequantize(w, R.const(0.5), R.const(0, "int8"), axis=1, out_dtype="float32")
            y = R.matmul(x, dq)
            return y

    plan = fgr.plan(NoDataflow, policy=KEEP)
    assert plan.decisions[0].action is Action.KEEP
    assert "only bindings inside dataflow blocks" in plan.decisions[0].detail
    assert fgr.annotate(NoDataflow, policy=KEEP).placed == ()


def test_an_annotated_module_round_trips_through_json_and_tvmscript():
    annotated = fgr.annotate(QuantizedWeight, policy=KEEP).mod
    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(annotated)), annotated)
    tvm.ir.assert_structural_equal(tvm.script.from_source(annotated.script()), annotated)


# ----------------------------------------------------------------------------------- numerics


def test_annotated_module_builds_and_runs_with_or_without_lifting():
    """stop_lift_params has no lowering in TVM 0.27: fold_guard gives it the barrier's view."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4)).astype("float32")
    w = rng.standard_normal((4, 4)).astype("float32")
    annotated = fgr.annotate(QuantizedWeight, policy=KEEP).mod
    expected = _build(QuantizedWeight)["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    unlifted = _build(annotated)["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    lifted, (q,) = _run_lifted(relax.transform.LiftTransformParams()(annotated), [x], [w])
    assert q.dtype == np.int8
    np.testing.assert_array_equal(unlifted, expected)
    np.testing.assert_array_equal(lifted, expected)


def _import_with_parameters(model) -> Tuple[tvm.IRModule, List[np.ndarray]]:
    from tvm.relax.frontend.onnx import from_onnx

    mod, params = relax.frontend.detach_params(from_onnx(model, keep_params_in_input=True))
    return mod, [p.numpy() for p in params["main"]]


def _dequantize_operands(func: relax.Function) -> List[relax.Expr]:
    """The data operand of every dequantize in ``func``, with a barrier over it looked through."""
    bound = {b.var.name: b.value for block in func.body.blocks for b in block.bindings}
    operands = []
    for block in func.body.blocks:
        for b in block.bindings:
            value = b.value
            if (
                isinstance(value, relax.Call)
                and getattr(value.op, "name", "") == "relax.dequantize"
            ):
                operand = value.args[0]
                inner = bound.get(operand.name) if isinstance(operand, relax.Var) else None
                if isinstance(inner, relax.Call) and inner.op.name == "relax.fold_barrier":
                    operands.append(inner.args[0])
    return operands


def _constant_dequantize_operands(mod: tvm.IRModule) -> List[np.ndarray]:
    """The constant data operand of every dequantize in ``main``: the weights ``fold`` kept."""
    return [
        b.value.args[0].value.numpy()
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
        and getattr(b.value.op, "name", "") == "relax.dequantize"
        and isinstance(b.value.args[0], tvm.ir.GenericConst)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["int8", "float_weights"])
@pytest.mark.parametrize("name", sorted(onnx_models.MODEL_BUILDERS))
def test_qdq_models_with_weights_as_parameters(name, form):
    """On the three QDQ examples: what annotate keeps stays in main as dequantize(barrier(int8
    parameter)), the transform computes the int8 weights fold gives from constant weights, and
    main plus the transform run to the unannotated model's output bit for bit."""
    model = onnx_models.MODEL_BUILDERS[name](0, float_weights=form == "float_weights")
    mod, weights = _import_with_parameters(model)
    annotated = fgr.annotate(mod, policy=KEEP)
    lifted = relax.transform.LiftTransformParams()(annotated.mod)

    # Every kept pattern is in main: a dequantize of a barrier over an integer weight parameter.
    operands = _dequantize_operands(lifted["main"])
    assert len(operands) == len(annotated.barriers) > 0
    main_params = {p.name for p in lifted["main"].params}
    for operand in operands:
        assert isinstance(operand, relax.Var) and operand.name in main_params
        assert str(operand.ty.dtype).startswith(("int", "uint"))
    assert (
        "relax.quantize" not in _op_names(lifted["main_transform_params"])
        or form == "float_weights"
    )

    # The lifted int8 weights are the constants fold gives on the same model with constant weights.
    folded = fgr.fold(onnx_models.import_relax(model), policy=KEEP).mod
    folded_operands = _constant_dequantize_operands(folded)
    inputs = [np.asarray(v) for v in onnx_models.input_feed(model).values()]
    out, transformed = _run_lifted(lifted, inputs, weights)
    by_name = dict(zip([p.name for p in lifted["main"].params][len(inputs) :], transformed))
    lifted_ints = [by_name[operand.name] for operand in operands]
    assert len(lifted_ints) == len(folded_operands)
    for got, want in zip(lifted_ints, folded_operands):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)

    # Bit for bit the output of the unannotated model, lifted the stock way.
    reference, _ = _run_lifted(relax.transform.LiftTransformParams()(mod), inputs, weights)
    np.testing.assert_array_equal(out, reference)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["default", KEEP, "qdq-accelerator", "weights-only"])
@pytest.mark.parametrize("form", ["int8", "float_weights"])
def test_the_plan_lifts_what_stock_lift_transform_params_lifts(form, policy):
    """The mirror of the stock lifting (``_stock.lift_rule``), checked against the pass itself.

    The plan describes this fold followed by the lifting, so the stock pass runs on the folded
    annotated module; a lifted call that the fold leaves dead (a ``shape_of`` whose only use
    folded) is gone from the module and not compared.
    """
    model = onnx_models.make_transformer_block(0, float_weights=form == "float_weights")
    mod, _ = _import_with_parameters(model)
    annotated = fgr.annotate(mod, policy=policy).mod
    plan = fgr.plan(annotated, policy="default")
    folded = relax.transform.FoldConstant()(annotated)
    stock = _call_labels(relax.transform.LiftTransformParams()(folded)["main_transform_params"])
    present = _call_labels(folded["main"])
    ours = {d.label for d in plan.lifted} & present
    assert ours == stock
    assert ours == {d.label for d in fgr.plan(mod, policy=policy).lifted} & present


@pytest.mark.slow
def test_lazy_transform_params_keeps_the_decision():
    """LazyTransformParams rewrites only the transform: main keeps every barrier, and loading
    the weights one at a time gives the eager transform's int8 weights."""
    model = onnx_models.make_qdq_cnn(0, float_weights=True)
    mod, weights = _import_with_parameters(model)
    lifted = relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod)
    # The order LazyTransformParams' docstring asks for (after them, it frees what it loaded).
    lazy = tvm.ir.transform.Sequential(_LAZY)(lifted)
    assert _op_names(lazy["main"]) == _op_names(lifted["main"])
    assert _op_names(lazy["main"]).count("relax.fold_barrier") == 10

    loaded: Dict[int, np.ndarray] = {}

    def get_item(index: int):
        return tvm.runtime.tensor(weights[index])

    def set_item(index: int, value) -> None:
        loaded[index] = value.numpy()

    # The VM resolves the packed functions when it loads the executable.
    with _global_func("get_item", get_item), _global_func("set_item", set_item):
        _build(lazy)["main_transform_params"]()
    eager = _build(lifted)["main_transform_params"]([tvm.runtime.tensor(w) for w in weights])
    assert sorted(loaded) == list(range(len(eager)))
    for index, value in enumerate(eager):
        np.testing.assert_array_equal(loaded[index], value.numpy())


class _global_func:
    """Register a packed function for the duration of a ``with`` block (the lazy transform's
    ``get_item`` / ``set_item``), restoring whatever was registered before."""

    def __init__(self, name: str, func) -> None:
        self.name, self.func = name, func

    def __enter__(self):
        self.previous = tvm.get_global_func(self.name, allow_missing=True)
        tvm.register_global_func(self.name, self.func, override=True)

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            tvm.register_global_func(self.name, self.previous, override=True)
        else:
            tvm_ffi.remove_global_func(self.name)


# ----------------------------------------------------------------------------------- real-model shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models  # noqa: E402

#: Every channel count divided by this (tests/relax/test_bench_models.py does the same): the layer
#: structure, and so every decision, is the full model's.
TINY = 8


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(real_models.MODELS))
def test_real_model_shapes_keep_every_weight_pattern_through_lifting(name):
    """fp32 weights feeding QuantizeLinear, as parameters: every weight's quantize is lifted,
    every weight and bias dequantize stays in main over an integer parameter, and the plan
    lifts exactly what the stock pass lifts."""
    model = real_models.build_quantized(name, "float_weights", scale=TINY)
    mod, _ = _import_with_parameters(model)
    annotated = fgr.annotate(mod, policy=KEEP)
    lifted = relax.transform.LiftTransformParams()(annotated.mod)
    operands = _dequantize_operands(lifted["main"])
    assert (
        len(operands)
        == len(annotated.barriers)
        >= real_models.model_stats(real_models.build_float(name, scale=TINY))["layers"]
    )
    main_params = {p.name for p in lifted["main"].params}
    assert all(op.name in main_params and "int" in str(op.ty.dtype) for op in operands)
    plan = fgr.plan(annotated.mod, policy="default")
    folded = relax.transform.FoldConstant()(annotated.mod)
    stock = _call_labels(relax.transform.LiftTransformParams()(folded)["main_transform_params"])
    assert {d.label for d in plan.lifted} & _call_labels(folded["main"]) == stock


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_tiny"])
def test_real_model_shapes_run_bit_for_bit_after_lifting(name):
    """One of the shapes: building a CNN shape twice takes 1-1.5 minutes on CI's machine
    (ResNet-50, MobileNetV2); the QDQ examples above cover the CNN path end to end."""
    model = real_models.build_quantized(name, "float_weights", scale=TINY)
    mod, weights = _import_with_parameters(model)
    lifted = relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod)
    feed = real_models.MODELS[name].feed(np.random.default_rng(0), TINY)
    inputs = [np.asarray(value) for value in feed.values()]
    out, _ = _run_lifted(lifted, inputs, weights)
    reference, _ = _run_lifted(relax.transform.LiftTransformParams()(mod), inputs, weights)
    np.testing.assert_array_equal(out, reference)


def test_release_before_partitioning_drops_the_stop_with_the_barrier():
    """Partitioning with weights as parameters: the pattern sees dequantize(<int8 parameter>)."""
    for mod in (
        QuantizedWeightAnnotated,
        relax.transform.LiftTransformParams()(QuantizedWeightAnnotated),
    ):
        released = fgr.release_barriers(mod)
        assert _op_names(released["main"]) == [
            op
            for op in _op_names(mod["main"])
            if op not in ("relax.builtin.stop_lift_params", "relax.fold_barrier")
        ]
        dequantize = next(
            b.value
            for block in released["main"].body.blocks
            for b in block.bindings
            if getattr(b.value, "op", None) is not None and b.value.op.name == "relax.dequantize"
        )
        assert str(dequantize.args[0].ty.dtype) == "int8"


@pytest.mark.slow
def test_requantize_chains_on_weight_parameters_lift_to_the_folded_int8_weights():
    """ONNX ``DQ(int8 W) -> Q(s2) -> DQ`` with W a parameter: the transform computes the int8
    weight at s2 that fold gives on constants, and main keeps only the last dequantize."""
    from _common.onnx_chains import make_requantize_chain_model

    model = make_requantize_chain_model(0)
    mod, weights = _import_with_parameters(model)
    annotated = fgr.annotate(mod, policy=KEEP)
    lifted = relax.transform.LiftTransformParams()(annotated.mod)
    operands = _dequantize_operands(lifted["main"])
    assert len(operands) == len(annotated.barriers)
    folded = fgr.fold(onnx_models.import_relax(model), policy=KEEP).mod
    folded_ints = sorted(_constant_dequantize_operands(folded), key=lambda a: a.shape)
    inputs = [np.asarray(v) for v in onnx_models.input_feed(model).values()]
    out, transformed = _run_lifted(lifted, inputs, weights)
    by_name = dict(zip([p.name for p in lifted["main"].params][len(inputs) :], transformed))
    lifted_ints = sorted((by_name[op.name] for op in operands), key=lambda a: a.shape)
    assert [a.shape for a in lifted_ints] == [a.shape for a in folded_ints]
    for got, want in zip(lifted_ints, folded_ints):
        np.testing.assert_array_equal(got, want)
    reference, _ = _run_lifted(relax.transform.LiftTransformParams()(mod), inputs, weights)
    np.testing.assert_array_equal(out, reference)
