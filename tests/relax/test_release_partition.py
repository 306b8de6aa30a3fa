"""Releasing the barriers right before a backend's partitioner, and partitioning with nothing folding.

RFC.md, guarantee 3 (barriers hold up to a backend's partitioner) and guarantee 4 (the input is
never changed). ``release_barriers`` and ``partition`` are compared with Before / Expected
modules; ``absorb_weight_dequantize`` with the stock ``FuseOpsByPattern`` on the same module.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

import fold_guard
import fold_guard.relax as fgr

W = np.arange(-8, 8, dtype="int8").reshape(4, 4)
SCALE, ZERO = 0.5, 0


def _dense_module(weight: Callable[[relax.BlockBuilder, relax.Expr], relax.Expr]) -> tvm.IRModule:
    """``main(x) = matmul(x, dequantize(weight(<int8 W>)))``, ``weight`` choosing what W sits under."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = weight(bb, relax.const(W))
            dq = bb.emit(relax.op.dequantize(w, relax.const(SCALE), relax.const(ZERO, "int8")))
            y = bb.emit_output(relax.op.matmul(x, dq))
        bb.emit_func_output(y)
    return bb.get()


def _guarded(bb: relax.BlockBuilder, w: relax.Expr) -> relax.Expr:
    return bb.emit(fgr.fold_barrier(w))


def _plain(bb: relax.BlockBuilder, w: relax.Expr) -> relax.Expr:
    return w


QMATMUL = is_op("relax.matmul")(
    wildcard(), is_op("relax.dequantize")(is_const(), is_const(), is_const())
)


