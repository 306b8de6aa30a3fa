"""fold_guard on ``main`` before partitioning, and on partitioned external functions.

The model is a small conv/dense network with constant weights::

    x ─ conv2d(transpose(W_hwio)) ─ relu ─┐                       (main: fp32 constant subgraph)
                                          add(·, (C1 + C2) * C3)  (NPU region A: fp32 constant subgraph)
    batch_flatten ─ dense(dequantize(quantize(W_dense))) ─┐       (main: QNN constant subgraph)
                                          subtract(·, B1 + dequantize(quantize(B2)))
                                                                  (NPU region B: QNN constant subgraph)

A test-only BYOC target ``fold_guard_test_npu`` claims ``add``, ``multiply``, ``subtract`` and the
QNN quantize / dequantize of vectors through ``target.<name>`` op attributes, and a
``partition_for_test_npu`` pipeline does what every ``partition_for_*`` does (AnnotateTarget,
MergeCompilerRegions, PartitionGraph). Its ``relay.ext.fold_guard_test_npu`` codegen hook is real:
it folds the function it receives with ``fold_guard.relay.fold_function``, records the result,
and compiles it with TVM's own LLVM backend into the runtime module the graph executor calls, so
partitioned modules build and run on the CPU. (hhb-tvm is built without the ``ccompiler``
codegen, so ``relay.ext.ccompiler`` is not available here.)

Numbers are small integers and powers of two so every fold is exact and outputs can be compared
bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tvm
from relay_ir import op_calls
from tvm import relay
from tvm.contrib import graph_executor
from tvm.relay.backend import te_compiler

import fold_guard.relay as fgr
from fold_guard import Reason

TARGET = tvm.target.Target(
    "llvm -mtriple=x86_64-linux-gnu"
)  # hhb's default "llvm" triple is riscv64
NPU = "fold_guard_test_npu"
NPU_OPS = ("add", "multiply", "subtract")
# The NPU takes QNN vectors (biases) only, so the dense weight's QNN subgraph stays on main.
NPU_VECTOR_OPS = ("qnn.quantize", "qnn.dequantize")
STOCK = relay.transform.FoldConstant()

_RNG = np.random.default_rng(7)
W_HWIO = _RNG.integers(-2, 3, size=(3, 3, 2, 3)).astype("float32")
C1 = np.arange(3, dtype="float32").reshape(1, 3, 1, 1)
C2 = np.ones((1, 3, 1, 1), dtype="float32")
C3 = np.full((1, 3, 1, 1), 2.0, dtype="float32")
SCALE = 0.5  # W / SCALE is an exact integer below: no rounding tie in quantize
W_DENSE = (_RNG.integers(-8, 8, size=(5, 48)) * SCALE).astype("float32")
B1 = np.arange(5, dtype="float32")
B2 = np.array([1.0, -0.5, 2.0, 0.0, 3.5], dtype="float32")
X = _RNG.integers(-3, 4, size=(1, 2, 4, 4)).astype("float32")


# ---------------------------------------------------------------------------------- the model


def _quantized(value: np.ndarray) -> relay.Expr:
    """dequantize(quantize(value)): a constant QNN subgraph stock FoldConstant() keeps."""
    q = relay.qnn.op.quantize(
        relay.const(value), relay.const(SCALE), relay.const(0), out_dtype="int8"
    )
    return relay.qnn.op.dequantize(q, relay.const(SCALE), relay.const(0))


def model() -> tvm.IRModule:
    x = relay.var("x", shape=X.shape, dtype="float32")
    weight = relay.transpose(relay.const(W_HWIO), axes=[3, 2, 0, 1])  # main: folds under stock
    conv = relay.nn.relu(relay.nn.conv2d(x, weight, padding=(1, 1), channels=3, kernel_size=(3, 3)))
    shift = relay.multiply(relay.add(relay.const(C1), relay.const(C2)), relay.const(C3))  # region A
    dense = relay.nn.dense(
        relay.nn.batch_flatten(relay.add(conv, shift)), _quantized(W_DENSE)
    )  # main: QNN
    out = relay.subtract(dense, relay.add(relay.const(B1), _quantized(B2)))  # region B: QNN
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def reference_output() -> np.ndarray:
    """The model in NumPy (every value exact in float32)."""
    weight = W_HWIO.transpose(3, 2, 0, 1)
    padded = np.pad(X, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((1, 3, 4, 4), dtype="float32")
    for o in range(3):
        for i in range(4):
            for j in range(4):
                conv[0, o, i, j] = np.sum(padded[0, :, i : i + 3, j : j + 3] * weight[o])
    hidden = (np.maximum(conv, 0) + (C1 + C2) * C3).reshape(1, 48)
    return hidden @ W_DENSE.T - (B1 + B2)


# ---------------------------------------------------------------------- the test NPU target


def _compile_external(func: relay.Function) -> tvm.runtime.Module:
    """Compile one partitioned function with LLVM under its global symbol (what a codegen returns)."""
    symbol = str(func.attrs["global_symbol"])
    plain = relay.Function(func.params, func.body, func.ret_type, func.type_params)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(plain))
    mod = relay.qnn.transform.CanonicalizeOps()(mod)  # QNN has no compute of its own
    primitive = mod["main"].with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    prim_func = te_compiler.lower_to_primfunc(
        relay.transform.InferType()(tvm.IRModule.from_expr(primitive))["main"], TARGET
    )
    return tvm.build(
        tvm.IRModule({symbol: prim_func.with_attr("global_symbol", symbol)}), target=TARGET
    )


class NpuHook:
    """The ``relay.ext.<NPU>`` codegen: fold the function it is given, record it, compile it."""

    def __init__(self) -> None:
        self.policy = "default"
        self.received: list[relay.Function] = []
        self.folded: list[relay.Function] = []

    def __call__(self, func: relay.Function) -> tvm.runtime.Module:
        folded = fgr.fold_function(func, policy=self.policy, strict=True)
        self.received.append(func)
        self.folded.append(folded)
        return _compile_external(folded)


def _is_vector_call(call: relay.Call) -> bool:
    return len(call.args[0].checked_type.shape) == 1


@pytest.fixture(scope="module")
def npu() -> Iterator[NpuHook]:
    """Register the test target's op attributes and codegen hook; remove both afterwards."""
    for op_name in NPU_OPS:
        tvm.ir.register_op_attr(op_name, f"target.{NPU}", lambda _expr: True)
    for op_name in NPU_VECTOR_OPS:
        tvm.ir.register_op_attr(op_name, f"target.{NPU}", _is_vector_call)
    hook = NpuHook()
    tvm.register_func(f"relay.ext.{NPU}", hook, override=True)
    try:
        yield hook
    finally:
        tvm._ffi.registry.remove_global_func(f"relay.ext.{NPU}")
        for op_name in NPU_OPS + NPU_VECTOR_OPS:
            relay.op.get(op_name).reset_attr(f"target.{NPU}")


