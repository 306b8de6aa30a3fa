"""After FakeQuantizationToInteger: ``allow_constant_qnn`` + one ``FoldConstant`` on a QDQ ONNX CNN.

The flow the issue asks for, on the reference model of :mod:`_common.onnx_models`::

    make_qdq_cnn(0, float_weights=True)        QuantizeLinear(<fp32 weight>) -> DequantizeLinear -> Conv
    relay.frontend.from_onnx + bind params      qnn.quantize(<fp32 const>) -> qnn.dequantize -> nn.conv2d
    FakeQuantizationToInteger                   qnn.conv2d(x, qnn.quantize(<fp32 const>), ...)   (5 weights)
    fold_guard.relay.allow_constant_qnn         qnn.conv2d(x, fold_allow(qnn.quantize(<fp32 const>)), ...)
    fold_guard.relay.FoldConstant()             qnn.conv2d(x, <int8 const>, ...)

Stock ``FoldConstant()`` keeps every ``qnn.quantize(<fp32 const>)``; ``FoldConstant(fold_qnn=True)``
folds them and, on this model, nothing else (every other QNN op takes activations), so the two
results agree here; the difference -- stock folds every all-constant QNN op, we fold the allowed
ones -- is shown on a builder-made module in ``test_qnn_selective.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List

import numpy as np
import pytest
import tvm
from _common import onnx_models
from relay_ir import op_calls
from tvm import relay

import fold_guard.relay as fgr

#: The QNN ops FQ2I leaves on activations in the QDQ CNN: 4 convolutions, the classifier, the
#: requantizes between them, the input quantize and the output dequantize.
ACTIVATION_QNN = {
    "qnn.quantize": 1,
    "qnn.conv2d": 4,
    "qnn.dense": 1,
    "qnn.requantize": 7,
    "qnn.dequantize": 1,
}
#: Weight shapes of the CNN (OIHW for the convolutions, (units, in) for the classifier).
WEIGHT_SHAPES = [(8, 3, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3), (32, 16, 3, 3), (10, 32)]


# ----------------------------------------------------------------------------------- helpers


# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def _calls(mod: tvm.IRModule) -> List[relay.Call]:
    return op_calls(mod["main"])


def op_counts(mod: tvm.IRModule) -> Dict[str, int]:
    return dict(Counter(call.op.name for call in _calls(mod)))


def qnn_counts(mod: tvm.IRModule) -> Dict[str, int]:
    return {name: n for name, n in op_counts(mod).items() if name.startswith("qnn.")}


def is_constant_quantize(expr: relay.Expr) -> bool:
    return (
        isinstance(expr, relay.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == "qnn.quantize"
        and all(isinstance(arg, relay.Constant) for arg in expr.args)
    )


class _ReplaceAllow(relay.ExprMutator):
    """Replace each ``fold_allow(e)`` by ``replace(e)`` (e visited first)."""

    def __init__(self, replace: Callable[[relay.Expr], relay.Expr]) -> None:
        super().__init__()
        self._replace = replace

    def visit_call(self, call: relay.Call) -> relay.Expr:
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "fold_allow":
            return self._replace(self.visit(call.args[0]))
        return super().visit_call(call)


def replace_allows(mod: tvm.IRModule, replace: Callable[[relay.Expr], relay.Expr]) -> tvm.IRModule:
    func = mod["main"]
    new_func = relay.Function(
        func.params,
        _ReplaceAllow(replace).visit(func.body),
        func.ret_type,
        func.type_params,
        func.attrs,
    )
    return relay.transform.InferType()(tvm.IRModule.from_expr(new_func))


def stock_fold_qnn(subgraph: relay.Expr) -> relay.Expr:
    """Stock ``FoldConstant(fold_qnn=True)`` applied to one subgraph on its own."""
    return relay.transform.FoldConstantExpr(subgraph, tvm.IRModule(), fold_qnn=True)


def assert_equal(actual: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(actual, expected, map_free_vars=True)


# ----------------------------------------------------------------------------------- fixtures


class _Flow:
    """One model through import, FQ2I, annotation and folding (each step computed once)."""

    def __init__(self, **model_options: bool) -> None:
        self.onnx = onnx_models.make_qdq_cnn(0, **model_options)
        self.fq2i = relay.transform.InferType()(
            relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(self.onnx))
        )
        self.fq2i_json = tvm.ir.save_json(self.fq2i)
        self.annotated = fgr.allow_constant_qnn(self.fq2i)
        self.result = fgr.fold(self.annotated)
        self.folded = self.result.mod


@pytest.fixture(scope="module")
def flow() -> _Flow:
    return _Flow(float_weights=True)


@pytest.fixture(scope="module")
def reference(flow: _Flow) -> tvm.IRModule:
    """Stock fold_qnn=True on exactly the annotated subgraphs, then stock FoldConstant() on the rest."""
    return relay.transform.FoldConstant()(replace_allows(flow.annotated, stock_fold_qnn))


# ----------------------------------------------------------------------------------- tests


def test_fq2i_leaves_a_quantize_of_each_constant_weight(flow: _Flow) -> None:
    quantizes = [call for call in _calls(flow.fq2i) if is_constant_quantize(call)]
    assert sorted(tuple(q.args[0].data.shape) for q in quantizes) == sorted(WEIGHT_SHAPES)
    assert all(q.attrs.out_dtype == "int8" and q.args[0].data.dtype == "float32" for q in quantizes)
    expected = dict(ACTIVATION_QNN)
    expected["qnn.quantize"] += len(WEIGHT_SHAPES)
    assert qnn_counts(flow.fq2i) == expected
    # Stock FoldConstant() keeps them all: QNN ops are not evaluated without fold_qnn=True.
    assert_equal(relay.transform.FoldConstant()(flow.fq2i), flow.fq2i)


def test_allow_constant_qnn_wraps_exactly_the_constant_quantize_chains(flow: _Flow) -> None:
    allows = [call for call in _calls(flow.annotated) if call.op.name == "fold_allow"]
    assert len(allows) == len(WEIGHT_SHAPES)
    assert all(is_constant_quantize(allow.args[0]) for allow in allows)
    wrapped = sorted(tuple(allow.args[0].args[0].data.shape) for allow in allows)
    assert wrapped == sorted(WEIGHT_SHAPES)
    # Only annotations were added: without them the module is FQ2I's output again.
    assert_equal(replace_allows(flow.annotated, lambda e: e), flow.fq2i)
    # And FQ2I's output itself was not changed. (Not a comparison of JSON text: InferType refreshes
    # ``checked_type_`` of functions in place with an equal type, which changes the JSON.)
    assert_equal(flow.fq2i, tvm.ir.load_json(flow.fq2i_json))


def test_one_fold_constant_turns_them_into_int8_constants(
    flow: _Flow, reference: tvm.IRModule
) -> None:
    folded = flow.folded
    assert qnn_counts(folded) == ACTIVATION_QNN
    assert "fold_allow" not in op_counts(folded)
    # The plan folded the 5 quantizes and their annotations, nothing else.
    assert Counter(d.op for d in flow.result.plan.folded) == {"qnn.quantize": 5, "fold_allow": 5}
    kernels = [
        call.args[1] for call in _calls(folded) if call.op.name in ("qnn.conv2d", "qnn.dense")
    ]
    assert all(isinstance(k, relay.Constant) and k.data.dtype == "int8" for k in kernels)
    assert sorted(tuple(k.data.shape) for k in kernels) == sorted(WEIGHT_SHAPES)
    # Structurally equal to the stock reference, so every int8 constant is bit-identical to what
    # stock fold_qnn=True computes for its subgraph.
    assert_equal(folded, reference)


def test_on_this_model_the_result_equals_stock_fold_qnn(flow: _Flow) -> None:
    """Stock fold_qnn=True folds every all-constant QNN op; here those are exactly the allowed ones."""
    assert_equal(flow.folded, relay.transform.FoldConstant(fold_qnn=True)(flow.fq2i))
    # The pass form (what a pipeline uses) gives the same module as fold().
    assert_equal(fgr.FoldConstant()(flow.annotated), flow.folded)
    # Without the annotations our default policy keeps them, as stock FoldConstant() does.
    assert_equal(fgr.FoldConstant()(flow.fq2i), flow.fq2i)


def test_int8_weight_model_has_nothing_to_allow() -> None:
    """With int8 weight initializers FQ2I leaves no constant QNN op, so nothing is annotated."""
    fq2i = relay.transform.InferType()(
        relay.transform.FakeQuantizationToInteger()(
            onnx_models.import_relay(onnx_models.make_qdq_cnn(0))
        )
    )
    assert qnn_counts(fq2i) == ACTIVATION_QNN
    annotated = fgr.allow_constant_qnn(fq2i)
    assert_equal(annotated, fq2i)
    assert_equal(fgr.FoldConstant()(annotated), fq2i)


@pytest.mark.slow
def test_folded_module_runs_like_the_unfolded_one_and_onnxruntime(flow: _Flow) -> None:
    feed = onnx_models.sample_input()
    unfolded = onnx_models.run_relay(flow.fq2i, feed)[0]
    folded = onnx_models.run_relay(flow.folded, feed)[0]
    np.testing.assert_array_equal(folded, unfolded)
    expected = onnx_models.run_onnxruntime(flow.onnx, feed)[0]
    atol = onnx_models.output_atol(flow.onnx, onnx_models.INTEGER_TOLERANCE_STEPS)
    np.testing.assert_allclose(folded, expected, rtol=0, atol=atol)
