"""Golden-IR tests of ``R.fold_barrier`` / ``R.fold_allow`` under ``fold_guard.relax.FoldConstant``.

``tvm.testing.CompareBeforeAfter`` is not shipped in the apache-tvm 0.27 wheel (``tvm.testing``
has no such attribute), so every case is an explicit ``Before`` / ``Expected`` pair compared with
``tvm.ir.assert_structural_equal``, plus the binding names, which structural equality ignores.
Expected constants are computed with NumPy from ops that are exact in float32 (add, multiply,
dequantize by a power of two), so a bit-exact comparison is meaningful.

TVMScript here uses the public ``from tvm.script import relax as R``, which knows
``R.fold_barrier`` / ``R.fold_allow`` once ``fold_guard.relax`` is imported; ``tvm.script.from_source``
resolves ``R`` to ``tvm.script.parser.relax`` instead, and both must work.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import binding_names, check_before_after, op_calls
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason

A = np.arange(4, dtype="float32")
B = np.full(4, 2.0, dtype="float32")
W_INT8 = (np.arange(16, dtype="int8") - 8).reshape(4, 4)


# ----------------------------------------------------------------------------------- helpers


def _copy(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _decision(result, label: str):
    (decision,) = [d for d in result.plan.decisions if d.label == label]
    return decision


STRICT = fgr.FoldConstant(strict=True)


# -------------------------------------------------------------- barrier on a constant subgraph


@I.ir_module
class BarrierOnConstantSubgraph:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            c = R.add(R.const(A), R.const(B))  # folds: both inputs are constants
            m = R.multiply(c, R.const(B))  # folds: c folded, B constant
            b = R.fold_barrier(m)  # kept: a barrier always stays (its operand m folds under it)
            d = R.add(b, R.const(B))  # kept: consumes the barrier, which counts as non-constant
            y = R.add(x, d)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class BarrierOnConstantSubgraphExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            b = R.fold_barrier(R.const((A + B) * B))
            d = R.add(b, R.const(B))
            y = R.add(x, d)
            R.output(y)
        return y


@I.ir_module
class PlainConstantSubgraph:
    """BarrierOnConstantSubgraph without the barrier: the reference for run-time numerics."""

    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            c = R.add(R.const(A), R.const(B))
            m = R.multiply(c, R.const(B))
            d = R.add(m, R.const(B))
            y = R.add(x, d)
            R.output(y)
        return y


def test_barrier_operand_folds_consumer_does_not():
    """c = A + B; m = c * B; b = barrier(m); d = b + B ==> b = barrier(<(A+B)*B>); d = b + B"""
    check_before_after(BarrierOnConstantSubgraph, BarrierOnConstantSubgraphExpected, STRICT)


def test_barrier_decisions_and_reasons():
    result = fgr.fold(BarrierOnConstantSubgraph, strict=True)
    assert [(d.label, d.reason) for d in result.plan.decisions] == [
        ("c", Reason.FOLDED),
        ("m", Reason.FOLDED),
        ("b", Reason.KEPT_BY_BARRIER),
        ("d", Reason.KEPT_BY_BARRIER),
        ("y", Reason.NOT_CONSTANT),
    ]
    assert "b" in _decision(result, "d").detail  # names the barrier it sits behind


@I.ir_module
class BarrierOnLiteralConstant:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            b = R.fold_barrier(R.const(A))  # kept: barrier
            d = R.multiply(b, R.const(B))  # kept: its input is behind the barrier
            y = R.add(x, d)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class BarrierOnRuntimeValue:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.add(x, R.const(A))  # kept: x is a run-time input
            b = R.fold_barrier(a)  # kept: barrier
            d = R.multiply(b, R.const(B))  # kept: behind the barrier (and not constant anyway)
            R.output(d)
        return d


@pytest.mark.parametrize(
    "before", [BarrierOnLiteralConstant, BarrierOnRuntimeValue], ids=["literal", "runtime"]
)
@pytest.mark.parametrize("policy", ["default", "keep-qdq-weights", "size-guard"])
def test_barrier_unchanged(before, policy):
    """Nothing to fold: Expected is Before, under every built-in policy."""
    check_before_after(before, before, fgr.FoldConstant(policy, strict=True))


# ------------------------------------------------------- guarantee 3 and 5: stock pass, build


def test_barrier_survives_later_stock_fold_constant():
    ours = STRICT(BarrierOnConstantSubgraph)
    stock_after = relax.transform.FoldConstant()(ours)
    tvm.ir.assert_structural_equal(stock_after, ours)
    assert len(op_calls(stock_after, "relax.fold_barrier")) == 1


def test_stock_fold_constant_alone_does_not_cross_barrier():
    stock = relax.transform.FoldConstant()(BarrierOnConstantSubgraph)
    tvm.ir.assert_structural_equal(stock, BarrierOnConstantSubgraphExpected)


def test_annotated_modules_build_and_match_unannotated():
    """Annotations lower to identity: every stage runs to the unannotated module's output."""
    x = np.array([0.5, -1.0, 3.0, 7.25], dtype="float32")
    reference = _run(PlainConstantSubgraph, x)
    np.testing.assert_array_equal(reference, x + (A + B) * B + B)
    ours = STRICT(BarrierOnConstantSubgraph)
    stages = {
        "annotated": BarrierOnConstantSubgraph,
        "ours": ours,
        "ours+stock": relax.transform.FoldConstant()(ours),
    }
    for name, mod in stages.items():
        np.testing.assert_array_equal(_run(mod, x), reference, err_msg=name)
    # An unfolded fold_allow also lowers to identity.
    np.testing.assert_array_equal(_run(AllowRemovesItself, x), x + A + B)


