"""Annotations hold through TVM's own build pipelines (guarantee 3), and the pass behaves like the
stock one under pass management.

The failure this guards against (before ``fold_barrier`` lost its ``FLegalize``)::

    annotate(mod, policy="qdq-accelerator"): w = dequantize(fold_barrier(quantize(<fp32>)))
    LegalizeOps                       : w = call_tir(dequantize, (<fp32> -> quantize -> <int8>,))
    stock FoldConstant                : w = <fp32>                 (barrier gone, weight fp32)

and what holds now::

    LegalizeOps, FoldConstant, FuseOps: w = call_tir(dequantize, fold_barrier(<int8>))
    the VM build (LowerRuntimeBuiltin): w = call_tir(dequantize, vm.builtin.reshape(<int8>))

Every pipeline is run as an IR transformation under its target; no device is needed for that.
Modules of CPU pipelines are then built and run, bit-identical to the unannotated import.
"""

from __future__ import annotations

import importlib
import tempfile
from collections import Counter
from functools import cache
from typing import Callable, Dict, List, Tuple

import numpy as np
import onnx  # noqa: F401 - a test dependency; missing it must fail, not skip
import onnxruntime  # noqa: F401 - a test dependency; missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from _common.codegen_input import compile_with_codegen_input
from golden import CONSTANT_TYPE, op_calls
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import list_policies

BARRIER = "relax.fold_barrier"
VIEW_BUILTIN = "vm.builtin.reshape"
Signature = Tuple[str, Tuple[int, ...]]

# ----------------------------------------------------------------------------------- pipelines


def _sequential(*passes: tvm.transform.Pass) -> Callable[[tvm.IRModule], tvm.IRModule]:
    return lambda mod: tvm.transform.Sequential(list(passes))(mod)


def _under(
    target: object, make: Callable[[tvm.target.Target], tvm.transform.Pass]
) -> Callable[[tvm.IRModule], tvm.IRModule]:
    def run(mod: tvm.IRModule) -> tvm.IRModule:
        resolved = tvm.target.Target(target)
        with resolved:
            return make(resolved)(mod)

    return run


def _static_shape_tuning(mod: tvm.IRModule) -> tvm.IRModule:
    # Zero trials: everything the pipeline does up to tuning, then an empty database applied.
    with tempfile.TemporaryDirectory() as work_dir:
        pipeline = relax.get_pipeline(
            "static_shape_tuning",
            total_trials=0,
            target={"kind": "llvm", "num-cores": 2},
            work_dir=work_dir,
        )
        return pipeline(mod)


def _mlc_style(mod: tvm.IRModule) -> tvm.IRModule:
    t = relax.transform
    return tvm.transform.Sequential(
        [t.LegalizeOps(), t.AnnotateTIROpPattern(), t.FoldConstant(), t.FuseOps(), t.FuseTIR()]
    )(mod)


def _legalize_passes(target: tvm.target.Target) -> tvm.transform.Pass:
    return tvm.transform.Sequential(list(relax.pipeline.legalize_passes(target)))


#: Targets by backend under tvm.relax.backend, all run as IR transformations.
TARGETS: Dict[str, object] = {
    "cpu_generic": "llvm",
    "cuda": "cuda",
    "rocm": "rocm",
    "gpu_generic": "vulkan",
    "metal": "metal",
    "adreno": {"kind": "opencl", "device": "adreno"},
}

#: name -> (pipeline, folds constants, ends in VM lowering, runs on this CPU)
Pipeline = Tuple[Callable[[tvm.IRModule], tvm.IRModule], bool, bool, bool]
ALL_PIPELINES: Dict[str, Pipeline] = {
    "LegalizeOps+FoldConstant": (
        _sequential(relax.transform.LegalizeOps(), relax.transform.FoldConstant()),
        True,
        False,
        True,
    ),
    "FoldConstant+LegalizeOps+FoldConstant": (
        _sequential(
            relax.transform.FoldConstant(),
            relax.transform.LegalizeOps(),
            relax.transform.FoldConstant(),
        ),
        True,
        False,
        True,
    ),
    "zero": (relax.get_pipeline("zero"), True, False, True),
    "default_build": (relax.get_pipeline("default_build"), False, True, True),
    "static_shape_tuning": (_static_shape_tuning, True, False, True),
    "mlc-style": (_mlc_style, True, False, True),
}
for _backend, _target in TARGETS.items():
    _on_cpu = _backend == "cpu_generic"
    ALL_PIPELINES[f"legalize_passes[{_backend}]"] = (
        _under(_target, _legalize_passes),
        True,
        False,
        _on_cpu,
    )
    ALL_PIPELINES[f"default_pipeline[{_backend}]"] = (
        _under(_target, relax.pipeline.get_default_pipeline),
        True,
        True,
        _on_cpu,
    )

