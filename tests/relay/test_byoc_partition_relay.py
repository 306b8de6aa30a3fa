"""BYOC on Relay: a QNN pattern table needs int8 constant weights, which only a weight fold gives.

The flow of a Relay BYOC backend (see :mod:`_common.relay_byoc`) on QDQ ONNX models whose
weights are fp32 initializers feeding ``QuantizeLinear``::

    import_relay -> FakeQuantizationToInteger          qnn.conv2d(x, qnn.quantize(<fp32 const>), ...)
    -> a FoldConstant -> MergeComposite(qnn_pattern_table()) -> AnnotateTarget
    -> MergeCompilerRegions -> PartitionGraph

The backend's composites are ``qnn.conv2d`` / ``qnn.dense`` with an int8 *constant* weight, an
optional constant bias, then ``qnn.requantize``. N is the number of ``qnn.conv2d`` + ``qnn.dense``
calls FQ2I produces (counted, and checked against the ONNX model's weight initializers):

- stock ``FoldConstant()`` keeps every ``qnn.quantize(<const>)``: 0 of N are offloaded;
- ``fold_guard.relay.FoldConstant("qdq-accelerator")`` folds the weights into int8 constants and
  keeps every other QNN op: N of N are offloaded, each with an int8 constant weight;
- stock ``FoldConstant(fold_qnn=True)`` offloads the same (identical external functions): inside
  these patterns the weight quantizes are the only all-constant QNN calls. Outside them it also
  folds every ``qnn.dequantize(<int constant>)`` (the transformer block's LayerNorm parameters),
  which the policy keeps; on the CNNs the two modules are equal. Its lowering of other constant QNN
  ops is tested in ``test_qnn_selective.py``;
- partitioning first (the pattern table then also matches ``qnn.quantize(<const>)`` weights) and
  folding each external function alone with ``fold_function`` gives the external functions of
  fold-then-partition, up to the ``PartitionedFromPattern`` note on the composite;
- both partitioned modules build (the test codegen runs the external functions on the CPU) and run
  to the unfolded module's output, bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
import tvm
from _common import onnx_models
from _common import relay_byoc as byoc
from _common.relay_byoc import NPU_TARGET, Offload
from tvm import relay

import fold_guard.relay as fgr
from fold_guard import Reason

POLICY = "qdq-accelerator"

#: The QDQ models of onnx_models, all with fp32 weight initializers feeding QuantizeLinear.
MODELS: Dict[str, Callable[..., Any]] = {
    "qdq_cnn": onnx_models.make_qdq_cnn,
    "residual_cnn": onnx_models.make_residual_cnn,
    "transformer_block": onnx_models.make_transformer_block,
}

#: The models built and run (about 15 s each on 2 cores): the reference CNN, and the residual CNN,
#: whose regions hold several composites and return tuples. Every other test covers the transformer
#: block too; building it as well would add 15 s and no new path through the codegen.
BUILT = ["qdq_cnn", "residual_cnn"]


# ----------------------------------------------------------------------------------- helpers


# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def onnx_weight_count(model: Any) -> int:
    """QuantizeLinear nodes of the ONNX model that quantize a weight initializer (rank >= 2)."""
    ranks = {init.name: len(init.dims) for init in model.graph.initializer}
    return sum(
        node.op_type == "QuantizeLinear" and ranks.get(node.input[0], 0) >= 2
        for node in model.graph.node
    )


def is_quantize_of_constants(expr: relay.Expr) -> bool:
    return (
        isinstance(expr, relay.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == "qnn.quantize"
        and all(isinstance(arg, relay.Constant) for arg in expr.args)
    )


def constant_dequantizes(mod: tvm.IRModule) -> List[relay.Call]:
    """``qnn.dequantize`` calls of ``main`` whose arguments are all constants."""
    found: List[relay.Call] = []

    def visit(node: Any) -> None:
        if (
            isinstance(node, relay.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name == "qnn.dequantize"
            and all(isinstance(arg, relay.Constant) for arg in node.args)
        ):
            found.append(node)

    relay.analysis.post_order_visit(mod["main"], visit)
    return found


def composites(func: relay.Function) -> List[relay.Function]:
    """The composite functions inside ``func``."""
    found: List[relay.Function] = []

    def visit(node: Any) -> None:
        if (
            isinstance(node, relay.Function)
            and node.attrs is not None
            and "Composite" in node.attrs.keys()
        ):
            found.append(node)

    relay.analysis.post_order_visit(func, visit)
    return found


class _WithoutProvenance(relay.ExprMutator):
    """Drop ``PartitionedFromPattern`` from composite functions (it lists the ops the match covered),
    or, with ``only_composite``, every attribute of theirs except ``Composite``."""

    def __init__(self, only_composite: bool) -> None:
        super().__init__()
        self.only_composite = only_composite

    def visit_function(self, fn: relay.Function) -> relay.Expr:
        new = super().visit_function(fn)
        if new.attrs is None:
            return new
        for key in list(new.attrs.keys()):
            if key == "PartitionedFromPattern" or (self.only_composite and key != "Composite"):
                new = new.without_attr(key)
        return new


def normalised(func: relay.Function, *, keep_attrs: bool = True) -> relay.Function:
    """``func`` with its composites' ``PartitionedFromPattern`` dropped, type-checked again, for
    structural comparison. With ``keep_attrs=False`` the attributes of ``func`` are dropped too, and
    those of its composites but ``Composite``.

    Partitioning before folding matches ``qnn.quantize(W) -> qnn.conv2d -> ...``, so the composite
    says ``PartitionedFromPattern="qnn.quantize_qnn.conv2d_..."``; folding first matches
    ``qnn.conv2d -> ...``. After folding both composites hold the same ops, and that note is all
    that tells them apart. ``relay.build`` hands a codegen its functions with other attributes
    (a ``hash``, layouts) than PartitionGraph made; ``keep_attrs=False`` compares what they compute.
    """
    body = _WithoutProvenance(only_composite=not keep_attrs).visit(func.body)
    attrs = func.attrs if keep_attrs else None
    new = relay.Function(list(func.params), body, func.ret_type, func.type_params, attrs)
    return relay.transform.InferType()(tvm.IRModule({relay.GlobalVar("f"): new}))["f"]


def assert_same_function(
    actual: relay.Function, expected: relay.Function, *, keep_attrs: bool = True
) -> None:
    tvm.ir.assert_structural_equal(
        normalised(actual, keep_attrs=keep_attrs),
        normalised(expected, keep_attrs=keep_attrs),
        map_free_vars=True,
    )


# ----------------------------------------------------------------------------------- the flows


class Flow:
    """One model through import, FQ2I, the three folds and the partitions (each computed once)."""

    def __init__(self, name: str, make: Callable[..., Any]) -> None:
        self.name = name
        self.onnx = make(0, float_weights=True)
        self.fq2i = relay.transform.InferType()(
            relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(self.onnx))
        )
        self.n = len(byoc.quantized_calls(self.fq2i["main"]))
        self.stock = relay.transform.FoldConstant()(self.fq2i)
        self.stock_qnn = relay.transform.FoldConstant(fold_qnn=True)(self.fq2i)
        self.result = fgr.fold(self.fq2i, policy=POLICY, strict=True)
        self.ours = self.result.mod
        self.partitioned = {
            "stock": byoc.partition_for_qnn_npu(self.stock),
            "stock fold_qnn": byoc.partition_for_qnn_npu(self.stock_qnn),
            "ours": byoc.partition_for_qnn_npu(self.ours),
        }
        # Partition first: the composites then hold the weights' qnn.quantize(<constant>).
        self.first = byoc.partition_for_qnn_npu(self.fq2i, fold_in_codegen=True)

    def __repr__(self) -> str:
        return f"Flow({self.name})"


@pytest.fixture(scope="module", params=sorted(MODELS))
def flow(request: pytest.FixtureRequest) -> Flow:
    return Flow(request.param, MODELS[request.param])


# ----------------------------------------------------------------------------------- tests


def test_fq2i_leaves_a_constant_quantize_on_every_weight(flow: Flow) -> None:
    calls = byoc.quantized_calls(flow.fq2i["main"])
    assert flow.n == len(calls) == onnx_weight_count(flow.onnx) > 0
    assert all(is_quantize_of_constants(call.args[1]) for call in calls)
    # Stock FoldConstant() evaluates no QNN op: the quantizes stay, so no weight is a constant yet.
    assert all(
        is_quantize_of_constants(call.args[1]) for call in byoc.quantized_calls(flow.stock["main"])
    )


@pytest.mark.stock
def test_after_stock_fold_constant_nothing_is_offloaded(flow: Flow) -> None:
    partitioned = flow.partitioned["stock"]
    assert byoc.count_offloaded(partitioned) == Offload(total=flow.n, offloaded=0, int8_weights=0)
    assert byoc.external_functions(partitioned) == []


def test_after_the_backend_policy_every_quantized_op_is_offloaded_with_an_int8_weight(
    flow: Flow,
) -> None:
    partitioned = flow.partitioned["ours"]
    assert byoc.count_offloaded(partitioned) == Offload(
        total=flow.n, offloaded=flow.n, int8_weights=flow.n
    )
    assert str(byoc.count_offloaded(partitioned)) == f"{flow.n} of {flow.n}"
    external = byoc.external_functions(partitioned)
    # One composite per quantized op: no region merged two of them or lost one.
    # One composite per quantized op, whether a region holds one composite or several.
    found = [composite for _, func in external for composite in composites(func)]
    assert len(found) == flow.n
    assert {str(c.attrs["Composite"]) for c in found} <= {
        f"{NPU_TARGET}.qnn_conv2d",
        f"{NPU_TARGET}.qnn_dense",
    }
    assert all(str(func.attrs["Compiler"]) == NPU_TARGET for _, func in external)
    # The policy folded weight quantizes and nothing else: every other QNN op is still there.
    folded_ops = {decision.op for decision in flow.result.plan.folded}
    assert folded_ops == {"qnn.quantize"}
    assert len(flow.result.plan.folded) >= flow.n


def test_stock_fold_qnn_offloads_the_same_and_also_folds_the_dequantizes_the_policy_keeps(
    flow: Flow,
) -> None:
    """fold_qnn=True evaluates every all-constant QNN call; the backend policy only the quantizes.

    For this pattern table the two give identical external functions: the weight quantizes are the
    only constant QNN calls inside the patterns, and requantize, scales and zero points are not
    constant QNN calls either could lower. What fold_qnn=True does beyond that shows outside the
    patterns: in the transformer block, FQ2I leaves LayerNormalization in float, fed by
    ``qnn.dequantize(<int constant>)`` (gamma after its folded quantize, beta as int32); fold_qnn=True
    turns them into fp32 constants, which removes the Q/DQ a QDQ backend would match there, while
    the policy keeps them (its only kept calls: no weight op reads them, so not by the dequantize
    rule, which keeps a weight's only, but by Relay's default, which keeps every QNN op). In the
    CNNs there are none, and the two modules are equal.
    """
    ours, stock_qnn = flow.partitioned["ours"], flow.partitioned["stock fold_qnn"]
    assert byoc.count_offloaded(stock_qnn) == byoc.count_offloaded(ours)
    ours_external, stock_external = (
        byoc.external_functions(ours),
        byoc.external_functions(stock_qnn),
    )
    assert len(ours_external) == len(stock_external)
    for (name, func), (stock_name, stock_func) in zip(ours_external, stock_external):
        assert name == stock_name
        tvm.ir.assert_structural_equal(func, stock_func, map_free_vars=True)
    kept = [d for d in flow.result.plan.decisions if d.reason is Reason.KEPT_BY_POLICY]
    assert all(
        d.op == "qnn.dequantize" and d.rule in ("keep-dequantize-of-integer-constant", "default")
        for d in kept
    )
    assert len(constant_dequantizes(flow.ours)) == len(kept)
    assert constant_dequantizes(flow.stock_qnn) == []
    if not kept:
        tvm.ir.assert_structural_equal(flow.stock_qnn, flow.ours, map_free_vars=True)
    else:
        assert not tvm.ir.structural_equal(flow.stock_qnn, flow.ours, map_free_vars=True)


def test_partition_graph_keeps_pattern_constants_inside_the_composites(flow: Flow) -> None:
    """The weights, quantizes included, sit inside the composites: PartitionGraph's bind_constants
    (which decides about constant *arguments* of a region) changes nothing, and every external
    function computes its weights itself rather than taking them as parameters."""
    unbound = byoc.partition_for_qnn_npu(flow.fq2i, fold_in_codegen=True, bind_constants=False)
    tvm.ir.assert_structural_equal(unbound, flow.first, map_free_vars=True)
    external = byoc.external_functions(flow.first)
    calls = [call for _, func in external for call in byoc.quantized_calls(func)]
    assert len(calls) == flow.n
    assert all(is_quantize_of_constants(call.args[1]) for call in calls)
    # Regions take activations only (tensors of the activation dtypes, never an fp32 weight).
    assert all(
        str(param.checked_type.dtype) in ("uint8", "int8")
        for _, func in external
        for param in func.params
    )


def test_folding_each_external_function_alone_equals_folding_before_partitioning(
    flow: Flow,
) -> None:
    first = byoc.external_functions(flow.first)
    folded_first = byoc.external_functions(flow.partitioned["ours"])
    # The same regions either way (MergeCompilerRegions may put several composites in one).
    assert len(first) == len(folded_first) > 0
    assert byoc.count_offloaded(flow.first) == Offload(
        total=flow.n, offloaded=flow.n, int8_weights=0
    )
    for (name, func), (expected_name, expected) in zip(first, folded_first):
        saved = tvm.ir.save_json(func)
        alone = fgr.fold_function(func, policy=POLICY, strict=True)
        tvm.ir.assert_structural_equal(
            func, tvm.ir.load_json(saved), map_free_vars=True
        )  # input unchanged
        assert name == expected_name
        assert str(alone.attrs["Compiler"]) == NPU_TARGET
        assert all(byoc.has_int8_constant_weight(call) for call in byoc.quantized_calls(alone))
        assert_same_function(alone, expected)
    # Stock FoldConstant skips external functions (Compiler attribute), fold_qnn=True or not.
    for stock in (relay.transform.FoldConstant(), relay.transform.FoldConstant(fold_qnn=True)):
        assert byoc.count_offloaded(stock(flow.first)).int8_weights == 0


def test_the_module_pass_folds_named_external_functions_like_fold_function(flow: Flow) -> None:
    names = [name for name, _ in byoc.external_functions(flow.first)]
    folded = fgr.FoldConstant(POLICY, functions=names, strict=True)(flow.first)
    assert byoc.count_offloaded(folded) == Offload(
        total=flow.n, offloaded=flow.n, int8_weights=flow.n
    )
    tvm.ir.assert_structural_equal(
        folded["main"], flow.first["main"], map_free_vars=True
    )  # not asked
    for name in names:
        tvm.ir.assert_structural_equal(
            folded[name],
            fgr.fold_function(flow.first[name], policy=POLICY, strict=True),
            map_free_vars=True,
        )


@pytest.mark.slow
@pytest.mark.parametrize("flow", BUILT, indirect=True)
def test_partitioned_modules_build_and_run_like_the_unfolded_module(flow: Flow) -> None:
    """Both partitions build with the test codegen and run to the unfolded module's output.

    Partition-first: the codegen folds each external function with the backend policy (RFC.md,
    Appendix A: ``fold_function`` in a codegen hook); fold-first: it receives int8 weights already.
    Without a policy the codegen refuses a partition-first function (its weights are quantize calls),
    as an NPU compiler would.
    """
    feed = {param.name_hint: array for param, array in zip(flow.fq2i["main"].params, _inputs(flow))}
    expected = onnx_models.run_relay(flow.fq2i, feed)[0]
    np.testing.assert_allclose(
        expected,
        onnx_models.run_onnxruntime(flow.onnx, feed)[0],
        rtol=0,
        atol=onnx_models.output_atol(flow.onnx, onnx_models.INTEGER_TOLERANCE_STEPS),
    )
    fold_first = byoc.external_functions(flow.partitioned["ours"])

    # The two partitions' external functions are equal once folded: build each only once.
    cache: Dict[int, Any] = {}
    in_codegen = byoc.QnnNpuCodegen(policy=POLICY, cache=cache)
    with byoc.registered_codegen(in_codegen):
        np.testing.assert_array_equal(onnx_models.run_relay(flow.first, feed)[0], expected)
    assert len(in_codegen.folded) == len(fold_first)
    by_symbol = {str(f.attrs["global_symbol"]): f for f in in_codegen.folded}
    # The build hands the hook the partitioned function with other attributes (as in
    # test_partition.py), so compare parameters and bodies.
    for name, expected_func in fold_first:
        assert_same_function(by_symbol[name], expected_func, keep_attrs=False)

    ready = byoc.QnnNpuCodegen(cache=cache)
    with byoc.registered_codegen(ready):
        np.testing.assert_array_equal(
            onnx_models.run_relay(flow.partitioned["ours"], feed)[0], expected
        )
    assert len(ready.received) == len(fold_first)
    assert sum(len(entries) for entries in cache.values()) == len(fold_first)  # every build reused

    # The codegen alone on a partition-first function (relay.build would raise the same error).
    _, func = byoc.external_functions(flow.first)[0]
    with pytest.raises(ValueError, match="takes only int8 constant weights"):
        byoc.QnnNpuCodegen()(func)


def _inputs(flow: Flow) -> Tuple[np.ndarray, ...]:
    """One fixed-seed standard normal input per parameter of ``main``."""
    rng = np.random.default_rng(1)
    return tuple(
        rng.standard_normal([int(d) for d in param.checked_type.shape]).astype(
            str(param.checked_type.dtype)
        )
        for param in flow.fq2i["main"].params
    )