# ---------------------------------------------------------------------------------- allow


@I.ir_module
class AllowRemovesItself:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            c = R.add(R.const(A), R.const(B))  # folds: constants (default policy would too)
            a = R.fold_allow(c)  # folds: its operand is constant, so the annotation disappears
            y = R.add(x, a)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class AllowRemovesItselfExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            y = R.add(x, R.const(A + B))
            R.output(y)
        return y


def test_allow_disappears_once_operand_folds():
    """c = A + B; a = allow(c); y = x + a ==> y = x + <A+B>"""
    after = check_before_after(AllowRemovesItself, AllowRemovesItselfExpected, STRICT)
    assert op_calls(after, "relax.fold_allow") == []


def test_allow_is_not_folded_by_stock():
    """Stock FoldConstant cannot evaluate fold_allow (its legalized form is not a TIR call)."""
    stock = relax.transform.FoldConstant()(AllowRemovesItself)
    assert len(op_calls(stock, "relax.fold_allow")) == 1


@I.ir_module
class QdqWeight:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            # kept under keep-qdq-weights: dequantize of an int8 constant (rule keep-dequantize-...)
            w = R.dequantize(R.const(W_INT8), R.const(0.5, "float32"), R.const(0, "int8"), axis=0)
            y = R.matmul(x, w)  # kept: x is a run-time input (w is its weight)
            R.output(y)
        return y


@I.ir_module
class AllowedQdqWeight:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            # folds: inside a fold_allow subgraph, which outranks the keep-qdq-weights policy
            w = R.dequantize(R.const(W_INT8), R.const(0.5, "float32"), R.const(0, "int8"), axis=0)
            wa = R.fold_allow(w)  # folds: operand constant, annotation removed
            y = R.matmul(x, wa)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class AllowedQdqWeightExpected:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            y = R.matmul(x, R.const(W_INT8.astype("float32") * np.float32(0.5)))
            R.output(y)
        return y


def test_keep_qdq_weights_keeps_dequantize_unchanged():
    after = check_before_after(
        QdqWeight, QdqWeight, fgr.FoldConstant("keep-qdq-weights", strict=True)
    )
    assert len(op_calls(after, "relax.dequantize")) == 1
    decision = _decision(fgr.fold(QdqWeight, policy="keep-qdq-weights"), "w")
    assert decision.reason is Reason.KEPT_BY_POLICY
    assert decision.rule == "keep-dequantize-of-integer-constant"