#: Rows that run the passes of another row, under another target, and are left out: TVM gives
#: rocm and metal gpu_generic's lists, and cuda gpu_generic's legalize passes (its default
#: pipeline adds RewriteCUDAGraph, so that row runs). A target only changes how dlight schedules
#: the PrimFuncs, which cannot move a barrier (under metal, dlight's ApplyDefaultSchedule alone
#: takes about 100 s on the QDQ CNN; 0.3 s under vulkan). test_left_out_rows_repeat_a_row_run
#: checks each against the installed TVM.
REPEATS: Dict[str, str] = {
    "legalize_passes[cuda]": "legalize_passes[gpu_generic]",
    "legalize_passes[rocm]": "legalize_passes[gpu_generic]",
    "legalize_passes[metal]": "legalize_passes[gpu_generic]",
    "default_pipeline[rocm]": "default_pipeline[gpu_generic]",
    "default_pipeline[metal]": "default_pipeline[gpu_generic]",
}
PIPELINES: Dict[str, Pipeline] = {
    name: pipeline for name, pipeline in ALL_PIPELINES.items() if name not in REPEATS
}

MODELS = {
    "qdq_cnn": onnx_models.make_qdq_cnn,
    "residual_cnn": onnx_models.make_residual_cnn,
    "transformer_block": onnx_models.make_transformer_block,
}
#: Every pipeline on the QDQ CNN; the common ones on the other two models.
CASES = [("qdq_cnn", name) for name in PIPELINES] + [
    (model, name)
    for model in ("residual_cnn", "transformer_block")
    for name in (
        "LegalizeOps+FoldConstant",
        "zero",
        "default_pipeline[cpu_generic]",
        "default_pipeline[cuda]",
    )
]

# ----------------------------------------------------------------------------------- helpers


@cache
def _model(name: str):
    """(import, annotated import, annotated and folded by fold_guard, inputs, reference output)."""
    model = MODELS[name](float_weights=True)
    imported = onnx_models.import_relax(model)
    annotated = fgr.annotate(imported, policy="qdq-accelerator").mod
    folded = fgr.FoldConstant()(annotated)
    inputs = list(onnx_models.input_feed(model).values())
    reference = onnx_models.run_relax(imported, inputs)
    return imported, annotated, folded, inputs, reference


def _tensor_constants(mod: tvm.IRModule) -> List[Signature]:
    found: List[Signature] = []

    def visit(node: object) -> None:
        if isinstance(node, CONSTANT_TYPE) and isinstance(node.value, tvm.runtime.Tensor):
            found.append((str(node.value.dtype), tuple(int(d) for d in node.value.shape)))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _signature(const: object) -> Signature:
    return str(const.value.dtype), tuple(int(d) for d in const.value.shape)


def _guarded(mod: tvm.IRModule) -> Counter:
    """(dtype, shape) of every constant a fold_barrier holds."""
    return Counter(
        _signature(call.args[0])
        for call in op_calls(mod, BARRIER)
        if isinstance(call.args[0], CONSTANT_TYPE)
    )


def _viewed(mod: tvm.IRModule) -> Counter:
    """(dtype, shape) of every constant the VM lowering of a barrier views."""
    found: List[Signature] = []

    def visit(node: object) -> None:
        if (
            isinstance(node, relax.Call)
            and isinstance(node.op, relax.ExternFunc)
            and node.op.global_symbol == VIEW_BUILTIN
            and isinstance(node.args[0], CONSTANT_TYPE)
        ):
            found.append(_signature(node.args[0]))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return Counter(found)


def _fp32_of_shapes(mod: tvm.IRModule, shapes: set) -> int:
    return sum(
        1 for dtype, shape in _tensor_constants(mod) if dtype == "float32" and shape in shapes
    )


def assert_barriers_hold(out: tvm.IRModule, folded: tvm.IRModule, *, lowered: bool) -> None:
    """Every barrier of ``folded`` still holds its integer constant in ``out``; nothing folded past it.

    Folding through a barrier turns ``dequantize(<int8>)`` into an fp32 constant of the weight's
    shape, so ``out`` may hold no more fp32 constants of the guarded shapes than ``folded`` does.
    """
    guarded = _guarded(folded)
    assert guarded and all(dtype.startswith(("int", "uint")) for dtype, _ in guarded)
    if lowered:
        assert not op_calls(out, BARRIER), "the VM lowering leaves no fold_barrier"
        assert _viewed(out) == guarded
    else:
        assert _guarded(out) == guarded
    shapes = {shape for _, shape in guarded}
    assert _fp32_of_shapes(out, shapes) <= _fp32_of_shapes(folded, shapes)


