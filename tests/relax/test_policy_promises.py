"""Policies that do what their names promise, and reports that count what is there (issue 39).

dq = dequantize(<int8 W>, <per-channel scale>)    size-guard: kept (exactly 4x the weight)
emb = dequantize(<int8 E>); take(emb, ids)        keep-qdq-weights: folded (no weight)
wq = dequantize(<int8 W>); matmul(x, wq)          keep-qdq-weights: kept (a weight)
one constant read by two calls                    the report counts its bytes once
a weight read by take and by shape_of             the ledger has one row for it
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Action

RNG = np.random.default_rng(0)
W_INT8 = RNG.integers(-127, 128, (64, 64)).astype("int8")
E_INT8 = RNG.integers(-127, 128, (32, 64)).astype("int8")


def _dequantize(weight: np.ndarray) -> relax.Expr:
    rows = weight.shape[0]
    scale = relax.const(np.full(rows, 0.02, "float32"))
    return relax.op.dequantize(
        relax.const(weight), scale, relax.const(np.zeros(rows, "int8")), axis=0
    )


def _llm_like() -> tvm.IRModule:
    """``main(ids, x)``: an embedding lookup of an int8 table, and a linear layer's int8 weight;
    the table's shape also read by ``shape_of`` (as ONNX imports of Hugging Face models do)."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
    x = relax.Var("x", relax.TensorType((1, 64), "float32"))
    with bb.function("main", [ids, x]):
        with bb.dataflow():
            table = bb.emit(_dequantize(E_INT8))
            rows = bb.emit(relax.op.shape_of(table))
            embedded = bb.emit(relax.op.take(table, ids, axis=0))
            weight = bb.emit(_dequantize(W_INT8))
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(weight)))
            out = bb.emit_output(relax.Tuple([embedded, y, rows]))
        bb.emit_func_output(out)
    return bb.get()


def _decision(result, op, shape):
    (decision,) = [
        d
        for d in result.plan.decisions
        if d.op == op and result.plan.graph.nodes[d.node].outputs[0].shape == shape
    ]
    return decision


def test_size_guard_keeps_the_dequantize_of_an_int8_weight():
    result = fgr.fold(_llm_like(), policy="size-guard")
    for shape in ((64, 64), (32, 64)):
        decision = _decision(result, "relax.dequantize", shape)
        assert decision.action is Action.KEEP and decision.rule == "size-guard", decision
    assert result.report.constant_bytes_after == result.report.constant_bytes_before


@pytest.mark.parametrize("policy", ["keep-qdq-weights", "qdq-accelerator"])
def test_the_qdq_policies_keep_a_weights_dequantize_and_fold_an_embeddings(policy):
    result = fgr.fold(_llm_like(), policy=policy)
    weight = _decision(result, "relax.dequantize", (64, 64))
    assert weight.action is Action.KEEP and weight.rule == "keep-dequantize-of-integer-constant"
    table = _decision(result, "relax.dequantize", (32, 64))
    assert table.action is Action.FOLD and table.rule == "default", table
    # the folded module runs as the unfolded one
    ids = np.array([[0, 31, 5, 7]], "int64")
    x = RNG.standard_normal((1, 64)).astype("float32")
    outputs = []
    for mod in (_llm_like(), result.mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(ids), tvm.runtime.tensor(x))
        outputs.append([out[0].numpy(), out[1].numpy()])
    for before, after in zip(*outputs):
        assert before.tobytes() == after.tobytes()


def test_the_report_counts_each_constant_once():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256,), "float32"))
    table = relax.const(np.ones(256, "float32"))  # 1 KiB, read by two calls
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, table))
            b = bb.emit(relax.op.multiply(a, table))
            out = bb.emit_output(b)
        bb.emit_func_output(out)
    report = fgr.fold(bb.get()).report
    assert report.constant_bytes_before == report.constant_bytes_after == 1024


def test_the_ledger_has_one_row_per_weight():
    """The table is read by ``take`` and ``shape_of``: one weight, one row (its fold)."""
    for policy in ("keep-qdq-weights", "default"):
        rows = fgr.ledger(fgr.fold(_llm_like(), policy=policy, ledger=True).mod)
        tables = [row for row in rows if row.shape_before == (32, 64)]
        assert len(tables) == 1, [row.line() for row in rows]
        assert [row.key.count("#") for row in rows] == [0] * len(rows)
        weights = [row for row in rows if row.shape_before == (64, 64)]
        assert len(weights) == 1 and weights[0].dtype_before == "int8"


def test_a_kept_rows_dtypes_are_the_constant_under_the_barrier():
    """``annotate`` puts a barrier on the int8 weight; the row says int8 in and int8 shipped."""
    annotated = fgr.annotate(_llm_like(), policy="keep-qdq-weights", ledger=True).mod
    for mod in (annotated, fgr.fold(annotated, ledger=True).mod):
        (row,) = [row for row in fgr.ledger(mod) if row.shape_before == (64, 64)]
        assert (row.action, row.dtype_before, row.dtype_after) == ("kept", "int8", "int8"), row
