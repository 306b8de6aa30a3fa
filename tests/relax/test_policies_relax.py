"""Policies on Relax: the size guard, composition, backend policies by name, and ``plan``.

A policy only decides calls whose inputs are all constant; the first matching rule wins, and
precedence is barrier > allow > policy > the IR's default. Golden IR as in test_annotations.py
(``tvm.testing.CompareBeforeAfter`` is not in the 0.27 wheel).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from golden import binding_names, check_before_after
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Action, FoldPolicy, Reason, Rule

A = np.arange(4, dtype="float32")
B = np.full(4, 2.0, dtype="float32")
S = np.full((4, 4), 1.5, dtype="float32")
W_INT8 = (np.arange(16, dtype="int8") - 8).reshape(4, 4)
W_FP32 = np.linspace(-2.0, 2.0, 16, dtype="float32").reshape(4, 4)


def _by_label(plan):
    return {d.label: d for d in plan.decisions}


# ------------------------------------------------------------------------------ size guard


@I.ir_module
class Growing:
    @R.function
    def main(
        x: R.Tensor((64, 64), "float32"),
        x2: R.Tensor((32, 32), "float32"),
        s: R.Tensor((4, 4), "float32"),
    ) -> R.Tuple(
        R.Tensor((64, 64), "float32"), R.Tensor((32, 32), "float32"), R.Tensor((4, 4), "float32")
    ):
        with R.dataflow():
            # kept by size-guard: 16 KiB from a 4-byte scalar (stock folds it)
            bc = R.broadcast_to(R.const(1.5, "float32"), R.shape([64, 64]))
            tl = R.tile(
                R.const(S), [16, 16]
            )  # kept by size-guard: 16 KiB from 64 bytes (stock folds it)
            zz = R.zeros(
                R.shape([32, 32]), "float32"
            )  # kept by size-guard: 4 KiB from nothing (stock folds 1024 elements)
            sm = R.broadcast_to(R.const(1.5, "float32"), R.shape([4, 4]))  # folds: 64 bytes < 4096
            st = R.tile(R.const(A), [4])  # folds: 64 bytes < 4096
            y0 = R.add(x, bc)  # kept: x is a run-time input
            y1 = R.add(y0, tl)  # kept: run-time input
            y2 = R.add(x2, zz)  # kept: run-time input
            y3 = R.add(s, sm)  # kept: run-time input
            y4 = R.add(
                y3, R.reshape(st, R.shape([4, 4]))
            )  # reshape folds (64 bytes); y4 kept: run-time
            R.output(y1, y2, y4)
        return (y1, y2, y4)


@I.ir_module
class GrowingExpected:
    @R.function
    def main(
        x: R.Tensor((64, 64), "float32"),
        x2: R.Tensor((32, 32), "float32"),
        s: R.Tensor((4, 4), "float32"),
    ) -> R.Tuple(
        R.Tensor((64, 64), "float32"), R.Tensor((32, 32), "float32"), R.Tensor((4, 4), "float32")
    ):
        with R.dataflow():
            bc = R.broadcast_to(R.const(1.5, "float32"), R.shape([64, 64]))
            tl = R.tile(R.const(S), [16, 16])
            zz = R.zeros(R.shape([32, 32]), "float32")
            y0 = R.add(x, bc)
            y1 = R.add(y0, tl)
            y2 = R.add(x2, zz)
            y3 = R.add(s, R.const(np.full((4, 4), 1.5, "float32")))
            y4 = R.add(y3, R.const(np.tile(A, 4).reshape(4, 4)))
            R.output(y1, y2, y4)
        return (y1, y2, y4)


@I.ir_module
class OnlyGrowing:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")) -> R.Tensor((64, 64), "float32"):
        with R.dataflow():
            bc = R.broadcast_to(R.const(1.5, "float32"), R.shape([64, 64]))  # kept by size-guard
            tl = R.tile(R.const(S), [16, 16])  # kept by size-guard
            zb = R.zeros(
                R.shape([64, 64]), "float32"
            )  # kept by size-guard (and by stock: > 1024 elements)
            y0 = R.add(x, bc)  # kept: run-time input
            y1 = R.add(y0, tl)  # kept: run-time input
            y2 = R.add(y1, zb)  # kept: run-time input
            R.output(y2)
        return y2


def test_size_guard_keeps_growing_folds_and_folds_small_ones():
    check_before_after(Growing, GrowingExpected, fgr.FoldConstant("size-guard", strict=True))


def test_size_guard_unchanged():
    check_before_after(OnlyGrowing, OnlyGrowing, fgr.FoldConstant("size-guard", strict=True))


def test_size_guard_reasons():
    decisions = _by_label(fgr.plan(OnlyGrowing, "size-guard"))
    for label in ("bc", "tl", "zb"):
        assert decisions[label].action is Action.KEEP
        assert decisions[label].reason is Reason.KEPT_BY_POLICY
        assert decisions[label].rule == "size-guard"
    decisions = _by_label(fgr.plan(Growing, "size-guard"))
    assert [decisions[k].reason for k in ("bc", "tl", "zz")] == [Reason.KEPT_BY_POLICY] * 3
    assert [decisions[k].reason for k in ("sm", "st")] == [Reason.FOLDED] * 2


@pytest.mark.slow
def test_default_policy_folds_what_size_guard_keeps():
    """Sanity of the case: stock (and default) fold bc, tl and the 1024-element zeros."""
    stock = relax.transform.FoldConstant()(Growing)
    ours = fgr.FoldConstant()(Growing)
    tvm.ir.assert_structural_equal(ours, stock)
    assert binding_names(stock)["main"] == ["y0", "y1", "y2", "y3", "y4"]


def test_size_guard_threshold_is_configurable():
    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(
            fold_guard.size_guard(4.0, min_result_bytes=1 << 20, name="huge-only")
        )
        decisions = _by_label(fgr.plan(OnlyGrowing, "huge-only"))
    assert decisions["bc"].reason is Reason.FOLDED  # 16 KiB is below the 1 MiB threshold
    assert decisions["zb"].rule == "default"  # stock's own > 1024-element rule still applies


# ----------------------------------------------------------------------------- composition


@I.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), xb: R.Tensor((64, 64), "float32")) -> R.Tuple(
        R.Tensor((4, 4), "float32"), R.Tensor((64, 64), "float32")
    ):
        with R.dataflow():
            # folds: quantize of a constant (rule fold-quantize-of-constant)
            q = R.quantize(
                R.const(W_FP32),
                R.const(0.25, "float32"),
                R.const(0, "int8"),
                axis=0,
                out_dtype="int8",
            )
            # kept: dequantize of an integer constant (rule keep-dequantize-of-integer-constant)
            w = R.dequantize(q, R.const(0.25, "float32"), R.const(0, "int8"), axis=0)
            bc = R.broadcast_to(R.const(1.5, "float32"), R.shape([64, 64]))  # kept: size-guard
            sm = R.broadcast_to(
                R.const(1.5, "float32"), R.shape([4, 4])
            )  # folds: no rule matches, default
            y0 = R.matmul(x, w)  # kept: run-time input (w is its weight)
            y1 = R.add(y0, sm)  # kept: run-time input
            y2 = R.add(xb, bc)  # kept: run-time input
            R.output(y1, y2)
        return (y1, y2)


@pytest.mark.parametrize(
    "policy",
    [
        ["keep-qdq-weights", "size-guard"],
        fold_guard.compose(
            fold_guard.get_policy("keep-qdq-weights"), fold_guard.get_policy("size-guard")
        ),
    ],
    ids=["list", "compose"],
)
def test_composed_policy_rules(policy):
    plan = fgr.plan(Mixed, policy)
    assert plan.policy_name == "keep-qdq-weights+size-guard"
    decisions = _by_label(plan)
    assert (decisions["q"].reason, decisions["q"].rule) == (
        Reason.FOLDED,
        "fold-quantize-of-constant",
    )
    assert (decisions["w"].reason, decisions["w"].rule) == (
        Reason.KEPT_BY_POLICY,
        "keep-dequantize-of-integer-constant",
    )
    assert (decisions["bc"].reason, decisions["bc"].rule) == (Reason.KEPT_BY_POLICY, "size-guard")
    assert (decisions["sm"].reason, decisions["sm"].rule) == (Reason.FOLDED, "default")


def test_composed_policy_output():
    after = fgr.FoldConstant(["keep-qdq-weights", "size-guard"], strict=True)(Mixed)
    bindings = {b.var.name: b.value for b in after["main"].body.blocks[0].bindings}
    assert list(bindings) == ["w", "bc", "y0", "y1", "y2"]
    # The quantized weight is now an int8 constant feeding the kept dequantize.
    q = bindings["w"].args[0]
    assert isinstance(q, tvm.ir.GenericConst) and q.value.numpy().dtype == np.int8
    assert bindings["bc"].op.name == "relax.broadcast_to"
    # Each policy alone does only its part.
    assert [
        b.var.name for b in fgr.FoldConstant("size-guard")(Mixed)["main"].body.blocks[0].bindings
    ] == ["bc", "y0", "y1", "y2"]
    assert [
        b.var.name
        for b in fgr.FoldConstant("keep-qdq-weights")(Mixed)["main"].body.blocks[0].bindings
    ] == ["w", "y0", "y1", "y2"]


# -------------------------------------------------------------------------- backend policy


def _keep_multiply_policy(name: str = "my-npu") -> FoldPolicy:
    return FoldPolicy(
        name,
        "an NPU that wants multiplies by constants kept, and ones() folded whatever the size",
        (
            Rule(
                "keep-multiply",
                Action.KEEP,
                "the NPU fuses multiply",
                lambda call: call.op == "relax.multiply",
            ),
            Rule(
                "fold-ones",
                Action.FOLD,
                "the NPU has no ones()",
                lambda call: call.op == "relax.ones",
            ),
        ),
    )


@I.ir_module
class ForBackend:
    @R.function
    def main(x: R.Tensor((4,), "float32"), xb: R.Tensor((40, 40), "float32")) -> R.Tuple(
        R.Tensor((4,), "float32"), R.Tensor((40, 40), "float32")
    ):
        with R.dataflow():
            a = R.add(R.const(A), R.const(B))  # folds: no rule matches, the default folds
            m = R.multiply(a, R.const(B))  # kept by my-npu rule keep-multiply
            o = R.ones(
                (40, 40), "float32"
            )  # folds by my-npu rule fold-ones (stock keeps > 1024 elements)
            y = R.add(x, m)  # kept: run-time input
            yb = R.add(xb, o)  # kept: run-time input
            R.output(y, yb)
        return (y, yb)


@I.ir_module
class ForBackendExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32"), xb: R.Tensor((40, 40), "float32")) -> R.Tuple(
        R.Tensor((4,), "float32"), R.Tensor((40, 40), "float32")
    ):
        with R.dataflow():
            m = R.multiply(R.const(A + B), R.const(B))
            y = R.add(x, m)
            yb = R.add(xb, R.const(np.ones((40, 40), "float32")))
            R.output(y, yb)
        return (y, yb)


def test_backend_policy_registered_by_name():
    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(_keep_multiply_policy())
        assert "my-npu" in [p.name for p in fold_guard.list_policies()]
        transform = fgr.FoldConstant("my-npu", strict=True)
        check_before_after(ForBackend, ForBackendExpected, transform)
        decisions = _by_label(fgr.plan(ForBackend, "my-npu"))
        assert (decisions["m"].reason, decisions["m"].rule) == (
            Reason.KEPT_BY_POLICY,
            "keep-multiply",
        )
        assert (decisions["o"].reason, decisions["o"].rule) == (Reason.FOLDED, "fold-ones")
    # The scope restored the registry; a pass built inside it keeps its resolved policy.
    assert "my-npu" not in [p.name for p in fold_guard.list_policies()]
    with pytest.raises(fold_guard.UnknownPolicyError):
        fgr.FoldConstant("my-npu")
    tvm.ir.assert_structural_equal(transform(ForBackend), ForBackendExpected)


def test_backend_policy_unchanged_when_everything_is_kept():
    """A policy that keeps every call leaves the module as it was."""
    keep_all = FoldPolicy(
        "keep-all", "keep everything", (Rule("all", Action.KEEP, "all", lambda call: True),)
    )
    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(keep_all)
        check_before_after(ForBackend, ForBackend, fgr.FoldConstant("keep-all", strict=True))


def test_duplicate_registration_is_an_error_unless_replace():
    with fold_guard.policy_registry_scope():
        fold_guard.register_policy(_keep_multiply_policy())
        with pytest.raises(fold_guard.PreconditionError, match="already registered"):
            fold_guard.register_policy(_keep_multiply_policy())
        fold_guard.register_policy(_keep_multiply_policy(), replace=True)
        with pytest.raises(fold_guard.PreconditionError, match="already registered"):
            fold_guard.register_policy(fold_guard.size_guard())  # built-ins are protected too


# ------------------------------------------------------------------------- unknown names


@pytest.mark.parametrize(
    "spec", ["my-npu", ["keep-qdq-weights", "no-such-policy"]], ids=["name", "in-list"]
)
def test_unknown_policy_raises_at_construction(spec):
    with pytest.raises(fold_guard.UnknownPolicyError) as info:
        fgr.FoldConstant(spec)
    message = str(info.value)
    assert (
        "default, fold-qnn, keep-low-precision-weights, keep-qdq-weights, keep-requantize, "
        "qdq-accelerator, size-guard, weights-only" in message
    )
    assert repr(spec if isinstance(spec, str) else spec[1]) in message
    assert isinstance(info.value, ValueError)  # PreconditionError is a ValueError


def test_unknown_policy_in_plan_and_fold():
    with pytest.raises(fold_guard.UnknownPolicyError, match="'nope'"):
        fgr.plan(Mixed, "nope")
    with pytest.raises(fold_guard.UnknownPolicyError, match="'nope'"):
        fgr.fold(Mixed, policy="nope")


@pytest.mark.parametrize("spec", [[], 3, None])
def test_malformed_policy_spec(spec):
    with pytest.raises(fold_guard.PreconditionError, match="known names: default"):
        fgr.FoldConstant(spec)


# ------------------------------------------------------------------------------------ plan


def test_plan_does_not_change_the_module_and_explains_every_call():
    saved = tvm.ir.save_json(Mixed)
    plan = fgr.plan(Mixed, "keep-qdq-weights")
    assert tvm.ir.save_json(Mixed) == saved
    labels = [b.var.name for b in Mixed["main"].body.blocks[0].bindings]
    assert [d.label for d in plan.decisions] == labels
    text = plan.explain()
    lines = text.splitlines()
    assert lines[0].startswith("fold plan under policy 'keep-qdq-weights':")
    assert len(lines) == 1 + len(labels)
    for line, decision in zip(lines[1:], plan.decisions):
        assert line.strip().startswith(
            f"main: {decision.label} = {decision.op}: {decision.reason.text}"
        )
    assert "w = relax.dequantize: kept by policy [keep-dequantize-of-integer-constant]" in text
    assert "q = relax.quantize: folded [fold-quantize-of-constant]" in text
    assert "y0 = relax.matmul: not constant: 'x' is a run-time input" in text


@pytest.mark.parametrize("policy", ["default", "keep-qdq-weights", "size-guard"])
def test_plan_agrees_with_fold(policy):
    planned = fgr.plan(Mixed, policy)
    result = fgr.fold(Mixed, policy=policy)
    assert planned.decisions == result.plan.decisions
    assert result.report.plan.decisions == result.plan.decisions


@pytest.mark.slow
def test_weights_only_on_the_transformer_block_folds_exactly_the_weights_and_biases():
    """On a real QDQ transformer block: every matmul weight (with its transpose) and bias folds;
    the layer-norm parameters and the attention's constant factor, also dequantize(int const)
    calls, stay because their results are not weight or bias inputs."""
    from _common import onnx_models

    model = onnx_models.make_transformer_block()
    mod = onnx_models.import_relax(model)
    result = fgr.fold(mod, policy="weights-only")
    graph, consumers = result.plan.graph, result.plan.graph.consumers()
    users = lambda d: sorted({graph.nodes[u].op for u in consumers[d.node]})  # noqa: E731
    weights = len(onnx_models.weight_shapes(model))
    folded_dq = [d for d in result.plan.folded if d.op == "relax.dequantize"]
    assert len(folded_dq) == 2 * weights  # one weight and one bias per Gemm
    assert (
        sorted(d.op for d in result.plan.folded if d.op != "relax.dequantize")
        == ["relax.permute_dims"] * weights
    )
    kept = [d for d in result.plan.kept if d.rule == "keep-non-weight-constants"]
    assert {op for d in kept for op in users(d)} == {"relax.nn.layer_norm", "relax.multiply"}
    assert (
        len(kept) == 5
    )  # 2 layer norms x (scale, bias) + the constant factor of the attention scores
    feed = onnx_models.input_feed(model)
    np.testing.assert_allclose(
        onnx_models.run_relax(result.mod, list(feed.values()))[0],
        onnx_models.run_relax(mod, list(feed.values()))[0],
        rtol=0,
        atol=1e-6,
    )
