"""backend_policy's decisions and explain_offload's reasons, in the core (no TVM).

A table is written in the core's pattern description (``fold_guard._core.pattern_spec``), the
module as a FoldGraph (``graphdsl``). The adapters' part, trying the decisions with the real
table, is a trial function here: a plain Python callback saying which calls ended in which
composite, as ``Binding.trial`` does for an adapter.

    W ─ q=quantize ─ w=dequantize ─┐
    x ───────────────────────────── y=matmul         npu.qmatmul: matmul(*, dequantize(const, const))
                                                     ==> q folds [fold-for], w kept [keep-for]

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence, Tuple

import pytest
from graphdsl import G, summary
from hypothesis import HealthCheck, given, settings
from support.profiles import examples
from test_properties import cases

from fold_guard._core import Action, OffloadReason, OffloadReport, OffloadRow, plan_folds
from fold_guard._core.offload import (
    UNCLAIMED_DEQUANTIZE_RULE,
    Binding,
    TableRules,
    bind_tables,
    table_policy,
)
from fold_guard._core.offload_derive import derive, node_keys
from fold_guard._core.offload_explain import Runs, explain_rows, plan_world
from fold_guard._core.pattern_match import AsDecided, WhatIf, constant_sets, match_at
from fold_guard._core.pattern_spec import (
    AnyValue,
    ConstantValue,
    OneOf,
    OpCall,
    PatternSpec,
    TableSpec,
    anchor_ops,
)
from fold_guard._core.policy import FoldPolicy

C = ConstantValue()
ANY = AnyValue()
QMATMUL = PatternSpec(
    "npu.qmatmul", OpCall(("relax.matmul",), (ANY, OpCall(("relax.dequantize",), (C, C))))
)
CONST_MATMUL = PatternSpec("npu.matmul", OpCall(("relax.matmul",), (ANY, C)))
ANY_MATMUL = PatternSpec("npu.any_matmul", OpCall(("relax.matmul",), (ANY, ANY)))


def qdq_layer(g: G, x_label: str = "x", *, kind: str = "relax", label: str = "y"):
    """``y = matmul(x, dequantize(quantize(W), s))`` (Relay's ops keep QNN calls by default)."""
    q = g.call(
        f"{kind}.quantize",
        g.const("W", "float32", (4, 4)),
        g.const("s", "float32", ()),
        label=f"{label}_q",
        dtype="int8",
        default_fold=kind == "relax",
    )
    w = g.call(
        f"{kind}.dequantize",
        q,
        g.const("s", "float32", ()),
        label=f"{label}_w",
        dtype="float32",
        default_fold=kind == "relax",
    )
    return g.call(
        "relax.matmul" if kind == "relax" else "qnn.dense",
        g.runtime(x_label, "float32", (1, 4)),
        w,
        label=label,
    )


def claims(table: TableSpec, graph, excluded=None) -> Dict[str, str]:
    derived = derive(table, graph, {}, excluded or {})
    return {
        graph.nodes[node].label: f"{action.value} {pattern}"
        for node, (action, pattern) in sorted(derived.claims.items())
    }


# The description ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, anchors",
    [
        # CMSIS-NN: requantize(conv | bias_add(conv)) is about the convolution
        (
            OpCall(
                ("qnn.requantize",),
                (
                    OneOf(
                        (
                            OpCall(("qnn.conv2d",), (ANY, C)),
                            OpCall(("nn.bias_add",), (OpCall(("qnn.conv2d",), (ANY, C)), C)),
                        )
                    ),
                ),
            ),
            {"qnn.conv2d"},
        ),
        # a QDQ pattern: the activation's dequantize is not the layer
        (
            OpCall(("relax.nn.conv2d",), (OpCall(("relax.dequantize",), (ANY, C, C)), ANY)),
            {"relax.nn.conv2d"},
        ),
        # quantize(softmax(dequantize(x))): the softmax
        (
            OpCall(
                ("qnn.quantize",),
                (OpCall(("nn.softmax",), (OpCall(("qnn.dequantize",), (ANY,)),)),),
            ),
            {"nn.softmax"},
        ),
        # DNNL: cast(qnn.conv2d(...)) is about the convolution, not the cast
        (OpCall(("cast",), (OpCall(("qnn.conv2d",), (ANY, C)),)), {"qnn.conv2d"}),
        # a pattern of one op is about that op, a wrapper included
        (OpCall(("relax.dequantize",), (ANY,)), {"relax.dequantize"}),
    ],
)
def test_a_pattern_is_built_around_its_deepest_compute_op(pattern, anchors) -> None:
    assert anchor_ops(pattern) == anchors


