"""Requantize chains and float16 / bfloat16 weights on hand-written Relax modules (golden IR).

Requantize chain, under the QDQ policies (``keep-requantize`` composed first keeps it whole)::

    w1 = dequantize(<int8 W>, s1)        folds (fold-requantize-chain): read only by a quantize
    w2 = quantize(w1, s2)                folds: the int8 weight at scale s2
    w3 = dequantize(w2, s2)              stays: dequantize(<int8 W at s2>), the QDQ weight
    y  = matmul(x, w3)

Low-precision weight, under keep-low-precision-weights and the QDQ policies::

    w = astype(<float16 W>, "float32")   stays: the backend gets the float16 constant
    y = matmul(x, w)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from build_once import run_mains
from golden import CONSTANT_TYPE, check_before_after, op_calls
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")
RNG = np.random.default_rng(25)
W_INT8 = RNG.integers(-127, 128, size=(8, 4)).astype("int8")
S1 = np.float32(0.01)
S2 = np.float32(0.03)  # coarser: the chain changes the integer values
W_HALF = RNG.standard_normal((8, 4)).astype("float16")
W_BF16 = RNG.standard_normal((8, 4)).astype(np.float32).astype(ml_dtypes.bfloat16)


def chain_module() -> tvm.IRModule:
    @I.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                # folds under the QDQ policies: its only reader is a quantize that folds
                w1 = R.dequantize(
                    R.const(W_INT8), R.const(S1), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                # folds: the int8 weight at scale s2
                w2 = R.quantize(w1, R.const(S2), R.const(0, "int8"), axis=1, out_dtype="int8")
                # stays: dequantize of an integer constant (keep-dequantize-of-integer-constant)
                w3 = R.dequantize(w2, R.const(S2), R.const(0, "int8"), axis=1, out_dtype="float32")
                y = R.matmul(x, w3)  # not constant: x is a run-time input
                R.output(y)
            return y

    return Chain


def stock_chain_constant() -> np.ndarray:
    """``quantize(dequantize(W, s1), s2)`` as the stock FoldConstant evaluates it."""

    @I.ir_module
    class JustTheChain:
        @R.function
        def main():
            with R.dataflow():
                w1 = R.dequantize(
                    R.const(W_INT8), R.const(S1), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                w2 = R.quantize(w1, R.const(S2), R.const(0, "int8"), axis=1, out_dtype="int8")
                R.output(w2)
            return w2

    body = relax.transform.FoldConstant()(JustTheChain)["main"].body.body
    assert isinstance(body, CONSTANT_TYPE)  # the whole chain folded to the returned constant
    return body.value.numpy()


def chain_expected(constant: np.ndarray) -> tvm.IRModule:
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                w3 = R.dequantize(
                    R.const(constant), R.const(S2), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                y = R.matmul(x, w3)
                R.output(y)
            return y

    return Expected


def test_the_chain_constant_is_numpys_requantization():
    """The reference the other tests compare with: round-half-to-even of W * s1 / s2, clipped."""
    want = np.clip(np.round(W_INT8.astype(np.float32) * S1 / S2), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(stock_chain_constant(), want)
    assert not np.array_equal(want, W_INT8)


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_a_chain_folds_to_one_int8_constant_at_the_last_scale(policy):
    after = check_before_after(
        chain_module(), chain_expected(stock_chain_constant()), fgr.FoldConstant(policy)
    )
    (dequantize,) = op_calls(after, "relax.dequantize")
    # Bit-identical to evaluating the chain (stock's kernels), byte for byte.
    assert dequantize.args[0].value.numpy().tobytes() == stock_chain_constant().tobytes()


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_the_report_gives_each_step_its_rule(policy):
    report = fgr.fold(chain_module(), policy=policy).report.explain()
    assert "w1 = relax.dequantize: folded [fold-requantize-chain]" in report
    assert "w2 = relax.quantize: folded [fold-quantize-of-constant]" in report
    assert "w3 = relax.dequantize: kept by policy [keep-dequantize-of-integer-constant]" in report


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_keep_requantize_composed_first_keeps_the_chain(policy):
    """Expected is Before: the boundary stays for a backend that wants both scales."""
    check_before_after(
        chain_module(), chain_module(), fgr.FoldConstant(["keep-requantize", policy])
    )


def test_default_folds_the_chain_as_stock_does():
    tvm.ir.assert_structural_equal(
        fgr.FoldConstant()(chain_module()), relax.transform.FoldConstant()(chain_module())
    )


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_annotate_carries_the_chain_through_stock_folding(policy):
    """annotate puts one barrier, on the last dequantize's operand; stock then folds the rest.

    w3 = dequantize(fold_barrier(quantize(dequantize(W, s1), s2)), s2)
    ==>  stock FoldConstant: dequantize(fold_barrier(<int8 W at s2>), s2)
    """
    annotated = fgr.annotate(chain_module(), policy=policy)
    assert [(p.label, p.rule) for p in annotated.barriers] == [
        ("w3", "keep-dequantize-of-integer-constant")
    ]
    stock = relax.transform.FoldConstant()(annotated.mod)
    (barrier,) = op_calls(stock, "relax.fold_barrier")
    assert barrier.args[0].value.numpy().tobytes() == stock_chain_constant().tobytes()
    assert len(op_calls(stock, "relax.dequantize")) == 1 and not op_calls(stock, "relax.quantize")


def test_annotate_under_keep_requantize_guards_the_first_dequantize():
    annotated = fgr.annotate(chain_module(), policy=["keep-requantize", "keep-qdq-weights"])
    assert [(p.label, p.rule) for p in annotated.barriers] == [("w1", "keep-requantize-boundary")]
    stock = relax.transform.FoldConstant()(annotated.mod)
    assert (
        len(op_calls(stock, "relax.dequantize")) == 2
        and len(op_calls(stock, "relax.quantize")) == 1
    )


@pytest.mark.slow
def test_the_folded_chain_runs_to_the_unfolded_output():
    x = RNG.standard_normal((2, 8)).astype("float32")
    mods = {"unfolded": chain_module()}
    for policy in QDQ_POLICIES + ("keep-requantize",):
        mods[policy] = fgr.FoldConstant(policy)(chain_module())
        mods[f"annotated {policy}"] = fgr.annotate(chain_module(), policy=policy).mod
    outputs = run_mains(mods, x)
    for name, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), name
    weight = stock_chain_constant().astype(np.float32) * S2
    np.testing.assert_allclose(outputs["unfolded"], x @ weight, rtol=1e-5, atol=1e-5)


# Low-precision weights ------------------------------------------------------------------------


def half_module(weight: np.ndarray) -> tvm.IRModule:
    @I.ir_module
    class Half:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                # stays under keep-low-precision-weights: a half weight's cast feeding a matmul
                w = R.astype(R.const(weight), "float32")
                y = R.matmul(x, w)  # not constant: x is a run-time input
                R.output(y)
            return y

    return Half


HALF_WEIGHTS = {"float16": W_HALF, "bfloat16": W_BF16}
KEEPING = ("keep-low-precision-weights",) + QDQ_POLICIES


@pytest.mark.parametrize("dtype", sorted(HALF_WEIGHTS))
@pytest.mark.parametrize("policy", KEEPING)
def test_a_half_weight_keeps_its_cast(dtype, policy):
    """Expected is Before: the backend receives the half-precision constant, not a float32 copy."""
    weight = HALF_WEIGHTS[dtype]
    check_before_after(half_module(weight), half_module(weight), fgr.FoldConstant(policy))
    report = fgr.fold(half_module(weight), policy=policy).report
    assert report.constant_bytes_after == report.constant_bytes_before == weight.nbytes


@pytest.mark.parametrize("dtype", sorted(HALF_WEIGHTS))
@pytest.mark.parametrize("policy", ["default", "weights-only"])
def test_other_policies_fold_it_as_stock_does(dtype, policy):
    weight = HALF_WEIGHTS[dtype]
    folded = fgr.FoldConstant(policy)(half_module(weight))
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(half_module(weight)))
    assert not op_calls(folded, "relax.astype")


@pytest.mark.parametrize("dtype", sorted(HALF_WEIGHTS))
def test_annotate_keeps_the_cast_through_stock_folding(dtype):
    """annotate guards the half constant; a later stock FoldConstant cannot fold the cast."""
    weight = HALF_WEIGHTS[dtype]

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                w_operand = R.fold_barrier(R.const(weight))
                w = R.astype(w_operand, "float32")
                y = R.matmul(x, w)
                R.output(y)
            return y

    annotated = fgr.annotate(half_module(weight), policy="keep-low-precision-weights").mod
    check_before_after(annotated, Expected, relax.transform.FoldConstant())


@pytest.mark.slow
def test_the_kept_cast_runs_to_the_folded_output():
    x = RNG.standard_normal((2, 8)).astype("float32")
    mods = {}
    for dtype, weight in HALF_WEIGHTS.items():
        mods[f"{dtype} stock"] = relax.transform.FoldConstant()(half_module(weight))
        mods[f"{dtype} kept"] = fgr.FoldConstant("keep-low-precision-weights")(half_module(weight))
    outputs = run_mains(mods, x)
    for dtype, weight in HALF_WEIGHTS.items():
        kept = outputs[f"{dtype} kept"]
        assert kept.tobytes() == outputs[f"{dtype} stock"].tobytes()
        np.testing.assert_allclose(kept, x @ weight.astype(np.float32), rtol=1e-5, atol=1e-5)
