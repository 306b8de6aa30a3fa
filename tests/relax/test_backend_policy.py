"""fold_guard.relax.backend_policy and explain_offload: a backend's table decides, and explains.

    W ─ quantize ─ dequantize ─┐                     table: npu.qmatmul = matmul(*, dequantize(const, const, const))
    x ──────────────────────── matmul ─ relu         backend_policy: quantize folds, dequantize stays
                                                     (the composite binds the int8 weight)

Small modules built here, their folds compared structurally with what a built-in policy or the
stock pass gives; the decisions tried through TVM's own ``FuseOpsByPattern`` (a check that
refuses, or raises, turns a decision back); the report's rows and reasons; TVM's in-tree tables
on the QDQ CNN (``examples/offload_matrix.py``'s cells, full lane).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

import fold_guard
import fold_guard.relax as fgr
from fold_guard import PreconditionError, policy_registry_scope, register_policy

S, ZP = relax.const(0.5, "float32"), relax.const(0, "int8")


def qdq_module(layers: int = 1, *, int8_weights: bool = False) -> tvm.IRModule:
    """``layers`` of ``relu(matmul(x, dequantize(quantize(W))))`` (``int8_weights``: the weight
    an int8 constant already, no quantize)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                if int8_weights:
                    w = relax.const(rng.integers(-8, 8, (8, 8)).astype("int8"))
                else:
                    w = bb.emit(
                        relax.op.quantize(
                            relax.const(rng.standard_normal((8, 8)).astype("float32")), S, ZP
                        )
                    )
                dq = bb.emit(relax.op.dequantize(w, S, ZP))
                h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(h, dq))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def qmatmul(check: Optional[Callable[[Any], bool]] = None) -> List[tuple]:
    weight = is_op("relax.dequantize")(is_const(), is_const(), is_const())
    entry = ("npu.qmatmul", is_op("relax.matmul")(wildcard(), weight), {})
    return [entry + ((check,) if check is not None else ())]


def refuse(context: Any) -> bool:
    return False


# backend_policy ---------------------------------------------------------------------------------


def test_the_table_keeps_the_weight_dequantize_it_matches_and_folds_its_quantize() -> None:
    """The same module keep-qdq-weights gives, with each decision naming the pattern."""
    mod = qdq_module(2)
    policy = fgr.backend_policy(qmatmul())
    result = fgr.fold(mod, policy=policy)
    tvm.ir.assert_structural_equal(result.mod, fgr.fold(mod, policy="keep-qdq-weights").mod)
    rules = {d.op: d.rule for d in result.plan.decisions if d.rule not in ("default", "")}
    assert rules == {
        "relax.quantize": "fold-for:npu.qmatmul",
        "relax.dequantize": "keep-for:npu.qmatmul",
    }


def test_a_match_its_check_refuses_is_not_made_the_weight_folds_as_stock() -> None:
    mod = qdq_module(2)
    folded = fgr.fold(mod, policy=fgr.backend_policy(qmatmul(refuse))).mod
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(mod))


def test_a_check_that_raises_refuses_and_the_report_says_what_it_raised() -> None:
    def broken(context: Any) -> bool:
        raise RuntimeError("needs the vendor library")

    mod = qdq_module()
    tvm.ir.assert_structural_equal(
        fgr.fold(mod, policy=fgr.backend_policy(qmatmul(broken))).mod,
        relax.transform.FoldConstant()(mod),
    )
    (row,) = fgr.explain_offload(mod, qmatmul(broken), policy="keep-qdq-weights").rows
    assert row.reason.kind == "check-refused"
    assert "broken" in row.reason.detail and "needs the vendor library" in row.reason.detail


def test_the_policy_registers_composes_and_annotate_writes_it_into_the_ir() -> None:
    mod = qdq_module()
    table = qmatmul()
    with policy_registry_scope():
        register_policy(fgr.backend_policy(table, name="my-npu"))
        by_name = fgr.fold(mod, policy="my-npu").mod
        composed = fgr.fold(mod, policy=["my-npu", "size-guard"]).mod
    tvm.ir.assert_structural_equal(by_name, fgr.fold(mod, policy="keep-qdq-weights").mod)
    tvm.ir.assert_structural_equal(composed, by_name)
    annotated = fgr.annotate(mod, policy=fgr.backend_policy(table)).mod
    piped = relax.transform.FoldConstant()(annotated)  # a pipeline's stock fold keeps it
    partitioned = fgr.partition(
        piped, relax.transform.FuseOpsByPattern(table, annotate_codegen=False)
    )
    composites = [
        f
        for f in partitioned.mod.functions.values()
        if f.attrs is not None and "Composite" in f.attrs
    ]
    assert len(composites) == 1
    weights = [c for c in _constants(composites[0]) if tuple(c.value.shape) == (8, 8)]
    assert [str(w.value.dtype) for w in weights] == ["int8"]  # the int8 weight, bound in it