def test_only_patterns_a_decision_can_matter_to_get_rules() -> None:
    rules = [rule.name for rule in table_policy(TableSpec("npu", (ANY_MATMUL, QMATMUL))).rules]
    assert rules == ["keep-for:npu.qmatmul", "fold-for:npu.qmatmul", UNCLAIMED_DEQUANTIZE_RULE]


# Deriving decisions ---------------------------------------------------------------------------


def test_a_call_on_constants_the_pattern_matches_stays_and_what_it_reads_as_constant_folds() -> (
    None
):
    g = G()
    qdq_layer(g)
    table = TableSpec("npu", (QMATMUL,))
    assert claims(table, g.build()) == {"y_q": "fold npu.qmatmul", "y_w": "keep npu.qmatmul"}
    assert summary(plan_folds(g.build(), table_policy(table))) == {
        "y_q": "FOLDED fold-for:npu.qmatmul",
        "y_w": "KEPT_BY_POLICY keep-for:npu.qmatmul",
        "y": "NOT_CONSTANT",
    }


def test_a_constant_operand_folds_with_everything_it_is_computed_from() -> None:
    """Relay keeps QNN calls by default; a pattern wanting the weight constant folds the chain."""
    g = G()
    qdq_layer(g, kind="qnn")
    table = TableSpec("npu", (PatternSpec("npu.dense", OpCall(("qnn.dense",), (ANY, C))),))
    plan = plan_folds(g.build(), table_policy(table))
    assert summary(plan) == {
        "y_q": "FOLDED fold-for:npu.dense",
        "y_w": "FOLDED fold-for:npu.dense",
        "y": "NOT_CONSTANT",
    }


def test_a_wildcard_asks_nothing_and_a_dequantize_no_pattern_takes_folds() -> None:
    g = G()
    qdq_layer(g, kind="qnn")
    table = TableSpec("npu", (PatternSpec("npu.dense", OpCall(("qnn.dense",), (ANY, ANY))),))
    assert claims(table, g.build()) == {}
    plan = plan_folds(g.build(), table_policy(table))
    # Relay's default keeps both QNN calls; the dequantize of a constant folds all the same, so
    # the layer gets a constant weight instead of a run-time dequantize
    assert summary(plan) == {
        "y_q": "FOLDED fold-dequantize-no-pattern-takes",
        "y_w": "FOLDED fold-dequantize-no-pattern-takes",
        "y": "NOT_CONSTANT",
    }


def test_the_earlier_pattern_wins_a_call_two_patterns_want_decided_otherwise() -> None:
    """One pattern wants the weight's dequantize kept, another wants it constant: the first in
    the table decides, the other does not match; in the other order, the other way round."""
    g = G()
    qdq_layer(g)
    graph = g.build()
    keep_first = derive(TableSpec("npu", (QMATMUL, CONST_MATMUL)), graph, {})
    assert [c.pattern for c in keep_first.candidates] == ["npu.qmatmul"]
    fold_first = derive(TableSpec("npu", (CONST_MATMUL, QMATMUL)), graph, {})
    assert [c.pattern for c in fold_first.candidates] == ["npu.matmul"]
    assert claims(TableSpec("npu", (CONST_MATMUL, QMATMUL)), graph) == {
        "y_q": "fold npu.matmul",
        "y_w": "fold npu.matmul",
    }


def test_a_weight_two_layers_share_is_not_kept_inside_one_composite() -> None:
    """Kept inside the first layer's composite, the second would read a value that composite
    does not give out: the weight folds, and both layers match the pattern wanting it constant."""
    g = G()
    q = g.call(
        "relax.quantize", g.const("W", "float32", (4, 4)), g.const("s"), label="q", dtype="int8"
    )
    w = g.call("relax.dequantize", q, g.const("s"), label="w")
    g.call("relax.matmul", g.runtime("x"), w, label="y1")
    g.call("relax.matmul", g.runtime("z"), w, label="y2")
    graph = g.build()
    derived = derive(TableSpec("npu", (QMATMUL, CONST_MATMUL)), graph, {})
    assert [(c.pattern, graph.nodes[c.root].label) for c in derived.candidates] == [
        ("npu.matmul", "y1"),
        ("npu.matmul", "y2"),
    ]
    assert any("read outside the match too" in miss.detail for miss in derived.misses)


def test_a_match_the_trial_refused_loses_its_decisions() -> None:
    g = G()
    qdq_layer(g)
    graph = g.build()
    table = TableSpec("npu", (QMATMUL,))
    root = next(n for n in graph.nodes if n.label == "y")
    excluded = {("npu.qmatmul", node_keys(graph)[root.id]): "its check refused"}
    assert claims(table, graph, excluded) == {}