@pytest.fixture
def hook(npu: NpuHook) -> Iterator[NpuHook]:
    npu.policy = "default"
    npu.received.clear()
    npu.folded.clear()
    yield npu


def partition_for_test_npu(mod: tvm.IRModule) -> tvm.IRModule:
    """The shape of every ``partition_for_*``: annotate supported ops, merge regions, partition."""
    return tvm.transform.Sequential(
        [
            relay.transform.InferType(),
            relay.transform.AnnotateTarget([NPU]),
            relay.transform.MergeCompilerRegions(),
            relay.transform.PartitionGraph(),
            relay.transform.InferType(),
        ]
    )(mod)


def _external(mod: tvm.IRModule) -> dict[str, str]:
    """Region name ("B" has the subtract, "A" is the other) -> global function name."""
    regions = {}
    for gvar, func in mod.functions.items():
        if func.attrs is not None and "Compiler" in func.attrs:
            ops = _op_names(func)
            regions["B" if "subtract" in ops else "A"] = gvar.name_hint
    assert sorted(regions) == ["A", "B"], f"unexpected partitioning: {mod}"
    return regions


def _op_names(func: relay.Function) -> list[str]:
    return [call.op.name for call in op_calls(func)]


def _run(mod: tvm.IRModule) -> np.ndarray:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    runtime = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runtime.set_input(x=X)
    runtime.run()
    return runtime.get_output(0).numpy()


def assert_input_unchanged(mod: tvm.IRModule, saved: str) -> None:
    """Guarantee 4: the caller's module is structurally what its ``save_json`` copy was.

    Structural equality ignores TVM's cached ``checked_type_`` fields; that the pass leaves even
    those alone (the module byte-for-byte unchanged) is checked once, in
    ``test_annotations.py::test_input_is_byte_for_byte_unchanged``, so that a type-cache rewrite
    shows up there and not as a failure of every golden test.
    """
    tvm.ir.assert_structural_equal(mod, tvm.ir.load_json(saved), map_free_vars=True)


def _assert_same_function(got: relay.Function, expected: relay.Function) -> None:
    tvm.ir.assert_structural_equal(got, expected, map_free_vars=True)


def _unchanged_except(before: tvm.IRModule, after: tvm.IRModule, changed: tuple[str, ...]) -> None:
    """Every global function not in ``changed`` is structurally what it was."""
    assert sorted(gv.name_hint for gv in after.get_global_vars()) == sorted(
        gv.name_hint for gv in before.get_global_vars()
    )
    for gvar in before.get_global_vars():
        if gvar.name_hint not in changed:
            _assert_same_function(after[gvar.name_hint], before[gvar.name_hint])