def test_allow_overrides_keeping_policy():
    """w = dequantize(<int8>); wa = allow(w) ==> <int8 * 0.5> under keep-qdq-weights"""
    check_before_after(
        AllowedQdqWeight,
        AllowedQdqWeightExpected,
        fgr.FoldConstant("keep-qdq-weights", strict=True),
    )
    decision = _decision(fgr.fold(AllowedQdqWeight, policy="keep-qdq-weights"), "w")
    assert decision.reason is Reason.FOLDED and decision.rule == "fold_allow"


@I.ir_module
class OutsideDataflow:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        a = R.add(R.const(A), R.const(B))  # kept: relax folds operators only inside dataflow blocks
        y = R.add(x, a)  # kept: x is a run-time input
        return y


@I.ir_module
class AllowOutsideDataflow:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        a = R.add(
            R.const(A), R.const(B)
        )  # folds: in an allowed subgraph (IR default would keep it)
        b = R.fold_allow(a)  # folds: operand constant
        y = R.add(x, b)  # kept: x is a run-time input
        return y


@I.ir_module
class AllowOutsideDataflowExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        y = R.add(x, R.const(A + B))
        return y


@I.ir_module
class LargeCreation:
    @R.function
    def main(x: R.Tensor((40, 40), "float32")) -> R.Tensor((40, 40), "float32"):
        with R.dataflow():
            o = R.ones(
                (40, 40), "float32"
            )  # kept: creation op of 1600 > 1024 elements (stock rule)
            y = R.add(x, o)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class AllowLargeCreation:
    @R.function
    def main(x: R.Tensor((40, 40), "float32")) -> R.Tensor((40, 40), "float32"):
        with R.dataflow():
            o = R.ones((40, 40), "float32")  # folds: allowed, outranking the 1024-element rule
            oa = R.fold_allow(o)  # folds: operand constant
            y = R.add(x, oa)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class AllowLargeCreationExpected:
    @R.function
    def main(x: R.Tensor((40, 40), "float32")) -> R.Tensor((40, 40), "float32"):
        with R.dataflow():
            y = R.add(x, R.const(np.ones((40, 40), "float32")))
            R.output(y)
        return y


@pytest.mark.parametrize(
    "before", [OutsideDataflow, LargeCreation], ids=["outside-dataflow", "large-creation"]
)
def test_ir_default_keeps_unchanged(before):
    check_before_after(before, before, STRICT)
    check_before_after(before, before, relax.transform.FoldConstant())  # the same as stock
    decision = fgr.fold(before).plan.decisions[0]
    assert decision.reason is Reason.KEPT_BY_POLICY and decision.rule == "default"


@pytest.mark.parametrize(
    "before, expected",
    [
        (AllowOutsideDataflow, AllowOutsideDataflowExpected),
        (AllowLargeCreation, AllowLargeCreationExpected),
    ],
    ids=["outside-dataflow", "large-creation"],
)
def test_allow_overrides_ir_default(before, expected):
    check_before_after(before, expected, STRICT)


# ------------------------------------------------------------------------ precedence


@I.ir_module
class BarrierInsideAllow:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.add(R.const(A), R.const(B))  # folds: constant (a barrier's operand may fold)
            b = R.fold_barrier(a)  # kept: barrier
            c = R.multiply(b, R.const(B))  # kept: the barrier wins over the allow below
            d = R.fold_allow(c)  # kept: its operand is behind a barrier
            y = R.add(x, d)  # kept: x is a run-time input
            R.output(y)
        return y


@I.ir_module
class BarrierInsideAllowExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            b = R.fold_barrier(R.const(A + B))
            c = R.multiply(b, R.const(B))
            d = R.fold_allow(c)
            y = R.add(x, d)
            R.output(y)
        return y