def test_a_call_computed_from_weight_parameters_is_kept_for_a_pattern_on_the_parameter_path() -> (
    None
):
    """CUTLASS's decode_matmul: the decode of a lifted encode stays in main."""
    g = G()
    encoded = g.kernel("encode", g.param("w", "float16", (4, 4)), label="encoded")
    decoded = g.kernel(
        "decode", g.item(encoded, "packed", "int8"), g.item(encoded, "scale"), label="decoded"
    )
    g.call("relax.matmul", g.runtime("x", "float16", (1, 4)), decoded, label="y")
    decode_matmul = PatternSpec(
        "cutlass.decode_matmul", OpCall(("relax.matmul",), (ANY, OpCall(("relax.call_tir",))))
    )
    table = TableSpec("cutlass", (decode_matmul,))
    assert claims(table, g.build()) == {"decoded": "keep cutlass.decode_matmul"}
    plan = plan_folds(g.build(), table_policy(table))
    assert summary(plan)["decoded"] == "KEPT_BY_POLICY keep-for:cutlass.decode_matmul"
    assert summary(plan)["encoded"] == "LIFTED default"


def test_a_match_of_constants_only_is_no_layer() -> None:
    """A pattern rooted on dequantize would take a weight's dequantize by itself: that is work
    a fold does once, so no match is made of it and it folds."""
    g = G()
    qdq_layer(g)
    table = TableSpec("npu", (PatternSpec("npu.dq", OpCall(("relax.dequantize",), (ANY, ANY))),))
    assert derive(table, g.build(), {}).candidates == ()


# Settling on a module: the trial --------------------------------------------------------------


def settled(
    policy: FoldPolicy, graph, refuse: Sequence[str]
) -> Tuple[FoldPolicy, List[Mapping[int, str]]]:
    """``policy`` bound with a trial that takes every matched root but those labelled ``refuse``."""
    tried: List[Mapping[int, str]] = []

    def trial(bound: FoldPolicy, tables: Sequence[TableRules]) -> Sequence[Mapping[int, str]]:
        plan = plan_folds(graph, bound)
        taken = {}
        for table in tables:
            for node in graph.nodes:
                claim = table.claims_for(graph).get(node.id)
                if node.op == "relax.matmul" and graph.nodes[node.id].label not in refuse:
                    taken[node.id] = "npu"
                if claim and claim[0] is Action.KEEP and not plan.folds(node.id):
                    taken[node.id] = "npu"
        tried.append(taken)
        return [taken for _ in tables]

    def binder(context: object) -> Binding:
        return Binding(graph, {}, trial)

    holder = TableRules(TableSpec("npu", (QMATMUL,)), binder)
    rules = tuple(
        dataclasses.replace(r, matches=dataclasses.replace(r.matches, table=holder))
        for r in policy.rules
    )
    return bind_tables(FoldPolicy(policy.name, policy.description, rules), graph), tried


def test_settling_keeps_the_confirmed_match_and_drops_the_refused_one() -> None:
    g = G()
    qdq_layer(g, "x", label="ok")
    qdq_layer(g, "z", label="refused")
    graph = g.build()
    policy, tried = settled(table_policy(TableSpec("npu", (QMATMUL,))), graph, refuse=["refused"])
    assert summary(plan_folds(graph, policy)) == {
        "ok_q": "FOLDED fold-for:npu.qmatmul",
        "ok_w": "KEPT_BY_POLICY keep-for:npu.qmatmul",
        "ok": "NOT_CONSTANT",
        # the refused layer's weight folds: no run-time dequantize for it
        "refused_q": "FOLDED fold-dequantize-no-pattern-takes",
        "refused_w": "FOLDED fold-dequantize-no-pattern-takes",
        "refused": "NOT_CONSTANT",
    }
    assert len(tried) == 2  # one round refused a match, the next confirmed the rest


def test_settled_decisions_are_data_the_same_on_every_walk() -> None:
    g = G()
    qdq_layer(g, "x", label="a")
    graph = g.build()
    first, _ = settled(table_policy(TableSpec("npu", (QMATMUL,))), graph, refuse=[])
    again = G()
    qdq_layer(again, "x", label="a")
    # a second walk of the same module (a new graph, the same labels) gets the same decisions
    assert summary(plan_folds(again.build(), first)) == summary(plan_folds(graph, first))


# Explaining -----------------------------------------------------------------------------------


def explain(table: TableSpec, graph, policy, as_is: Runs, what_if: Runs):
    world = plan_world(graph, plan_folds(graph, policy).decisions)
    return {
        row.label: (row.composite, row.reason.kind if row.reason else None)
        for row in explain_rows(table, graph, {}, world, as_is, what_if, lambda p: "its check")
    }


def test_a_constant_operand_a_rule_kept_reads_as_operand_not_constant() -> None:
    g = G()
    qdq_layer(g, kind="relax")
    graph = g.build()
    table = TableSpec("npu", (CONST_MATMUL,))
    keep_dq = table_policy(TableSpec("npu", (QMATMUL,)))  # a policy that keeps the dequantize
    root = next(n.id for n in graph.nodes if n.label == "y")
    rows = explain(
        table, graph, keep_dq, Runs({}, {}), Runs({root: "npu.matmul"}, {root: "npu.matmul"})
    )
    assert rows == {"y": (None, "operand-not-constant")}