def _constants(func: relax.Function) -> List[relax.Expr]:
    found = []
    relax.analysis.post_order_visit(
        func, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None
    )
    return found


def test_the_input_module_is_not_changed_and_the_same_input_gives_the_same_output() -> None:
    """RFC.md, guarantee 4, for the policy's trials too (they fold tagged copies)."""
    mod = qdq_module(2)
    before = mod.script(show_meta=True)
    policy = fgr.backend_policy(qmatmul())
    first = fgr.fold(mod, policy=policy).mod
    second = fgr.fold(mod, policy=policy).mod
    assert mod.script(show_meta=True) == before
    tvm.ir.assert_structural_equal(first, second)
    assert fgr.explain_offload(mod, qmatmul(), policy=policy) == fgr.explain_offload(
        mod, qmatmul(), policy=policy
    )


def test_bad_tables_are_refused_by_name() -> None:
    with pytest.raises(PreconditionError, match="no Relax pattern table 'nope'"):
        fgr.backend_policy("nope")
    with pytest.raises(PreconditionError, match="entry 0 is str"):
        fgr.backend_policy(["npu.matmul"])
    with pytest.raises(PreconditionError, match="non-empty list"):
        fgr.backend_policy([])


# explain_offload --------------------------------------------------------------------------------


def test_rows_say_which_composite_took_each_call_or_why_none_did() -> None:
    mod = qdq_module(2, int8_weights=True)
    table = qmatmul()
    stock = fgr.explain_offload(mod, table, policy="default")
    assert [(r.op, r.composite, r.reason.kind) for r in stock.rows] == [
        ("relax.matmul", None, "folded-away"),
        ("relax.matmul", None, "folded-away"),
    ]
    detail = stock.rows[0].reason.detail
    assert "npu.qmatmul wants that call kept" in detail and "[default]" in detail
    ours = fgr.explain_offload(mod, table, policy=fgr.backend_policy(table))
    assert [(r.composite, r.reason) for r in ours.rows] == [("npu.qmatmul", None)] * 2
    refused = fgr.explain_offload(mod, qmatmul(refuse), policy="keep-qdq-weights")
    assert {r.reason.kind for r in refused.rows} == {"check-refused"}
    assert (
        "refuse" in refused.rows[0].reason.detail and "int8[8, 8]" in refused.rows[0].reason.detail
    )
    assert isinstance(ours, fold_guard.OffloadReport) and isinstance(ours, fgr.OffloadReport)


def test_a_partitioned_module_reads_as_offloaded() -> None:
    mod = qdq_module(2, int8_weights=True)
    table = qmatmul()
    partitioned = fgr.partition(
        fgr.annotate(mod, policy=fgr.backend_policy(table)).mod,
        relax.transform.FuseOpsByPattern(table, annotate_codegen=False),
    )
    report = fgr.explain_offload(partitioned, table)
    assert report.policy is None and report.offloaded == len(report.rows) == 2
    assert {row.composite for row in report.rows} == {"npu.qmatmul"}


# TVM's in-tree tables on the QDQ CNN (examples/offload_matrix.py) --------------------------------


@pytest.fixture(scope="module")
def qdq_cnn() -> tvm.IRModule:
    import offload_matrix

    return offload_matrix.models(1)["qdq_cnn"]()


@pytest.mark.slow
@pytest.mark.parametrize("table", ["example_npu", "nnapi", "cublas", "clml"])
def test_an_in_tree_table_offloads_the_most_and_explains_every_missed_call(qdq_cnn, table) -> None:
    import offload_matrix

    cell = offload_matrix.cell("qdq_cnn", qdq_cnn, table)
    assert cell.counts["backend"] >= cell.best_other and cell.ok, cell
    assert cell.counts["stock"] == cell.counts["default"]  # guarantee 1, through a partition


@pytest.mark.slow
def test_clml_reads_bias_not_constant_under_a_policy_that_keeps_it(qdq_cnn) -> None:
    import offload_matrix

    prepared = offload_matrix.clml_prepare(qdq_cnn)
    report = fgr.explain_offload(prepared, "clml", policy="qdq-accelerator")
    bias_adds = [r for r in report.missed if r.reason.kind == "operand-not-constant"]
    assert bias_adds and all(r.op == "relax.add" for r in bias_adds)
    assert all(
        "openclml.bias" in r.reason.detail
        and "keep-dequantize-of-integer-constant" in r.reason.detail
        for r in bias_adds
    )
    assert (
        fgr.explain_offload(prepared, "clml", policy=fgr.backend_policy("clml")).offloaded
        > report.offloaded
    )


@pytest.mark.slow
def test_cutlass_decode_matmul_keeps_the_decode_in_main_where_weights_are_lifted() -> None:
    import offload_matrix

    mod = offload_matrix.models(1)["cutlass_style"]()
    cell = offload_matrix.cell("cutlass_style", mod, "cutlass.decode_matmul")
    assert cell.counts["stock"] == 0 and cell.counts["backend"] == 1 and cell.ok, cell