def test_barrier_inside_allowed_subgraph_wins():
    """a = A+B; b = barrier(a); c = b*B; d = allow(c) ==> b = barrier(<A+B>); c, d stay"""
    check_before_after(
        BarrierInsideAllow, BarrierInsideAllowExpected, fgr.FoldConstant(strict=False)
    )
    result = fgr.fold(BarrierInsideAllow)
    assert _decision(result, "c").reason is Reason.KEPT_BY_BARRIER
    assert _decision(result, "d").reason is Reason.KEPT_BY_BARRIER


def test_barrier_inside_allowed_subgraph_strict_raises():
    with pytest.raises(fold_guard.FoldNotPossibleError, match=r"\bd = fold_allow") as info:
        fgr.fold(BarrierInsideAllow, strict=True)
    assert "barrier b" in str(info.value)


# ------------------------------------------------------------- allow over a run-time value


@I.ir_module
class AllowOverRuntime:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.add(x, R.const(A))  # kept: x is a run-time input
            b = R.fold_allow(a)  # kept: its operand cannot be computed from constants
            R.output(b)
        return b


def test_allow_over_runtime_value_stays():
    check_before_after(AllowOverRuntime, AllowOverRuntime, fgr.FoldConstant(strict=False))
    decision = _decision(fgr.fold(AllowOverRuntime), "b")
    assert decision.reason is Reason.NOT_CONSTANT
    assert "a" in decision.detail


def test_allow_over_runtime_value_strict_raises():
    saved = tvm.ir.save_json(AllowOverRuntime)
    with pytest.raises(
        fold_guard.FoldNotPossibleError, match=r"function main: b = fold_allow"
    ) as info:
        fgr.fold(AllowOverRuntime, strict=True)
    assert "input a is not constant" in str(info.value)
    assert tvm.ir.save_json(AllowOverRuntime) == saved


# ------------------------------------------------------------------------- conflicts


@I.ir_module
class AllowOfBarrier:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.add(R.const(A), R.const(B))
            b = R.fold_barrier(a)
            c = R.fold_allow(b)  # an error: a value cannot be both allowed and barred
            y = R.add(x, c)
            R.output(y)
        return y


def test_allow_of_barrier_is_an_error_and_input_unchanged():
    saved = tvm.ir.save_json(AllowOfBarrier)
    with pytest.raises(fold_guard.ConflictingAnnotationsError, match=r"c = fold_allow\(b\)"):
        fgr.fold(AllowOfBarrier)
    with pytest.raises(fold_guard.ConflictingAnnotationsError):
        fgr.plan(AllowOfBarrier)
    assert tvm.ir.save_json(AllowOfBarrier) == saved


@pytest.mark.parametrize(
    "mod, transform, error",
    [
        (AllowOfBarrier, fgr.FoldConstant(), fold_guard.ConflictingAnnotationsError),
        (AllowOverRuntime, fgr.FoldConstant(strict=True), fold_guard.FoldNotPossibleError),
    ],
    ids=["conflict", "strict"],
)
def test_pass_form_keeps_error_type(mod, transform, error):
    with pytest.raises(error):
        transform(mod)


def test_pass_form_error_message_survives():
    """What does hold through the Pass form: the message names the expression."""
    with pytest.raises(Exception, match=r"c = fold_allow\(b\)"):
        fgr.FoldConstant()(AllowOfBarrier)


def test_barrier_of_allow_is_fine():
    """barrier(allow(A+B)) ==> barrier(<A+B>): the suggested fix for the conflict."""
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(relax.const(A), relax.const(B)), name_hint="s")
            a = bb.emit(fgr.fold_allow(s), name_hint="a")
            b = bb.emit(fgr.fold_barrier(a), name_hint="b")
            y = bb.emit_output(relax.op.add(x, b), name_hint="y")
        bb.emit_func_output(y)
    after = STRICT(bb.get())
    (barrier,) = op_calls(after, "relax.fold_barrier")
    assert isinstance(barrier.args[0], tvm.ir.GenericConst)
    np.testing.assert_array_equal(barrier.args[0].value.numpy(), A + B)
    assert op_calls(after, "relax.fold_allow") == []


# --------------------------------------------------------------- printing and serialization


