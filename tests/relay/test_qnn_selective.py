"""Selective QNN lowering: the test asked for in the review of TVM pull request 11228.

The review of ``FoldConstant(fold_qnn=True)`` asked for "a test case where we could observe that
such constant subgraphs are folded while rest of the qnn ops (that does not have all arguments as
constants) are not legalized" -- the difference from running QNN ``CanonicalizeOps`` (or
``Legalize``) and then ``FoldConstant``, which lowers every QNN op in the module. The module here
has two constant QNN subgraphs feeding QNN ops on activations::

    x -> qnn.quantize -> qnn.conv2d(., qnn.quantize(transpose(<fp32 W>)))   <- constant subgraph 1
      -> nn.bias_add -> qnn.requantize -> nn.max_pool2d -> nn.batch_flatten
      -> qnn.dense(., qnn.requantize(<int8 D>))                              <- constant subgraph 2
      -> qnn.requantize -> qnn.dequantize

``fold_allow`` around a constant subgraph (policy ``default``), or the ``fold-qnn`` policy, turns
it into one int8 constant; every QNN op on activations stays a QNN op, and none of the ops QNN
canonicalization would introduce (``cast``, ``round``, ``clip``, ``fixed_point_multiply``, a plain
``nn.conv2d``, ...) appears. Expected modules are built by hand from the same builder, with each
folded constant computed by stock ``relay.transform.FoldConstantExpr(..., fold_qnn=True)`` on just
that subgraph, so structural equality also checks the constants bit for bit.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, Set

import numpy as np
import pytest
import tvm
from _common.onnx_models import run_relay
from relay_ir import op_calls
from tvm import relay
from tvm.relay import qnn

import fold_guard.relay as fgr
from fold_guard import Reason

INPUT_SHAPE = (1, 4, 8, 8)
_RNG = np.random.default_rng(11228)
# Conv weight stored HWIO, so the constant subgraph has a non-QNN op (transpose) under the QNN one.
W_HWIO = (_RNG.standard_normal((3, 3, 4, 8)) * 0.2).astype("float32")
W_SCALE = (np.abs(W_HWIO).max(axis=(0, 1, 2)) / 127).astype("float32")
CONV_BIAS = _RNG.integers(-50, 50, size=8).astype("int32")
DENSE_INT8 = _RNG.integers(-120, 120, size=(10, 128)).astype("int8")
X = _RNG.standard_normal(INPUT_SHAPE).astype("float32")
# The scales keep the output unsaturated on X (values spread over about -25..35), so a wrong
# weight shows in the comparison of outputs instead of being clipped away.
OUTPUT_SCALE = 0.5

#: QNN ops that take activations in the module (the dense weight's requantize is not one).
ACTIVATION_QNN = {
    "qnn.quantize": 1,
    "qnn.conv2d": 1,
    "qnn.requantize": 2,
    "qnn.dense": 1,
    "qnn.dequantize": 1,
}
#: Plain ops of the module outside the constant subgraphs.
ACTIVATION_PLAIN = {"nn.bias_add": 1, "nn.max_pool2d": 1, "nn.batch_flatten": 1}

Wrap = Callable[[relay.Expr], relay.Expr]


def _same(expr: relay.Expr) -> relay.Expr:
    return expr


# ----------------------------------------------------------------------------------- builders


def _c(value: float, dtype: str) -> relay.Constant:
    return relay.const(np.array(value, dtype=dtype))


def conv_weight(inner: Wrap = _same) -> relay.Expr:
    """Constant subgraph 1: ``qnn.quantize(transpose(<fp32 HWIO>))`` -> int8 OIHW, per channel."""
    oihw = inner(relay.transpose(relay.const(W_HWIO), axes=(3, 2, 0, 1)))
    return qnn.quantize(
        oihw, relay.const(W_SCALE), relay.const(np.zeros(8, "int32")), axis=0, out_dtype="int8"
    )


def dense_weight(inner: Wrap = _same) -> relay.Expr:
    """Constant subgraph 2: ``qnn.requantize(<int8>)`` to the dense kernel's scale and zero point."""
    return qnn.requantize(
        inner(relay.const(DENSE_INT8)),
        _c(0.02, "float32"),
        _c(0, "int32"),
        _c(0.05, "float32"),
        _c(3, "int32"),
        out_dtype="int8",
    )