def test_a_structure_the_check_refuses_reads_as_check_refused() -> None:
    g = G()
    qdq_layer(g)
    graph = g.build()
    table = TableSpec("npu", (CONST_MATMUL,))
    root = next(n.id for n in graph.nodes if n.label == "y")
    taken = Runs({}, {root: "npu.matmul"})  # matched without checks, not with them
    assert explain(table, graph, table_policy(table), taken, taken) == {
        "y": (None, "check-refused")
    }


def test_a_structure_no_pattern_has_reads_as_no_pattern() -> None:
    g = G()
    g.call("relax.matmul", g.runtime("x"), g.runtime("w"), label="y")
    table = TableSpec("npu", (CONST_MATMUL,))
    rows = explain(table, g.build(), table_policy(table), Runs({}, {}), Runs({}, {}))
    # a run-time operand where the pattern wants a constant: no fold makes it one
    assert rows == {"y": (None, "operand-not-constant")}
    g2 = G()
    g2.call("relax.matmul", g2.runtime("x"), g2.runtime("w"), label="y", attrs={"k": 1})
    other = TableSpec(
        "npu",
        (
            PatternSpec(
                "npu.relu", OpCall(("relax.nn.relu",), (OpCall(("relax.matmul",), (ANY, ANY)),))
            ),
        ),
    )
    assert explain(other, g2.build(), table_policy(other), Runs({}, {}), Runs({}, {})) == {
        "y": (None, "no-pattern")
    }


def test_the_furthest_miss_names_the_operand_and_whether_a_fold_fixes_it() -> None:
    g = G()
    qdq_layer(g)
    graph = g.build()
    root = next(n.id for n in graph.nodes if n.label == "y")
    hit, miss = match_at("npu.matmul", CONST_MATMUL.root, root, AsDecided(graph), {})
    assert hit is None and miss.fixable and miss.kind == "operand-not-constant"
    assert "operand 1 of y = relax.matmul is y_w = relax.dequantize" in miss.detail
    hit, _ = match_at("npu.matmul", CONST_MATMUL.root, root, WhatIf(graph, {}, {}), {})
    assert {graph.nodes[n].label: a.value for n, a in hit.claims.items()} == {
        "y_q": "fold",
        "y_w": "fold",
    }


def test_the_report_groups_by_reason_and_names_rows_after_layers() -> None:
    rows = (
        OffloadRow("lv1", "relax.matmul", "npu.matmul", None, "main", "lv1"),
        OffloadRow(
            "lv2",
            "relax.matmul",
            None,
            OffloadReason("check-refused", "refused: uint8"),
            "main",
            "lv2",
        ),
    )
    report = OffloadReport("npu", "backend:npu", rows).named({("main", "lv2"): "fc"})
    assert report.offloaded == 1 and report.counts()["check-refused"] == 1
    assert report.explain().splitlines() == [
        "npu under policy 'backend:npu': 1 of 2 calls offloaded",
        "  offloaded (1): npu.matmul 1",
        "  check-refused (1):",
        "    fc (relax.matmul): refused: uint8",
    ]
    assert report.to_dict()["rows"][1]["reason"] == {
        "kind": "check-refused",
        "detail": "refused: uint8",
        "pattern": None,
    }


# Properties -----------------------------------------------------------------------------------


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(policy=False, parameters=True))
def test_derived_decisions_are_deterministic_and_possible(case) -> None:
    """On random graphs: the same decisions every time; a fold only of what computes from
    constants alone, a keep only of what is known before run time; no root reads no run-time
    data; the plan applies every decision it is asked for where no barrier or failure stands."""
    table = TableSpec(
        "npu",
        (
            PatternSpec("npu.add_const", OpCall(("relax.add",), (ANY, C))),
            PatternSpec(
                "npu.mul_neg",
                OpCall(("relax.multiply",), (ANY, OpCall(("relax.negative",), (ANY,)))),
            ),
        ),
    )
    first = derive(table, case.graph, {})
    assert derive(table, case.graph, {}) == first
    constant, before_run_time = constant_sets(case.graph)
    for node, (action, _) in first.claims.items():
        assert node in (constant if action is Action.FOLD else before_run_time)
    plan = plan_folds(case.graph, table_policy(table))
    for node, (action, pattern) in first.claims.items():
        decision = plan.decisions[node]
        if decision.rule.endswith(pattern):
            assert decision.action in (
                (Action.FOLD, Action.LIFT) if action is Action.FOLD else (Action.KEEP,)
            )