def _fuse(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.FuseOpsByPattern([("npu.qmatmul", QMATMUL)])(mod)


def _composite_weight(mod: tvm.IRModule) -> Optional[np.ndarray]:
    """The constant the composite's dequantize reads, or None."""
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and func.attrs and "Composite" in func.attrs:
            dq = func.body.blocks[0].bindings[0].value
            if isinstance(dq.args[0], tvm.ir.GenericConst):
                return dq.args[0].value.numpy()
    return None


# -------------------------------------------------------------------------------- release


def test_release_puts_the_constant_into_its_user():
    """
    lv = fold_barrier(<int8 W>); dq = dequantize(lv)  ==>  dq = dequantize(<int8 W>)
    """
    before = _dense_module(_guarded)
    saved = tvm.ir.save_json(before)
    tvm.ir.assert_structural_equal(fgr.release_barriers(before), _dense_module(_plain))
    tvm.ir.assert_structural_equal(fgr.ReleaseBarriers()(before), _dense_module(_plain))
    assert tvm.ir.save_json(before) == saved  # RFC.md, guarantee 4


def test_release_of_a_barrier_on_a_parameter_and_on_a_function_level_variable():
    """
    lv = fold_barrier(x); y = add(lv, x)     ==>  y = add(x, x)          (dataflow var: substituted)
    z = fold_barrier(x) (outside dataflow)   ==>  z = x                  (a binding stays)
    """

    def build(guard: bool) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((4,), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                lv = bb.emit(fgr.fold_barrier(x)) if guard else x
                y = bb.emit_output(relax.op.add(lv, x))
            z = bb.emit(fgr.fold_barrier(y) if guard else y)
            bb.emit_func_output(relax.op.multiply(z, z))
        return bb.get()

    tvm.ir.assert_structural_equal(fgr.release_barriers(build(True)), build(False))


def test_release_of_a_module_without_barriers_is_unchanged():
    before = _dense_module(_plain)
    tvm.ir.assert_structural_equal(fgr.release_barriers(before), before)


def test_release_refuses_what_is_not_a_relax_module():
    with pytest.raises(fold_guard.UnsupportedIRError, match=r"expects a tvm\.IRModule"):
        fgr.release_barriers(_dense_module(_plain)["main"])


# -------------------------------------------------------------------------------- partition


def _fold_then_fuse(mod: tvm.IRModule) -> tvm.IRModule:
    """A partition function that folds first, as CLML's ``OpenCLMLOffLoad`` does."""
    return _fuse(relax.transform.FoldConstant()(mod))


def test_partition_binds_the_int8_weight_and_skips_the_partitioners_fold():
    """
    dequantize(fold_barrier(<int8 W>)) -> matmul
      partition(FoldConstant, FuseOpsByPattern)  ==>  the composite binds <int8 W> itself
    (the same module as FuseOpsByPattern alone on the released module: nothing else changed)
    """
    annotated = _dense_module(_guarded)
    result = fgr.partition(annotated, _fold_then_fuse)
    assert (result.released, result.released_constants, result.skipped) == (1, 1, ("FoldConstant",))
    tvm.ir.assert_structural_equal(result.mod, _fuse(_dense_module(_plain)))
    np.testing.assert_array_equal(_composite_weight(result.mod), W)
    # without the release the table does not match; without the skip the weight is fp32
    assert _composite_weight(_fuse(annotated)) is None
    assert _composite_weight(_fold_then_fuse(fgr.release_barriers(annotated))) is None


def test_partition_catches_a_fold_in_a_pass_context_of_its_own():
    annotated = _dense_module(_guarded)
    saved = tvm.ir.save_json(annotated)

    def folds_in_own_context(mod: tvm.IRModule) -> tvm.IRModule:
        with tvm.transform.PassContext(opt_level=3):  # the skip does not reach in here
            return _fold_then_fuse(mod)

    with pytest.raises(
        fold_guard.PreconditionError, match=r"1 of 1 released constants .* int8\[4, 4\]"
    ):
        fgr.partition(annotated, folds_in_own_context)
    assert tvm.ir.save_json(annotated) == saved


def test_partition_keeps_the_callers_pass_context():
    """The partitioner runs with the caller's opt level, config and disabled passes."""
    seen = {}

    def record(mod: tvm.IRModule) -> tvm.IRModule:
        ctx = tvm.transform.PassContext.current()
        seen.update(opt_level=ctx.opt_level, disabled=list(ctx.disabled_pass))
        return mod

    with tvm.transform.PassContext(opt_level=2, disabled_pass=["FuseOps"]):
        fgr.partition(_dense_module(_guarded), record)
    assert seen == {"opt_level": 2, "disabled": ["FuseOps"]}


# ------------------------------------------------------------------ absorb_weight_dequantize


def test_absorbed_table_binds_the_dequantized_weight_into_the_composite():
    """
    table: matmul(*, *)                  composite: matmul(x, w)    w an fp32 run-time input
    absorbed: matmul(*, dq(c, c, c) | *) composite: dequantize(<int8 W>) -> matmul
    """
    table = [("npu.matmul", is_op("relax.matmul")(wildcard(), wildcard()))]
    mod = _dense_module(_plain)
    assert _composite_weight(relax.transform.FuseOpsByPattern(table)(mod)) is None
    absorbed = relax.transform.FuseOpsByPattern(fgr.absorb_weight_dequantize(table))(mod)
    tvm.ir.assert_structural_equal(
        absorbed, relax.transform.FuseOpsByPattern([("npu.matmul", QMATMUL)])(mod)
    )
    np.testing.assert_array_equal(_composite_weight(absorbed), W)


def test_absorbed_table_matches_anything_else_as_before():
    """A weight that is no dequantized constant (a parameter): the same partition as the table's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(y)
    mod = bb.get()
    weight = wildcard()
    root = is_op("relax.nn.relu")(is_op("relax.matmul")(wildcard(), weight))
    table = [("npu.matmul_relu", root, {"weight": weight, "root": root})]
    tvm.ir.assert_structural_equal(
        relax.transform.FuseOpsByPattern(fgr.absorb_weight_dequantize(table))(mod),
        relax.transform.FuseOpsByPattern(table)(mod),
    )


def test_absorbed_annotations_name_the_new_operand():
    """A check reading ``annotated_expr["weight"]`` sees the dequantize (fp32, as before)."""
    seen = []

    def check(context: relax.transform.PatternCheckContext) -> bool:
        seen.append(context.annotated_expr["weight"].op.name)
        return True

    weight = wildcard()
    root = is_op("relax.matmul")(wildcard(), weight)
    table = [("npu.matmul", root, {"weight": weight, "root": root}, check)]
    relax.transform.FuseOpsByPattern(fgr.absorb_weight_dequantize(table))(_dense_module(_plain))
    assert seen == ["relax.dequantize"]