def net(conv_w: relay.Expr, dense_w: relay.Expr) -> tvm.IRModule:
    """The module around the two weights (any int8 expressions of the right shapes)."""
    x = relay.var("x", shape=INPUT_SHAPE, dtype="float32")
    q = qnn.quantize(x, _c(0.05, "float32"), _c(128, "int32"), out_dtype="uint8")
    conv = qnn.conv2d(
        q,
        conv_w,
        _c(128, "int32"),
        _c(0, "int32"),
        _c(0.05, "float32"),
        relay.const(W_SCALE),
        kernel_size=(3, 3),
        channels=8,
        padding=(1, 1),
        out_dtype="int32",
    )
    biased = relay.nn.bias_add(conv, relay.const(CONV_BIAS))
    act = qnn.requantize(
        biased,
        relay.const(W_SCALE * np.float32(0.05)),
        relay.const(np.zeros(8, "int32")),
        _c(0.1, "float32"),
        _c(0, "int32"),
        axis=1,
        out_dtype="uint8",
    )
    flat = relay.nn.batch_flatten(relay.nn.max_pool2d(act, pool_size=(2, 2), strides=(2, 2)))
    dense = qnn.dense(
        flat,
        dense_w,
        _c(0, "int32"),
        _c(3, "int32"),
        _c(0.1, "float32"),
        _c(0.05, "float32"),
        units=10,
        out_dtype="int32",
    )
    out_q = qnn.requantize(
        dense,
        _c(0.005, "float32"),
        _c(0, "int32"),
        _c(OUTPUT_SCALE, "float32"),
        _c(128, "int32"),
        out_dtype="uint8",
    )
    out = qnn.dequantize(out_q, _c(OUTPUT_SCALE, "float32"), _c(128, "int32"))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def stock_fold_qnn(subgraph: relay.Expr) -> relay.Constant:
    """What stock ``FoldConstant(fold_qnn=True)`` makes of one constant subgraph on its own."""
    folded = relay.transform.FoldConstantExpr(subgraph, tvm.IRModule(), fold_qnn=True)
    assert isinstance(folded, relay.Constant), folded
    return folded


# ----------------------------------------------------------------------------------- helpers


def _calls(mod: tvm.IRModule) -> List[relay.Call]:
    return op_calls(mod["main"])


def op_counts(mod: tvm.IRModule) -> Dict[str, int]:
    return dict(Counter(call.op.name for call in _calls(mod)))


def _qnn_calls(mod: tvm.IRModule, *, on_activations: bool) -> Dict[str, int]:
    return dict(
        Counter(
            call.op.name
            for call in _calls(mod)
            if call.op.name.startswith("qnn.")
            and bool(relay.analysis.free_vars(call)) == on_activations
        )
    )


def qnn_on_activations(mod: tvm.IRModule) -> Dict[str, int]:
    """QNN calls whose value depends on the run-time input (the ones a backend pattern-matches)."""
    return _qnn_calls(mod, on_activations=True)


def qnn_on_constants(mod: tvm.IRModule) -> Dict[str, int]:
    """QNN calls computable from constants alone: what folding may turn into a constant."""
    return _qnn_calls(mod, on_activations=False)


def canonicalization_ops(mod: tvm.IRModule) -> Set[str]:
    """Ops QNN canonicalization introduces into ``mod``: present after it, absent before."""
    # On a copy: stock canonicalization of qnn.requantize writes its resolved ``rounding`` and
    # ``compute_dtype`` into the attributes of the call it lowers (a const_cast in requantize.cc).
    copy = tvm.ir.load_json(tvm.ir.save_json(mod))
    lowered = relay.transform.InferType()(relay.qnn.transform.CanonicalizeOps()(copy))
    return set(op_counts(lowered)) - set(op_counts(mod))


def kernel_of(mod: tvm.IRModule, op_name: str) -> np.ndarray:
    (call,) = [c for c in _calls(mod) if c.op.name == op_name]
    assert isinstance(call.args[1], relay.Constant), call.args[1]
    return call.args[1].data.numpy()


