"""One batched evaluation: kernels are shared per op signature, whatever the shapes.

Counts, not timings: the number of kernels compiled is a property of the design (one per op
signature), and the output must still equal the stock pass's, constant for constant.

White-box on purpose: it tests translation's batched legalization (``_translate.legalize``), a
private mechanism.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import fold_guard.relax as fgr


def qdq_chain(weight_shapes: Sequence[Tuple[int, int]], seed: int = 0) -> tvm.IRModule:
    """x -> [matmul with dequantize(quantize(W_i))]* ; every W_i an fp32 constant.

    quantize(W_i) and dequantize(...) fold; every matmul keeps its run-time input.
    """
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, weight_shapes[0][0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            act = x
            for rows, cols in weight_shapes:
                weight = rng.standard_normal((rows, cols)).astype("float32")
                scale = (np.abs(weight).max(axis=1) / 127.0).astype("float32")
                zero = np.zeros(rows, "int8")
                q = bb.emit(
                    relax.op.quantize(
                        relax.const(weight),
                        relax.const(scale),
                        relax.const(zero),
                        axis=0,
                        out_dtype="int8",
                    )
                )
                dq = bb.emit(
                    relax.op.dequantize(
                        q, relax.const(scale), relax.const(zero), axis=0, out_dtype="float32"
                    )
                )
                act = bb.emit(relax.op.matmul(act, dq))
            out = bb.emit_output(act)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "regime, shapes",
    [
        ("same", [(8, 8)] * 6),
        ("distinct", [(4 + i, 5 + i) for i in range(6)]),
    ],
)
def test_two_kernels_serve_every_block(regime: str, shapes) -> None:
    """6 x (quantize, dequantize) ==> 12 folds from 2 compiled kernels, equal to stock."""
    mod = qdq_chain(shapes)
    result = fgr.fold(mod, strict=True)
    assert len(result.plan.folded) == 12
    assert result.report.kernels_compiled + result.report.kernels_cached == 2, regime
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def test_scalar_scales_do_not_multiply_kernels() -> None:
    """Scalar scales are passed as buffers: different scale values do not mean new kernels."""
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = x
            for _ in range(5):
                w = relax.const(rng.standard_normal(4).astype("float32"))
                scale = relax.const(np.float32(rng.uniform(0.01, 0.1)))
                q = bb.emit(
                    relax.op.quantize(w, scale, relax.const(np.int8(0)), axis=0, out_dtype="int8")
                )
                acc = bb.emit(relax.op.add(acc, relax.op.astype(q, "float32")))
            out = bb.emit_output(acc)
        bb.emit_func_output(out)
    mod = bb.get()
    result = fgr.fold(mod, strict=True)
    # 5 quantize + 5 astype fold; one quantize kernel and one astype kernel
    assert len(result.plan.folded) == 10
    assert result.report.kernels_compiled + result.report.kernels_cached == 2
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def test_astype_of_scalar_constant_is_left_like_stock() -> None:
    """astype(scalar const) legalizes to a constant, not a TIR call, so stock keeps the call.

    c = astype(2.5f32, "int32")   ==>   unchanged under default, folded under fold_allow
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((), "int32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.astype(relax.const(np.float32(2.5)), "int32"))
            out = bb.emit_output(relax.op.add(x, c))
        bb.emit_func_output(out)
    mod = bb.get()
    result = fgr.fold(mod)
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    decision = result.plan.decisions[0]
    assert decision.reason.text == "kept by policy" and decision.rule == "default"
    assert "not a TIR call" in decision.detail


def test_report_counts_constant_bytes_and_kernels() -> None:
    """y = x + (c1 + c2), c1, c2: (2, 2) float32  ==>  y = x + C: 32 constant bytes become 16."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(
                relax.op.add(
                    relax.const(np.ones((2, 2), "float32")), relax.const(np.ones((2, 2), "float32"))
                )
            )
            out = bb.emit_output(relax.op.add(x, c))
        bb.emit_func_output(out)
    report = fgr.fold(bb.get(), strict=True).report
    assert (report.constant_bytes_before, report.constant_bytes_after) == (32, 16)
    assert report.kernels_compiled + report.kernels_cached == 1
    assert set(report.seconds) == {"walk", "legalize", "plan", "compile", "evaluate", "rewrite"}


def test_result_shapes_are_read_without_an_analyzer_where_dims_are_plain(monkeypatch) -> None:
    """A symbolic kernel's result dims are sizes and dim vars: read directly, they give what the
    arithmetic analyzer gives (which is still used where a dim is an expression)."""
    from fold_guard.relax._translate import legalize as _kernels

    n = tvm.tirx.Var("n", "int64")
    plain = _kernels._plain_dims([relax.TensorType([n, 4], "int8")])
    assert plain == [(("var", n.__chandle__()), 4)]
    assert _kernels._plain_dims([relax.TensorType([n * 2], "int8")]) is None

    mod = qdq_chain([(16 + i, 17 + i) for i in range(6)])  # one symbolic kernel per op
    direct = fgr.fold(mod, kernel_cache=False)
    monkeypatch.setattr(_kernels, "_plain_dims", lambda types: None)
    analyzed = fgr.fold(mod, kernel_cache=False)
    tvm.ir.assert_structural_equal(direct.mod, analyzed.mod)
    assert direct.report.kernels_compiled == analyzed.report.kernels_compiled == 2
