"""The precision ledger on Relay (TVM 0.16): ``fold`` / ``annotate(..., ledger=True)``, ``ledger(mod)``.

The same rows as on Relax (the core writes them; a weight is keyed by its constant's content), in
the ``fold_guard.ledger`` module attribute, which ``save_json`` / ``load_json`` and Relay's
passes up to codegen (``relay.optimize``, what ``relay.build`` runs first) keep.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli
from tvm import relay

import fold_guard.relay as fgr

TARGET = "llvm -mtriple=x86_64-linux-gnu"  # hhb's LLVM defaults to riscv64
W = np.linspace(-1.0, 1.0, 16, dtype="float32").reshape(4, 4)

#: The module attribute the ledger is written to, as ``fold(..., ledger=True)`` documents it.
LEDGER_ATTR = "fold_guard.ledger"


def _qdq_dense() -> tvm.IRModule:
    """dense(x, dequantize(quantize(W)))  with W an fp32 constant."""
    x = relay.var("x", shape=(1, 4), dtype="float32")
    w_q = relay.qnn.op.quantize(relay.const(W), relay.const(0.01), relay.const(0), out_dtype="int8")
    w_dq = relay.qnn.op.dequantize(w_q, relay.const(0.01), relay.const(0))
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w_dq)))


@pytest.fixture(scope="module")
def cnn() -> tvm.IRModule:
    return om.import_relay(om.make_qdq_cnn())


def _optimized(mod: tvm.IRModule) -> tvm.IRModule:
    """Saved, reloaded, and through ``relay.optimize`` (``relay.build``'s passes before codegen)."""
    reloaded = tvm.ir.load_json(tvm.ir.save_json(mod))
    with tvm.transform.PassContext(opt_level=3):
        optimized, _ = relay.optimize(reloaded, target=TARGET)
    return optimized


def test_a_weight_quantized_now_and_kept_behind_its_dequantize():
    """fp32 W -> quantize (folded) -> int8 under a kept dequantize: one row, fp32 -> int8."""
    rows = fgr.ledger(fgr.fold(_qdq_dense(), policy="keep-qdq-weights", ledger=True).mod)
    assert len(rows) == 1
    row = rows[0]
    assert row.key == fgr.constant_key(relay.const(W))
    assert (row.action, row.rule) == ("kept", "keep-dequantize-of-integer-constant")
    assert (row.dtype_before, row.shape_before, row.bytes_before) == ("float32", (4, 4), 64)
    assert (row.dtype_after, row.shape_after, row.bytes_after) == ("int8", (4, 4), 16)
    # fold-qnn folds the dequantize too: the same weight, back to fp32
    (folded,) = fgr.ledger(fgr.fold(_qdq_dense(), policy="fold-qnn", ledger=True).mod)
    assert (folded.key, folded.action, folded.dtype_after) == (row.key, "folded", "float32")


def test_no_ledger_unless_asked(cnn):
    stock = relay.transform.InferType()(relay.transform.FoldConstant()(cnn))
    plain = fgr.fold(cnn).mod
    assert plain.attrs is None or LEDGER_ATTR not in plain.attrs
    tvm.ir.assert_structural_equal(plain, stock)
    assert fgr.ledger(stock) == []


def test_every_row_survives_save_load_and_relay_optimize(cnn):
    mod = fgr.fold(cnn, policy="keep-qdq-weights", ledger=True).mod
    rows = fgr.ledger(mod)
    # the examples' QDQ CNN: 4 conv + 1 dense layers, a weight and a bias each
    assert len(rows) == 10
    assert {row.action for row in rows} == {"kept"}
    assert {row.rule for row in rows} == {"keep-dequantize-of-integer-constant"}
    assert sorted(row.dtype_after for row in rows) == ["int32"] * 5 + ["int8"] * 5
    assert fgr.ledger(_optimized(mod)) == rows


def test_annotate_writes_the_rows_of_the_plan_its_barriers_carry(cnn):
    annotated = fgr.annotate(cnn, policy="keep-qdq-weights", ledger=True).mod
    rows = fgr.ledger(annotated)
    assert rows == fgr.ledger(fgr.fold(cnn, policy="keep-qdq-weights", ledger=True).mod)
    # a stock fold with every QNN op folded keeps the attribute (and, behind the barriers, the weights)
    refolded = relay.transform.FoldConstant(fold_qnn=True)(annotated)
    assert fgr.ledger(refolded) == rows
    assert fgr.ledger(_optimized(annotated)) == rows
    assert LEDGER_ATTR not in (fgr.annotate(cnn, policy="keep-qdq-weights").mod.attrs or {})


@pytest.mark.slow
def test_the_command_writes_the_ledger_and_a_fresh_process_reads_it(tmp_path):
    """fold --ir relay --ledger -o saved.json, then ``inspect saved.json --ir relay`` as a real
    process: it loads the JSON before anything imported tvm.relay (whose node types load_json
    needs), and prints each weight with its ONNX node."""
    model = tmp_path / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(model))
    saved = tmp_path / "saved.json"
    args = ["--ir", "relay", "-p", "keep-qdq-weights", "-o", str(saved), "--ledger", "-q"]
    assert run_cli("fold", str(model), *args).returncode == 0
    shown = subprocess.run(
        [sys.executable, "-m", "fold_guard", "inspect", str(saved), "--ir", "relay"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    rows = lines[lines.index("ledger in the module: 10 weights") + 1 :]
    assert len(rows) == 10
    assert rows[0].startswith("  conv0.weight_DequantizeLinear (%")
    assert all("[keep-dequantize-of-integer-constant] sha256:" in row for row in rows)
