"""The precision ledger (``fold(..., ledger=True)``, ``annotate(..., ledger=True)``, ``ledger(mod)``).

One row per weight, keyed by content; it survives ``save_json`` / ``load_json`` and TVM's
``zero`` / ``default`` pipelines; without ``ledger=True`` nothing is written (guarantee 1: the
output stays structurally equal to stock's).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _common import onnx_models as om
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr

W = np.arange(-8, 8, dtype="int8").reshape(4, 4)
H = np.linspace(-1, 1, 16, dtype="float16").reshape(4, 4)

#: The module attribute the ledger is written to, as ``fold(..., ledger=True)`` documents it.
LEDGER_ATTR = "fold_guard.ledger"


@I.ir_module
class Mixed:
    """An int8 weight behind a dequantize, an fp16 weight behind a cast, an fp32 exp."""

    @R.function
    def main(x: R.Tensor((1, 4), "float32")):
        with R.dataflow():
            dq = R.dequantize(R.const(W), R.const(0.5), R.const(0, "int8"), out_dtype="float32")
            h = R.astype(R.const(H), "float32")
            e = R.exp(R.const(np.ones((4,), "float32")))
            y = R.add(R.matmul(R.matmul(x, dq), h), e)
            R.output(y)
        return y


@pytest.fixture(scope="module")
def cnn() -> tvm.IRModule:
    return from_onnx(om.make_qdq_cnn(), keep_params_in_input=False)


def _rows(mod: tvm.IRModule):
    return {row.key: row for row in fgr.ledger(mod)}


def _through_pipeline(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    reloaded = tvm.ir.load_json(tvm.ir.save_json(mod))
    with tvm.target.Target("llvm"):
        return relax.get_pipeline(name)(reloaded)


def test_rows_of_a_small_module_say_what_each_weight_became():
    rows = _rows(fgr.fold(Mixed, policy="keep-qdq-weights", ledger=True).mod)
    w, h = rows[fgr.constant_key(R.const(W))], rows[fgr.constant_key(R.const(H))]
    assert (w.action, w.rule, w.dtype_before, w.dtype_after) == (
        "kept",
        "keep-dequantize-of-integer-constant",
        "int8",
        "int8",
    )
    assert (w.shape_before, w.bytes_before, w.consumer) == ((4, 4), 16, "lv3 = relax.matmul")
    assert (h.action, h.dtype_before, h.dtype_after, h.bytes_after) == (
        "kept",
        "float16",
        "float16",
        32,
    )
    assert h.rule == "keep-low-precision-weight-cast"
    e = rows[fgr.constant_key(R.const(np.ones((4,), "float32")))]
    assert (e.action, e.rule, e.dtype_after, e.bytes_after) == ("folded", "default", "float32", 16)
    assert len(rows) == 3


def test_default_folds_back_to_fp32_and_says_so():
    rows = _rows(fgr.fold(Mixed, ledger=True).mod)
    w = rows[fgr.constant_key(R.const(W))]
    assert (w.action, w.rule, w.dtype_before, w.dtype_after, w.bytes_after) == (
        "folded",
        "default",
        "int8",
        "float32",
        64,
    )


def test_no_ledger_unless_asked_so_default_output_equals_stock(cnn):
    """Guarantee 1 holds as before; with ``ledger=True`` it holds modulo the one attribute."""
    stock = relax.transform.FoldConstant()(cnn)
    plain = fgr.fold(cnn).mod
    assert plain.attrs is None or LEDGER_ATTR not in plain.attrs
    tvm.ir.assert_structural_equal(plain, stock)
    with_ledger = fgr.fold(cnn, ledger=True).mod
    assert LEDGER_ATTR in with_ledger.attrs
    with pytest.raises(ValueError):
        tvm.ir.assert_structural_equal(with_ledger, stock)
    tvm.ir.assert_structural_equal(with_ledger.without_attr(LEDGER_ATTR), stock)
    assert fgr.ledger(stock) == []


@pytest.mark.parametrize("pipeline", ["zero", "default"])
def test_every_row_survives_save_load_and_the_pipeline(cnn, pipeline):
    mod = fgr.fold(cnn, policy="keep-qdq-weights", ledger=True).mod
    before = fgr.ledger(mod)
    # the examples' QDQ CNN: 4 conv + 1 fc layers, a weight and a bias each
    assert len(before) == 10
    assert {row.action for row in before} == {"kept"}
    assert {row.rule for row in before} == {"keep-dequantize-of-integer-constant"}
    assert sorted(row.dtype_after for row in before) == ["int32"] * 5 + ["int8"] * 5
    after = _through_pipeline(mod, pipeline)
    assert fgr.ledger(after) == before


def test_keys_are_the_constants_still_in_the_module(cnn):
    """A kept weight's key is the content of a constant the folded module still holds."""
    mod = fgr.fold(cnn, policy="keep-qdq-weights", ledger=True).mod
    present = set()

    @relax.expr_functor.visitor
    class Constants(relax.PyExprVisitor):
        def visit_generic_const_(self, const):
            present.add(fgr.constant_key(const))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            Constants().visit_expr(func)
    assert {row.key for row in fgr.ledger(mod)} <= present