@pytest.mark.parametrize(
    "mod",
    [BarrierInsideAllow, BarrierInsideAllowExpected, AllowRemovesItself],
    ids=["before", "folded-form", "allow"],
)
def test_print_json_and_reparse_round_trip(mod):
    text = mod.script()
    assert "R.fold_barrier(" in text or "R.fold_allow(" in text
    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(mod)), mod)
    tvm.ir.assert_structural_equal(tvm.script.from_source(mod.script(show_meta=True)), mod)


def test_print_shows_both_annotations():
    text = BarrierInsideAllow.script()
    assert "R.fold_barrier(" in text and "R.fold_allow(" in text


def test_folded_output_round_trips_and_stays_folded():
    after = STRICT(BarrierOnConstantSubgraph)
    reparsed = tvm.script.from_source(after.script(show_meta=True))
    tvm.ir.assert_structural_equal(reparsed, after)
    loaded = tvm.ir.load_json(tvm.ir.save_json(after))
    tvm.ir.assert_structural_equal(loaded, after)
    tvm.ir.assert_structural_equal(STRICT(loaded), after)


def test_builder_api_matches_tvmscript():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.add(relax.const(A), relax.const(B)), name_hint="c")
            a = bb.emit(fgr.fold_allow(c), name_hint="a")
            y = bb.emit_output(relax.op.add(x, a), name_hint="y")
        bb.emit_func_output(y)
    built = bb.get()
    tvm.ir.assert_structural_equal(built, AllowRemovesItself)
    assert binding_names(built) == binding_names(AllowRemovesItself)


def test_public_tvmscript_namespace_parses_annotations():
    """Both namespaces TVMScript resolves ``R`` to know the annotations."""
    import tvm.script.parser.relax as parser_R
    from tvm.script import relax as public_R

    for namespace in (parser_R, public_R):
        assert namespace.fold_barrier is fgr.fold_barrier and namespace.fold_allow is fgr.fold_allow

    @I.ir_module
    class UserModule:
        @public_R.function
        def main(x: public_R.Tensor((4,), "float32")) -> public_R.Tensor((4,), "float32"):
            b = public_R.fold_barrier(x)
            return b

    assert len(op_calls(UserModule, "relax.fold_barrier")) == 1


# ----------------------------------------------------------------------- import twice


def test_importing_twice_is_harmless():
    before_names = [
        n for n in tvm.ir.Op.list_op_names() if n in ("relax.fold_barrier", "relax.fold_allow")
    ]
    importlib.reload(fgr)
    importlib.reload(fgr)
    after_names = [
        n for n in tvm.ir.Op.list_op_names() if n in ("relax.fold_barrier", "relax.fold_allow")
    ]
    assert sorted(before_names) == sorted(after_names) == ["relax.fold_allow", "relax.fold_barrier"]
    # The ops, the parser and the pass all still work after the reload.
    tvm.ir.assert_structural_equal(
        tvm.script.from_source(BarrierInsideAllow.script(show_meta=True)), BarrierInsideAllow
    )
    check_before_after(
        BarrierOnConstantSubgraph, BarrierOnConstantSubgraphExpected, fgr.FoldConstant(strict=True)
    )
    assert tvm_ffi.structural_equal(
        fgr.fold_barrier(relax.const(A)),
        relax.Call(tvm.ir.Op.get("relax.fold_barrier"), [relax.const(A)]),
    )


def test_tvmscript_parses_after_plain_import_fold_guard(tmp_path):
    """`import fold_guard` alone (no `fold_guard.relax`) is enough for R.fold_barrier to parse."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import fold_guard
        from tvm.script import ir as I
        from tvm.script import relax as R

        @I.ir_module
        class Module:
            @R.function
            def main(x: R.Tensor((4,), "float32")):
                with R.dataflow():
                    a = R.fold_allow(x)
                    b = R.fold_barrier(a)
                    R.output(b)
                return b

        print(*[b.value.op.name for b in Module["main"].body.blocks[0].bindings])
        """
    )
    path = tmp_path / "annotated.py"  # the parser reads the source back, so not `python -c`
    path.write_text(script)
    result = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["relax.fold_allow", "relax.fold_barrier"]