# -------------------------------------------------------------------- (a) before partitioning


@pytest.mark.slow
def test_reference_model_runs_to_numpy():
    np.testing.assert_array_equal(_run(model()), reference_output())


def test_fold_before_partitioning_equals_stock_then_partitions_the_same(npu):
    """Default policy on main == stock; partitioning either result gives the same module."""
    before = model()
    saved = tvm.ir.save_json(before)
    ours = fgr.FoldConstant(strict=True)(before)
    assert_input_unchanged(before, saved)
    stock = STOCK(model())
    tvm.ir.assert_structural_equal(ours, stock, map_free_vars=True)
    assert _op_names(ours["main"]).count("qnn.quantize") == 2  # both QNN subgraphs kept, like stock
    partitioned = partition_for_test_npu(ours)
    tvm.ir.assert_structural_equal(partitioned, partition_for_test_npu(stock), map_free_vars=True)
    # Region A's constant subgraph was folded on main before it was cut out.
    assert _op_names(partitioned[_external(partitioned)["A"]]) == ["add"]


def test_allowed_qnn_weight_folds_before_partitioning(npu):
    """fold_allow on the dense weight's QNN subgraph: int8-then-fp32 constant, nothing else lowered.

    dense(f, allow(dequantize(quantize(W)))) ==> dense(f, <W>); region B's QNN subgraph stays.
    """
    annotated = model()
    # Rebuild main with the allow on the dense weight only (the one whose consumer is nn.dense).
    main = annotated["main"]

    class _AllowDenseWeight(relay.ExprMutator):
        def visit_call(self, call: relay.Call) -> relay.Expr:
            new = super().visit_call(call)
            if isinstance(new.op, tvm.ir.Op) and new.op.name == "nn.dense":
                return relay.nn.dense(new.args[0], fgr.fold_allow(new.args[1]))
            return new

    annotated = relay.transform.InferType()(tvm.IRModule.from_expr(_AllowDenseWeight().visit(main)))
    after = fgr.FoldConstant(strict=True)(annotated)
    plan = fgr.plan(annotated)
    allow_decisions = [d for d in plan.decisions if d.op == "fold_allow"]
    assert [d.reason for d in allow_decisions] == [Reason.FOLDED]
    ops = _op_names(after["main"])
    assert "fold_allow" not in ops
    assert ops.count("qnn.quantize") == 1 and ops.count("qnn.dequantize") == 1  # region B's, kept
    (dense,) = [c for c in op_calls(after["main"], "nn.dense")]
    assert isinstance(dense.args[1], relay.Constant)
    np.testing.assert_array_equal(dense.args[1].data.numpy(), W_DENSE)
    partitioned = partition_for_test_npu(after)
    np.testing.assert_array_equal(_run(partitioned), reference_output())


# ---------------------------------------------------------- (b) partitioned external functions


def test_partitioning_puts_constant_subgraphs_in_external_functions(npu):
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    assert _op_names(partitioned[regions["A"]]) == ["add", "multiply", "add"]
    assert sorted(_op_names(partitioned[regions["B"]])) == [
        "add",
        "qnn.dequantize",
        "qnn.quantize",
        "subtract",
    ]
    assert str(partitioned[regions["A"]].attrs["Compiler"]) == NPU


def test_stock_skips_external_functions(npu):
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    stock = STOCK(partitioned)
    _unchanged_except(partitioned, stock, changed=("main",))
    assert "transpose" not in _op_names(stock["main"])  # main itself was folded
    # Ours with no function list does exactly what stock does, external functions included.
    tvm.ir.assert_structural_equal(
        fgr.FoldConstant(strict=True)(partitioned), stock, map_free_vars=True
    )
    assert "multiply" in _op_names(stock[regions["A"]])


def _region_a_folded(partitioned: tvm.IRModule, name: str) -> relay.Function:
    """Region A by hand: add(p, (C1 + C2) * C3) ==> add(p, <(C1+C2)*C3>), attributes kept."""
    func = partitioned[name]
    (param,) = func.params
    expected = relay.Function(
        [param],
        relay.add(param, relay.const((C1 + C2) * C3)),
        func.ret_type,
        func.type_params,
        func.attrs,
    )
    return relay.transform.InferType()(tvm.IRModule({name: expected}))[name]


def test_folding_one_external_function_leaves_the_rest(npu):
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    saved = tvm.ir.save_json(partitioned)
    after = fgr.FoldConstant(functions=[regions["A"]], strict=True)(partitioned)
    assert_input_unchanged(partitioned, saved)
    _assert_same_function(after[regions["A"]], _region_a_folded(partitioned, regions["A"]))
    assert str(after[regions["A"]].attrs["Compiler"]) == NPU
    assert str(after[regions["A"]].attrs["global_symbol"]) == regions["A"]
    # main is not folded (transpose stays) and region B is untouched: only what was asked changed.
    _unchanged_except(partitioned, after, changed=(regions["A"],))
    assert "transpose" in _op_names(after["main"])