def test_annotate_writes_the_plan_a_stock_fold_then_follows(cnn):
    annotated = fgr.annotate(cnn, policy="keep-qdq-weights", ledger=True).mod
    rows = fgr.ledger(annotated)
    assert rows == fgr.ledger(fgr.fold(cnn, policy="keep-qdq-weights", ledger=True).mod)
    # the stock pass keeps the attribute and the weights the rows describe
    folded = relax.transform.FoldConstant()(annotated)
    assert fgr.ledger(folded) == rows
    assert fgr.annotate(cnn, policy="keep-qdq-weights").mod.attrs is None or (
        LEDGER_ATTR not in fgr.annotate(cnn, policy="keep-qdq-weights").mod.attrs
    )


def test_parameter_path_rows_are_keyed_by_parameter_and_survive_lifting():
    mod, _ = relax.frontend.detach_params(from_onnx(om.make_qdq_cnn(), keep_params_in_input=True))
    annotated = fgr.annotate(mod, policy="keep-qdq-weights", ledger=True).mod
    rows = fgr.ledger(annotated)
    assert len(rows) == 10
    assert all(row.key.startswith("param:") for row in rows)
    assert {row.action for row in rows} == {"kept"}
    lifted = relax.transform.LiftTransformParams()(annotated)
    assert fgr.ledger(_through_pipeline(lifted, "zero")) == rows
    default_rows = fgr.ledger(fgr.annotate(mod, policy="default", ledger=True).mod)
    assert {row.action for row in default_rows} == {"lifted"}


def test_a_second_run_adds_its_rows_over_the_first(cnn):
    first = fgr.annotate(cnn, policy="keep-qdq-weights", ledger=True).mod
    # folding the annotated module under default keeps the barriers: same rows, kept by barrier
    second = fgr.fold(first, ledger=True).mod
    rows = fgr.ledger(second)
    assert len(rows) == 10
    assert {row.action for row in rows} == {"kept"}


def test_a_float_weight_parameter_quantized_ahead_of_run_time_ships_as_int8():
    """main(x, w: fp32 param): dequantize(quantize(w)) -> conv2d, under keep-qdq-weights.

    LiftTransformParams computes quantize(w) ahead of run time and main keeps the dequantize:
    the row says fp32 -> int8, kept, by the dequantize rule; under default all of it is lifted.
    """
    model = om.make_qdq_cnn(float_weights=True)
    mod, _ = relax.frontend.detach_params(from_onnx(model, keep_params_in_input=True))
    rows = {
        row.key: row
        for row in fgr.ledger(fgr.annotate(mod, policy="keep-qdq-weights", ledger=True).mod)
    }
    weight = rows["param:conv0.weight"]
    assert (weight.action, weight.rule) == ("kept", "keep-dequantize-of-integer-constant")
    assert (weight.dtype_before, weight.shape_before) == ("float32", (8, 3, 3, 3))
    assert (weight.dtype_after, weight.shape_after, weight.bytes_after) == (
        "int8",
        (8, 3, 3, 3),
        216,
    )
    assert sorted(row.dtype_after for row in rows.values()) == ["int32"] * 5 + ["int8"] * 5
    lifted = fgr.ledger(fgr.annotate(mod, policy="default", ledger=True).mod)
    assert {(row.action, row.rule) for row in lifted} == {("lifted", "default")}
    assert {row.key for row in lifted} == set(rows)
    # what the lifted transform computes for that weight is fp32 again
    assert {row.key: row.dtype_after for row in lifted}["param:conv0.weight"] == "float32"