def _run(mod: tvm.IRModule, inputs, *, lowered: bool) -> List[np.ndarray]:
    if not lowered:
        return onnx_models.run_relax(mod, inputs)
    exe = tvm.compile(mod, target="llvm", relax_pipeline=None)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs])
    return [result.numpy()]


# ----------------------------------------------------------------------------------- pipelines


@pytest.mark.slow
@pytest.mark.parametrize("model, pipeline", CASES)
def test_barriers_hold_through_pipeline(model, pipeline):
    _, annotated, folded, inputs, reference = _model(model)
    transform, folds, lowered, on_cpu = PIPELINES[pipeline]
    before = tvm.ir.save_json(folded)
    # Annotated and folded by fold_guard first, then the pipeline.
    out = transform(folded)
    assert tvm.ir.save_json(folded) == before
    assert_barriers_hold(out, folded, lowered=lowered)
    if folds:
        # Annotated only: the pipeline's own stock FoldConstant folds each quantize under its barrier.
        assert_barriers_hold(transform(annotated), folded, lowered=lowered)
    if on_cpu:
        for got, want in zip(_run(out, inputs, lowered=lowered), reference):
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_stock_pipeline_erases_what_is_not_annotated():
    """The control: without annotations the same pipeline folds every weight into fp32."""
    imported, _, folded, _, _ = _model("qdq_cnn")
    out = PIPELINES["zero"][0](imported)
    shapes = {shape for _, shape in _guarded(folded)}
    assert not any(
        dtype.startswith("int") and shape in shapes for dtype, shape in _tensor_constants(out)
    )
    assert _fp32_of_shapes(out, shapes) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_compiled_executable_holds_integer_weights(model):
    """tvm.compile on the CPU: the executable's constants are the barriers' integer constants."""
    imported, _, folded, inputs, reference = _model(model)
    exe, codegen_input = compile_with_codegen_input(folded)
    assert_barriers_hold(codegen_input, folded, lowered=True)
    _, stock_input = compile_with_codegen_input(relax.transform.FoldConstant()(imported))
    stock_bytes = Counter()
    ours_bytes = Counter()
    for counter, mod in ((stock_bytes, stock_input), (ours_bytes, codegen_input)):
        for dtype, shape in _tensor_constants(mod):
            counter[dtype] += int(np.prod(shape)) * np.dtype(dtype).itemsize
    # Stock folds the weights to fp32; ours keeps them as 1-byte (int8) constants.
    assert ours_bytes["int8"] > 0 and stock_bytes["int8"] < ours_bytes["int8"]
    assert ours_bytes["float32"] < stock_bytes["float32"]
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs])
    np.testing.assert_array_equal(out.numpy(), reference[0])


@pytest.mark.slow
def test_barrier_lowers_to_a_view_without_allocation():
    """In the VM a barrier is a reshape of its operand to its own shape: no storage, no copy."""
    _, _, folded, _, _ = _model("qdq_cnn")
    plain = fgr.fold(
        _model("qdq_cnn")[0], policy="qdq-accelerator"
    ).mod  # the same folds, no barriers
    text = tvm.compile(folded, target="llvm").as_text()
    plain_text = tvm.compile(plain, target="llvm").as_text()
    views = [line for line in text.splitlines() if VIEW_BUILTIN in line and "in: c[" in line]
    assert len(views) == sum(_guarded(folded).values())
    assert text.count("vm.builtin.alloc_storage in:") == plain_text.count(
        "vm.builtin.alloc_storage in:"
    )


# ----------------------------------------------------------------------------------- hand-written

W_INT8 = np.arange(-8, 8, dtype="int8").reshape(4, 4)


