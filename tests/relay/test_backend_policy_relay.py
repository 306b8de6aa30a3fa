"""fold_guard.relay.backend_policy and explain_offload: the Relay half.

    W ─ qnn.quantize ─┐                      table: npu.qdense = qnn.dense(*, const, const, ...)
    x ─────────────── qnn.dense              stock keeps the quantize (a QNN op): no match;
                                             backend_policy folds it for npu.qdense

Small modules here, compared structurally with stock ``FoldConstant`` (with and without
``fold_qnn``); TVM's own tables after ``FakeQuantizationToInteger`` on the QDQ CNN and its
per-tensor int8 variant (``examples/relay_offload_matrix.py``), full lane.
"""

from __future__ import annotations

import json
from typing import Any, Callable, List, Optional

import numpy as np
import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli
from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

import fold_guard
import fold_guard.relay as fgr
from fold_guard.cli._offload import OFFLOAD_SCHEMA_NAME

ZERO, HALF = relay.const(0), relay.const(0.5)


def qnn_module(layers: int = 2) -> tvm.IRModule:
    """``layers`` of ``qnn.dense(h, qnn.quantize(<fp32 W>))`` requantized to int8."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 8), dtype="int8")
    h = x
    for _ in range(layers):
        w = relay.qnn.op.quantize(
            relay.const(rng.standard_normal((8, 8)).astype("float32")), HALF, ZERO, out_dtype="int8"
        )
        acc = relay.qnn.op.dense(h, w, ZERO, ZERO, HALF, HALF, units=8)
        h = relay.qnn.op.requantize(acc, relay.const(0.25), ZERO, HALF, ZERO, out_dtype="int8")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], h)))


def qdense(check: Optional[Callable[[Any], bool]] = None) -> List[tuple]:
    pattern = is_op("qnn.dense")(wildcard(), *[is_constant() for _ in range(5)])
    return [("npu.qdense", pattern) + ((check,) if check is not None else ())]


def refuse(expr: Any) -> bool:
    return False


def test_the_table_folds_the_quantize_its_constant_weight_needs() -> None:
    mod = qnn_module()
    result = fgr.fold(mod, policy=fgr.backend_policy(qdense()))
    tvm.ir.assert_structural_equal(
        result.mod, relay.transform.FoldConstant(fold_qnn=True)(mod), map_free_vars=True
    )
    rules = {d.rule for d in result.plan.decisions if d.op == "qnn.quantize"}
    assert rules == {"fold-for:npu.qdense"}


def test_a_refused_match_leaves_the_fold_to_relays_default() -> None:
    mod = qnn_module()
    folded = fgr.fold(mod, policy=fgr.backend_policy(qdense(refuse))).mod
    tvm.ir.assert_structural_equal(folded, relay.transform.FoldConstant()(mod), map_free_vars=True)


def test_a_dequantize_no_pattern_takes_folds_although_relay_keeps_qnn_calls() -> None:
    """No run-time dequantize of a constant outside a composite: stock keeps this one."""
    x = relay.var("x", shape=(1, 8), dtype="float32")
    w = relay.qnn.op.dequantize(relay.const(np.ones((8, 8), "int8")), HALF, ZERO)
    mod = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w)))
    )
    plan = fgr.plan(mod, fgr.backend_policy(qdense()))
    assert [(d.op, d.action.value, d.rule) for d in plan.decisions] == [
        ("qnn.dequantize", "fold", "fold-dequantize-no-pattern-takes"),
        ("nn.dense", "keep", ""),
    ]
    assert fgr.plan(mod, "default").decisions[0].action.value == "keep"


def test_rows_say_which_composite_took_each_call_or_why_none_did() -> None:
    mod = qnn_module()
    stock = fgr.explain_offload(mod, qdense(), policy="default")
    assert [(r.op, r.composite, r.reason.kind) for r in stock.rows] == [
        ("qnn.dense", None, "operand-not-constant")
    ] * 2
    assert "QNN ops are kept" in stock.rows[0].reason.detail  # the stock rule that kept it
    ours = fgr.explain_offload(mod, qdense(), policy=fgr.backend_policy(qdense()))
    assert ours.offloaded == 2 and isinstance(ours, fold_guard.OffloadReport)
    refused = fgr.explain_offload(mod, qdense(refuse), policy="fold-qnn")
    assert {r.reason.kind for r in refused.rows} == {"check-refused"}
    assert "its check refuse" in refused.rows[0].reason.detail


def test_a_partitioned_module_reads_as_offloaded() -> None:
    """After MergeComposite (composites in main), and after PartitionGraph (in external
    functions, which folding does not read)."""
    mod = qnn_module()
    folded = fgr.fold(mod, policy=fgr.backend_policy(qdense())).mod
    merged = relay.transform.MergeComposite(qdense())(folded)
    report = fgr.explain_offload(merged, qdense())
    assert report.policy is None and report.offloaded == len(report.rows) == 2
    external = relay.transform.PartitionGraph()(relay.transform.AnnotateTarget("npu")(merged))
    report = fgr.explain_offload(external, qdense())
    assert report.offloaded == len(report.rows) == 2
    assert {row.composite for row in report.rows} == {"npu.qdense"}


# TVM's own tables after FakeQuantizationToInteger (examples/relay_offload_matrix.py) -----------


@pytest.fixture(scope="module")
def modules():
    import relay_offload_matrix as matrix

    builders = matrix.models(1)
    return {name: matrix.prepare(builders[name]()) for name in ("qdq_cnn", "qdq_cnn_s8")}


@pytest.mark.slow
def test_the_command_on_cmsis_nn_counts_every_fold(tmp_path) -> None:
    """``fold-guard offload MODEL --ir relay --fq2i --backend cmsis-nn --json``: stock keeps the
    weights' qnn.quantize (no match), backend_policy folds them as fold-qnn does, no fold does
    better; every call has a reason."""
    path = tmp_path / "qdq_cnn_s8.onnx"
    onnx.save(
        om.make_qdq_cnn(0, float_weights=True, activation_type="int8", per_channel=False), str(path)
    )
    args = (
        "offload",
        str(path),
        "--ir",
        "relay",
        "--fq2i",
        "--backend",
        "cmsis-nn",
        "--json",
        "-q",
    )
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # the schema is checked in the Relax suite (jsonschema)
    assert (data["schema"], data["version"], data["model"]["ir"]) == (
        OFFLOAD_SCHEMA_NAME,
        1,
        "relay",
    )
    counts = data["counts"]
    best_other = max(n for flow, n in counts.items() if flow != "backend:cmsis-nn")
    assert counts["stock"] == 0 and counts["backend:cmsis-nn"] == best_other > 0, counts
    assert all(row["reason"] is None or row["reason"]["kind"] for row in data["report"]["rows"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "table, says",
    [("cmsis-nn", "uint8[1, 16, 16, 3]"), ("arm_compute_lib", "per-channel (8 scales")],
)
def test_onnxruntimes_default_qdq_reads_as_refused_by_the_check(modules, table, says) -> None:
    """uint8 activations (CMSIS-NN), per-channel weight scales (ACL): the structure matches
    once the weight folds, and the check refuses; the detail shows why."""
    report = fgr.explain_offload(modules["qdq_cnn"], table, policy=fgr.backend_policy(table))
    convs = [row for row in report.rows if row.op == "qnn.conv2d"]
    assert convs and all(row.reason.kind == "check-refused" for row in convs)
    assert says in convs[0].reason.detail
    assert "once the fold decisions it needs are made" in convs[0].reason.detail


@pytest.mark.slow
def test_ethos_n_checks_refuse_without_the_driver_stack_and_say_so(modules) -> None:
    report = fgr.explain_offload(
        modules["qdq_cnn_s8"], "ethos-n", policy=fgr.backend_policy("ethos-n")
    )
    assert report.offloaded == 0 and report.rows
    assert {row.reason.kind for row in report.rows} == {"check-refused"}
    assert "Ethos-N module is not available" in report.rows[0].reason.detail


@pytest.mark.slow
def test_dnnls_qnn_patterns_want_another_form_than_fq2i_gives(modules) -> None:
    report = fgr.explain_offload(modules["qdq_cnn_s8"], "dnnl", policy=fgr.backend_policy("dnnl"))
    assert report.rows and {row.reason.kind for row in report.rows} == {"no-pattern"}
    assert "dnnl.qnn.conv2d" in report.rows[0].reason.detail