def test_plan_of_one_external_function(npu):
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    plan = fgr.plan(partitioned, functions=[regions["A"]])
    assert [(d.op, d.reason) for d in plan.decisions] == [
        ("add", Reason.FOLDED),
        ("multiply", Reason.FOLDED),
        ("add", Reason.NOT_CONSTANT),
    ]
    assert regions["A"] in plan.explain()  # the report names the function


def test_qnn_region_under_default_and_fold_qnn(npu):
    """Region B's constant QNN subgraph: kept under default (as stock would), folded by fold-qnn."""
    partitioned = partition_for_test_npu(model())
    name = _external(partitioned)["B"]
    default = fgr.FoldConstant(functions=[name], strict=True)(partitioned)
    _unchanged_except(partitioned, default, changed=())
    reasons = {d.op: d.reason for d in fgr.plan(partitioned, functions=[name]).decisions}
    assert reasons["qnn.quantize"] is Reason.KEPT_BY_POLICY
    folded = fgr.FoldConstant("fold-qnn", functions=[name], strict=True)(partitioned)
    _unchanged_except(partitioned, folded, changed=(name,))
    assert _op_names(folded[name]) == ["subtract"]
    (subtract,) = op_calls(folded[name], "subtract")
    np.testing.assert_array_equal(subtract.args[1].data.numpy(), B1 + B2)


def test_folding_every_function_when_named(npu):
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    after = fgr.FoldConstant(functions=["main", regions["A"], regions["B"]], strict=True)(
        partitioned
    )
    _assert_same_function(after["main"], STOCK(partitioned)["main"])
    _assert_same_function(after[regions["A"]], _region_a_folded(partitioned, regions["A"]))
    _assert_same_function(after[regions["B"]], partitioned[regions["B"]])  # QNN kept under default


def test_fold_function_matches_the_module_pass(npu):
    """fold_function(ext) on the function a codegen hook receives == folding it inside the module."""
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    for region, policy in (("A", "default"), ("B", "default"), ("B", "fold-qnn")):
        name = regions[region]
        func = partitioned[name]
        saved = tvm.ir.save_json(func)
        alone = fgr.fold_function(func, policy=policy, strict=True)
        assert_input_unchanged(func, saved)
        in_module = fgr.FoldConstant(policy, functions=[name], strict=True)(partitioned)[name]
        _assert_same_function(alone, in_module)
        assert str(alone.attrs["Compiler"]) == NPU


# --------------------------------------------------------------------- build and run, hook


@pytest.mark.slow
def test_partitioned_builds_and_runs_with_the_hook_folding(hook):
    """relay.build calls the hook once per external function; it folds, and outputs match."""
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    np.testing.assert_array_equal(_run(partitioned), reference_output())
    received = {str(f.attrs["global_symbol"]): f for f in hook.received}
    folded = {str(f.attrs["global_symbol"]): f for f in hook.folded}
    assert sorted(received) == sorted(regions.values())
    # The build pipeline rewrites the attributes of what it hands the hook (a hash, Compiler
    # cleared), so compare parameters and body: the hook got what PartitionGraph produced, and
    # folded region A exactly as fold_function does on the partitioned module.
    _assert_same_body(received[regions["A"]], partitioned[regions["A"]])
    _assert_same_body(folded[regions["A"]], _region_a_folded(partitioned, regions["A"]))
    _assert_same_body(folded[regions["B"]], partitioned[regions["B"]])  # QNN kept under default


def _assert_same_body(got: relay.Function, expected: relay.Function) -> None:
    strip = lambda f: relay.Function(f.params, f.body, f.ret_type, f.type_params)  # noqa: E731
    tvm.ir.assert_structural_equal(strip(got), strip(expected), map_free_vars=True)


@pytest.mark.slow
def test_folded_external_functions_build_and_run(hook):
    """Our pass on the external functions before the build changes nothing numerically."""
    partitioned = partition_for_test_npu(model())
    regions = _external(partitioned)
    hook.policy = "fold-qnn"  # the hook then folds region B's QNN subgraph too
    cases = (
        ([regions["A"]], "default"),
        ([regions["B"]], "fold-qnn"),
        (["main", regions["A"], regions["B"]], "fold-qnn"),
    )
    for functions, policy in cases:
        folded = fgr.FoldConstant(policy, functions=functions, strict=True)(partitioned)
        np.testing.assert_array_equal(
            _run(folded), reference_output(), err_msg=f"{functions} {policy}"
        )
    (b_folded,) = [f for f in hook.folded if str(f.attrs["global_symbol"]) == regions["B"]][-1:]
    assert _op_names(b_folded) == ["subtract"]