def _barrier_module(
    annotate: Callable[[relax.Expr], relax.Expr] = fgr.fold_barrier,
) -> tvm.IRModule:
    """main(x) = x @ dequantize(annotate(<int8 4x4>))."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(annotate(relax.const(W_INT8)))
            w_dq = bb.emit(
                relax.op.dequantize(w, relax.const(0.5, "float32"), relax.const(0, "int8"), axis=0)
            )
            y = bb.emit_output(relax.op.matmul(x, w_dq))
        bb.emit_func_output(y)
    return bb.get()


def test_stock_folding_after_legalize_changes_nothing_behind_a_barrier():
    """Before: x @ dequantize(fold_barrier(<int8>)); LegalizeOps+FoldConstant == LegalizeOps alone."""
    before = _barrier_module()
    expected = relax.transform.LegalizeOps()(before)
    after = tvm.transform.Sequential(
        [relax.transform.LegalizeOps(), relax.transform.FoldConstant()]
    )(before)
    tvm.ir.assert_structural_equal(after, expected)
    (barrier,) = op_calls(after, BARRIER)
    assert _signature(barrier.args[0]) == ("int8", (4, 4))


@pytest.mark.stock
def test_without_barrier_stock_folds_the_weight():
    """The control for the test above: the same module without the barrier loses its int8 weight."""
    after = tvm.transform.Sequential(
        [relax.transform.LegalizeOps(), relax.transform.FoldConstant()]
    )(_barrier_module(lambda expr: expr))
    assert ("int8", (4, 4)) not in _tensor_constants(after)
    assert ("float32", (4, 4)) in _tensor_constants(after)


def test_annotations_left_in_a_module_build_and_run_as_identity():
    """fold_allow over a run-time value cannot fold; it and a barrier still build and run."""
    x_data = np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(fgr.fold_allow(relax.op.exp(x)))
            b = bb.emit(fgr.fold_barrier(a))
            y = bb.emit_output(
                relax.op.add(
                    b, fgr.fold_allow(relax.op.exp(relax.const(np.ones((2, 4), "float32"))))
                )
            )
        bb.emit_func_output(y)
    mod = bb.get()
    expected = np.exp(x_data) + np.exp(np.ones((2, 4), "float32"))
    for name in ("LegalizeOps+FoldConstant", "zero", "default_pipeline[cpu_generic]"):
        transform, _, _, _ = PIPELINES[name]
        out = transform(mod)
        assert not op_calls(out, "relax.fold_allow"), f"{name}: fold_allow legalizes to identity"
        np.testing.assert_allclose(onnx_models.run_relax(out, [x_data])[0], expected, rtol=1e-6)
    np.testing.assert_allclose(onnx_models.run_relax(mod, [x_data])[0], expected, rtol=1e-6)


# ----------------------------------------------------------------------------------- legalized modules

OP_READING = [policy.name for policy in list_policies() if policy.reads_ops]


@pytest.mark.slow
def test_size_only_policies_still_apply_to_a_legalized_module():
    assert set(OP_READING) >= {"keep-qdq-weights", "qdq-accelerator", "weights-only", "fold-qnn"}
    legalized = relax.transform.LegalizeOps()(_model("qdq_cnn")[0])
    stock = relax.transform.FoldConstant()(legalized)
    tvm.ir.assert_structural_equal(fgr.FoldConstant()(legalized), stock)
    # size-guard reads sizes only: on kernels it keeps what it keeps on ops, the dequantize of
    # an int8 weight of 4096 bytes or more to float32 (4x), and the rest folds as stock does
    result = fgr.fold(legalized, policy="size-guard")
    kept = [d for d in result.plan.decisions if d.rule == "size-guard"]
    nodes = result.plan.graph.nodes
    assert kept, result.plan.explain()
    for decision in kept:
        node = nodes[decision.node]
        assert node.lowered and "dequantize" in node.callee, decision
        assert node.inputs[0].tensor.dtype == "int8" and node.outputs[0].nbytes >= 4096
    default = fgr.fold(legalized).plan
    for ours, stocks in zip(result.plan.decisions, default.decisions):
        if ours.action is not stocks.action:
            assert ours.rule == "size-guard" or ours.root in {d.node for d in kept}, ours


@pytest.mark.slow
def test_annotating_before_legalizing_carries_the_policy():
    """The recommended flow: annotate, then any pipeline keeps the policy's decisions."""
    imported = _model("qdq_cnn")[0]
    by_policy = fgr.fold(imported, policy="qdq-accelerator").mod
    annotated = fgr.annotate(imported, policy="qdq-accelerator").mod
    through_pipeline = PIPELINES["zero"][0](annotated)
    assert Counter(s for s in _tensor_constants(through_pipeline) if s[0] == "int8") == Counter(
        s for s in _tensor_constants(by_policy) if s[0] == "int8"
    )


# ----------------------------------------------------------------------------------- pass management


def _small_module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(relax.const(np.ones((2, 4), "float32"))))
            y = bb.emit_output(relax.op.add(x, e))
        bb.emit_func_output(y)
    return bb.get()


FOLDERS = {"stock": relax.transform.FoldConstant, "fold_guard": fgr.FoldConstant}


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_disabled_pass_disables_it_like_stock(folder):
    mod = _small_module()
    seq = tvm.transform.Sequential([FOLDERS[folder]()])
    with tvm.transform.PassContext(disabled_pass=["FoldConstant"]):
        tvm.ir.assert_structural_equal(seq(mod), mod)
    assert op_calls(seq(mod), "relax.exp") == [], "enabled, it folds exp(<const>)"