def assert_equal(actual: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(actual, expected, map_free_vars=True)


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def folded_weights() -> Dict[str, relay.Constant]:
    return {"conv": stock_fold_qnn(conv_weight()), "dense": stock_fold_qnn(dense_weight())}


@pytest.fixture(scope="module")
def expected(folded_weights: Dict[str, relay.Constant]) -> tvm.IRModule:
    """Both constant subgraphs folded, everything else as built."""
    return net(folded_weights["conv"], folded_weights["dense"])


@pytest.fixture(scope="module")
def reference_output() -> np.ndarray:
    """The unfolded module built and run: every folded variant must give exactly this.

    Builds here use opt level 1, the lowest at which ``relay.build`` canonicalizes QNN ops: about
    half the build time of level 3, and before and after are always built alike.
    """
    return run_relay(net(conv_weight(), dense_weight()), [X], opt_level=1)[0]


# ----------------------------------------------------------------------------------- tests


def test_the_module_has_constant_and_activation_qnn_ops() -> None:
    before = net(conv_weight(), dense_weight())
    assert qnn_on_activations(before) == ACTIVATION_QNN
    assert qnn_on_constants(before) == {"qnn.quantize": 1, "qnn.requantize": 1}


def test_canonicalize_then_fold_lowers_every_qnn_op() -> None:
    """The reviewer's question: why not QNN Legalize/Canonicalize, then FoldConstant?

    Because it lowers the activation QNN ops too: no ``qnn.conv2d`` / ``qnn.dense`` survives for a
    backend to match. This is the behaviour the selective lowering below must not have.
    """
    before = net(conv_weight(), dense_weight())
    lowered = tvm.transform.Sequential(
        [relay.qnn.transform.CanonicalizeOps(), relay.transform.FoldConstant()]
    )(before)
    assert qnn_on_activations(lowered) == {}
    assert {"nn.conv2d", "nn.dense"} <= set(op_counts(lowered))


@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_fold_allow_folds_constant_qnn_subgraphs_and_keeps_activation_qnn(
    policy: str, expected: tvm.IRModule, folded_weights: Dict[str, relay.Constant]
) -> None:
    before = net(fgr.fold_allow(conv_weight()), fgr.fold_allow(dense_weight()))
    debris = canonicalization_ops(before)
    assert {"cast", "clip", "nn.conv2d", "nn.dense"} <= debris  # the check below can fail

    after = fgr.FoldConstant(policy)(before)

    assert_equal(after, expected)
    assert qnn_on_activations(after) == ACTIVATION_QNN
    assert qnn_on_constants(after) == {}
    assert not debris & set(op_counts(after)), op_counts(after)
    assert op_counts(after) == {**ACTIVATION_QNN, **ACTIVATION_PLAIN}
    # Bit-identical to stock fold_qnn=True on the same subgraph (structural equality compares the
    # bytes too; this says so in plain NumPy).
    np.testing.assert_array_equal(
        kernel_of(after, "qnn.conv2d"), folded_weights["conv"].data.numpy()
    )
    np.testing.assert_array_equal(
        kernel_of(after, "qnn.dense"), folded_weights["dense"].data.numpy()
    )


def test_fold_qnn_policy_folds_every_constant_qnn_op_without_annotations(
    expected: tvm.IRModule,
) -> None:
    before = net(conv_weight(), dense_weight())
    after = fgr.FoldConstant("fold-qnn")(before)
    assert_equal(after, expected)
    assert_equal(after, relay.transform.FoldConstant(fold_qnn=True)(before))
    assert qnn_on_activations(after) == ACTIVATION_QNN
    assert not canonicalization_ops(before) & set(op_counts(after))


def test_default_policy_without_annotations_keeps_qnn_like_stock() -> None:
    before = net(conv_weight(), dense_weight())
    after = fgr.FoldConstant()(before)
    assert_equal(after, relay.transform.FoldConstant()(before))
    # The transpose under the quantize folds; both QNN weight subgraphs stay QNN ops.
    assert_equal(
        after,
        net(
            qnn.quantize(
                relay.const(W_HWIO.transpose(3, 2, 0, 1)),
                relay.const(W_SCALE),
                relay.const(np.zeros(8, "int32")),
                axis=0,
                out_dtype="int8",
            ),
            dense_weight(),
        ),
    )


def test_only_the_allowed_subgraph_folds(folded_weights: Dict[str, relay.Constant]) -> None:
    """Where stock has one switch for all, one fold_allow folds one subgraph and nothing else."""
    before = net(fgr.fold_allow(conv_weight()), dense_weight())
    after = fgr.FoldConstant()(before)
    assert_equal(after, net(folded_weights["conv"], dense_weight()))
    assert qnn_on_constants(after) == {"qnn.requantize": 1}
    # Stock fold_qnn=True cannot make that distinction: it folds the dense weight as well.
    assert qnn_on_constants(relay.transform.FoldConstant(fold_qnn=True)(before)) == {}


@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_barrier_on_a_constant_inside_fold_allow_wins(policy: str) -> None:
    """``fold_allow(qnn.requantize(fold_barrier(<int8>)))``: nothing folds, the requantize stays."""
    before = net(conv_weight(), fgr.fold_allow(dense_weight(inner=fgr.fold_barrier)))
    result = fgr.fold(before, policy=policy)

    expected_conv = (
        stock_fold_qnn(conv_weight())
        if policy == "fold-qnn"
        else relay.transform.FoldConstantExpr(conv_weight(), tvm.IRModule())
    )
    assert_equal(
        result.mod, net(expected_conv, fgr.fold_allow(dense_weight(inner=fgr.fold_barrier)))
    )
    requantize_reasons = Counter(
        d.reason for d in result.plan.decisions if d.op == "qnn.requantize"
    )
    assert requantize_reasons[Reason.KEPT_BY_BARRIER] == 1, result.plan.explain()
    # A later stock pass, even with fold_qnn=True, keeps the barrier and the requantize above it.
    later = relay.transform.FoldConstant(fold_qnn=True)(result.mod)
    assert op_counts(later)["fold_barrier"] == 1
    assert op_counts(later)["qnn.requantize"] == 3


@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_barrier_operand_folds_but_the_qnn_op_above_it_does_not(policy: str) -> None:
    """``fold_allow(qnn.quantize(fold_barrier(transpose(<fp32>))))``: the transpose folds under the
    barrier (the barrier's operand may fold), the quantize and the annotations stay."""
    before = net(fgr.fold_allow(conv_weight(inner=fgr.fold_barrier)), dense_weight())
    after = fgr.FoldConstant(policy)(before)

    def barrier_on_folded(_: relay.Expr) -> relay.Expr:
        return fgr.fold_barrier(relay.const(W_HWIO.transpose(3, 2, 0, 1)))

    expected_dense = stock_fold_qnn(dense_weight()) if policy == "fold-qnn" else dense_weight()
    assert_equal(after, net(fgr.fold_allow(conv_weight(inner=barrier_on_folded)), expected_dense))


BUILD_CASES = {
    "allow-default": (
        lambda: net(fgr.fold_allow(conv_weight()), fgr.fold_allow(dense_weight())),
        "default",
    ),
    "fold-qnn": (lambda: net(conv_weight(), dense_weight()), "fold-qnn"),
    "barrier": (
        lambda: net(fgr.fold_allow(conv_weight(inner=fgr.fold_barrier)), dense_weight()),
        "default",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BUILD_CASES))
def test_built_module_runs_bit_identically_before_and_after(
    case: str, reference_output: np.ndarray
) -> None:
    make, policy = BUILD_CASES[case]
    before = make()
    after = fgr.FoldConstant(policy)(before)
    out_before = run_relay(before, [X], opt_level=1)[0]
    out_after = run_relay(after, [X], opt_level=1)[0]
    np.testing.assert_array_equal(out_before, reference_output)
    np.testing.assert_array_equal(out_after, out_before)
    # Not a degenerate check: the output spans many quantization steps, not one saturated value.
    assert len(np.unique(out_after)) > 5


@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_folding_a_constant_requantize_leaves_the_input_module_unchanged(policy: str) -> None:
    """Guarantee 4. Stock QNN canonicalization writes the resolved ``rounding="UPWARD"`` /
    ``compute_dtype="int64"`` into the attributes of the ``qnn.requantize`` it lowers, so stock
    ``FoldConstant(fold_qnn=True)`` changes its input module in place; ours must not."""
    allow = fgr.fold_allow if policy == "default" else _same
    before = net(allow(conv_weight()), allow(dense_weight()))
    fgr.FoldConstant(policy)(before)
    assert_equal(before, net(allow(conv_weight()), allow(dense_weight())))
    assert [c.attrs.rounding for c in _calls(before) if c.op.name == "qnn.requantize"] == [
        "None"
    ] * 3


@pytest.mark.stock
def test_stock_fold_qnn_changes_its_input_module_in_place() -> None:
    """The stock behaviour the test above guards against, so that test can fail."""
    before = net(conv_weight(), dense_weight())
    relay.transform.FoldConstant(fold_qnn=True)(before)
    assert sorted(c.attrs.rounding for c in _calls(before) if c.op.name == "qnn.requantize") == [
        "None",
        "None",
        "UPWARD",
    ]