def test_pass_info_matches_stock():
    ours, stock = fgr.FoldConstant().info, relax.transform.FoldConstant().info
    assert (ours.name, ours.opt_level) == (stock.name, stock.opt_level) == ("FoldConstant", 0)
    assert fgr.FoldConstant("size-guard").implementation == "fold_guard.relax.FoldConstant"
    assert fgr.FoldConstant("size-guard").policy.name == "size-guard"


@tvm.instrument.pass_instrument
class _RelaxPasses:
    """Names of the passes run on modules with Relax functions (TIR kernel builds left out)."""

    def __init__(self) -> None:
        self.names: List[str] = []

    def run_before_pass(self, mod, info):
        if any(isinstance(func, relax.Function) for func in mod.functions.values()):
            self.names.append(info.name)


def test_instruments_see_the_same_passes_as_with_stock():
    seen = {}
    for folder, make in FOLDERS.items():
        instrument = _RelaxPasses()
        seq = tvm.transform.Sequential(
            [relax.transform.Normalize(), make(), relax.transform.DeadCodeElimination()]
        )
        with tvm.transform.PassContext(instruments=[instrument]):
            seq(_small_module())
        seen[folder] = instrument.names
    assert seen["fold_guard"] == seen["stock"]
    assert "LegalizeOps" not in seen["fold_guard"]


#: The backends under tvm.relax.backend with a pipeline of their own.
BACKENDS = ("cpu_generic", "cuda", "rocm", "gpu_generic", "adreno")
#: The stages each backend's get_default_pipeline runs, in order (its pipeline.py).
STAGES = ("library_dispatch_passes", "legalize_passes", "dataflow_lower_passes", "finalize_passes")


def _pass_names(row: str, monkeypatch) -> Tuple[str, ...]:
    """The passes a backend row runs, by name, from the lists of the backend TVM dispatches its
    target to. Nothing is run: under a metal target, dlight's first schedule imports
    tvm.s_tir.tensor_intrin, 40 s and more."""
    kind, name = row.rstrip("]").split("[")
    target = tvm.target.Target(TARGETS[name])
    chosen = []
    for backend in BACKENDS:
        monkeypatch.setattr(
            getattr(relax.backend, backend),
            "get_default_pipeline",
            lambda _target, backend=backend: chosen.append(backend),
        )
    relax.pipeline.get_default_pipeline(target)
    monkeypatch.undo()
    (backend,) = chosen
    module = importlib.import_module(f"tvm.relax.backend.{backend}.pipeline")
    stages = STAGES if kind == "default_pipeline" else ("legalize_passes",)
    with target:
        return tuple(p.info.name for stage in stages for p in getattr(module, stage)(target))


@pytest.mark.stock
def test_left_out_rows_repeat_a_row_run(monkeypatch):
    """Each row REPEATS leaves out has the passes of the row it names, in order; the backend rows
    that run differ from each other."""
    for left_out, kept in REPEATS.items():
        assert kept in PIPELINES
        assert _pass_names(left_out, monkeypatch) == _pass_names(kept, monkeypatch), left_out
    for kind in ("legalize_passes", "default_pipeline"):
        rows = {
            name: _pass_names(name, monkeypatch)
            for name in PIPELINES
            if name.startswith(f"{kind}[")
        }
        assert len(set(rows.values())) == len(rows), rows


def test_barriers_over_run_time_tensors_of_any_shape_build_and_run():
    """A view needs a shape: static, symbolic, or (ndim only) read at run time; the operand lives on."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Symbolic:
        @R.function
        def main(x: R.Tensor(("n", 4), "float32")):
            with R.dataflow():
                b = R.fold_barrier(x)
                y = R.add(b, b)
                R.output(y)
            return y

    @I.ir_module
    class NdimOnly:
        @R.function
        def main(x: R.Tensor(ndim=2, dtype="float32")):
            b = R.fold_barrier(x)
            both = (b, x)  # x is used after the barrier's last use: its register must survive
            return both

    x = np.arange(12, dtype="float32").reshape(3, 4)
    vm = relax.VirtualMachine(tvm.compile(Symbolic, target="llvm"), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x + x)
    vm = relax.VirtualMachine(tvm.compile(NdimOnly, target="llvm"), tvm.cpu())
    first, second = vm["main"](tvm.runtime.tensor(x))
    np.testing.assert_array_equal(first.numpy(), x)
    np.testing.assert_array_equal(second.numpy(), x)
