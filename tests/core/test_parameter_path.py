"""The parameter path: weights passed as function parameters are lifted, not folded (RFC.md,
guarantee 3, "through parameter lifting").

A weight parameter ``w`` (Relax: a parameter at or after ``num_input``) is known before run time,
but not to the fold: a call that computes from it is *lifted* ahead of run time by the IR's
parameter lifting (``LiftTransformParams``), under the same precedence as a fold.

    w ─ q=quantize ─ dq=dequantize ─ y=matmul          keep-qdq-weights:
                                     x ┘        ==>    q lifted, dq kept (policy), y not constant

    annotate: dq(fold_barrier(stop_lift_params(q))): the lifting keeps the stop, the barrier and
    dq at run time and hands the run-time function q's int8 result.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Dict, FrozenSet, Tuple

from graphdsl import LIFT_STOP_OP, G, Ref, apply_placements, decision, summary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples
from test_properties import Case, cases

from fold_guard._core import (
    DEFAULT_POLICY,
    Action,
    Annotation,
    FoldGraph,
    InputKind,
    NodeInput,
    TensorInfo,
    plan_folds,
)
from fold_guard._core.annotate import Annotated, placements
from fold_guard._core.builtin_policies import (
    KEEP_QDQ_WEIGHTS_POLICY,
    WEIGHTS_ONLY_POLICY,
    size_guard,
)
from fold_guard._core.summary import summarize

SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
I8, F32 = ("int8", (8, 4)), ("float32", (8, 4))


def qdq_graph(weight_kind: str = "param") -> FoldGraph:
    g = G()
    w = g.param("w", *F32) if weight_kind == "param" else g.const("w", *F32)
    scale = g.const("scale", "float32", ())
    q = g.call("relax.quantize", w, scale, label="q", dtype="int8")
    dq = g.call("relax.dequantize", q, scale, label="dq", dtype="float32")
    g.call("relax.matmul", g.runtime("x", *F32), dq, label="y")
    return g.build()


# Decisions ------------------------------------------------------------------------------------


def test_a_policy_decides_the_parameter_path_as_it_decides_constants():
    assert summary(plan_folds(qdq_graph("param"), KEEP_QDQ_WEIGHTS_POLICY)) == {
        "q": "LIFTED fold-quantize-of-constant",
        "dq": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }
    assert summary(plan_folds(qdq_graph("const"), KEEP_QDQ_WEIGHTS_POLICY)) == {
        "q": "FOLDED fold-quantize-of-constant",
        "dq": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }


def test_default_lifts_everything_computed_from_weights_and_constants():
    plan = plan_folds(qdq_graph("param"), DEFAULT_POLICY)
    assert [d.action for d in plan.decisions] == [Action.LIFT, Action.LIFT, Action.KEEP]
    assert [d.label for d in plan.lifted] == ["q", "dq"]
    assert not plan.folded


def _encode_decode(weight_kind: str) -> FoldGraph:
    """TVM's CUTLASS-style flow: one encode kernel of two results, read through tuple items.

    w ─ e=encode ─┬─ e[0] (int8) ─ d=decode ─ y=matmul
                  └─ e[1] (scale) ┘       x ┘
    """
    g = G()
    w = g.param("w", *F32) if weight_kind == "param" else g.const("w", *F32)
    enc = g.call(
        "relax.call_tir",
        w,
        label="e",
        outputs=(TensorInfo.of(*I8), TensorInfo.of("float16", (4,))),
        callee="encode",
    )
    packed, scale = g.item(enc, "q", *I8), g.item(enc, "s", "float16", (4,))
    dec = g.call("relax.call_tir", packed, scale, label="d", dtype="float16", callee="decode")
    g.call("relax.matmul", g.runtime("x", "float16", (8, 4)), dec, label="y")
    return g.build()


def test_tuple_items_of_a_lifted_call_are_known_before_run_time():
    """The decode reads the encode's results through tuple items: lifted with the encode by
    default, kept by the QDQ policy (and its barrier then needs the lift stop)."""
    assert summary(plan_folds(_encode_decode("param"), DEFAULT_POLICY)) == {
        "e": "LIFTED default",
        "d": "LIFTED default",
        "y": "NOT_CONSTANT",
    }
    graph = _encode_decode("param")
    assert set(graph.consumers()[0]) == {1}  # the decode reads the encode, through its items
    keep = plan_folds(graph, KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(keep) == {
        "e": "LIFTED fold-quantize-of-constant",
        "d": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }
    (barrier,) = placements(keep, plan_folds(graph, DEFAULT_POLICY))
    assert (barrier.node, barrier.operand, barrier.stops_lift) == (1, 0, True)


def test_tuple_items_of_a_folded_call_are_not_constant_as_in_the_stock_pass():
    """On constants the encode folds, but no tuple item is a constant to the stock pass."""
    plan = plan_folds(_encode_decode("const"), DEFAULT_POLICY)
    assert summary(plan) == {"e": "FOLDED default", "d": "NOT_CONSTANT", "y": "NOT_CONSTANT"}
    assert decision(plan, "d").detail == "'q' is a run-time input"


def test_a_call_on_constants_only_still_folds_beside_the_parameter_path():
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    g.call("relax.add", g.param("w"), e, label="a")
    assert summary(plan_folds(g.build(), DEFAULT_POLICY)) == {
        "e": "FOLDED default",
        "a": "LIFTED default",
    }


def test_the_stock_lifting_rule_outranks_allows_and_policies():
    """Like ``unfoldable`` for a fold: no policy makes the IR's lifting move a call it never moves."""
    g = G()
    q = g.call(
        "relax.quantize", g.param("w"), label="q", dtype="int8", lift_rule="outside dataflow"
    )
    g.allow(q, label="a")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {
        "q": "KEPT_BY_POLICY default",
        "a": "KEPT_WITH_INPUT default",
    }
    assert plan.decisions[0].detail == "outside dataflow"


def test_a_barrier_on_a_weight_stops_the_lifting_of_everything_after_it():
    g = G()
    b = g.barrier(g.param("w", *I8), label="b")
    g.call("relax.dequantize", b, label="dq", dtype="float32")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "b": "KEPT_BY_BARRIER fold_barrier",
        "dq": "KEPT_BY_BARRIER fold_barrier",
    }
    assert "computed from weight parameters" in plan.decisions[0].detail


def test_a_run_time_input_blocks_the_parameter_path():
    g = G()
    g.call("relax.add", g.param("w"), g.runtime("x"), label="a")
    assert summary(plan_folds(g.build(), DEFAULT_POLICY)) == {"a": "NOT_CONSTANT"}


def test_weights_only_sees_a_weight_parameter_as_a_weight():
    g = G()
    wq = g.call("relax.quantize", g.param("w", *F32), label="wq", dtype="int8")
    wdq = g.call("relax.dequantize", wq, label="wdq", dtype="float32")
    g.call("relax.matmul", g.runtime("x", *F32), wdq, label="y")
    other = g.call("relax.exp", g.param("v", *F32), label="other")
    g.call("relax.add", g.runtime("z", *F32), other, label="z2")
    assert summary(plan_folds(g.build(), WEIGHTS_ONLY_POLICY)) == {
        "wq": "LIFTED default",
        "wdq": "LIFTED default",
        "y": "NOT_CONSTANT",
        "other": "KEPT_BY_POLICY keep-non-weight-constants",
        "z2": "NOT_CONSTANT",
    }


def test_the_budget_keeps_a_large_lift_too():
    g = G()
    g.call("relax.tile", g.param("w"), label="t", shape=(4096,))
    policy = size_guard(min_result_bytes=1024)
    assert summary(plan_folds(g.build(), policy)) == {"t": "KEPT_BY_POLICY size-guard"}


def test_the_report_counts_lifts_apart_from_folds_and_keeps():
    plan = plan_folds(qdq_graph("param"), KEEP_QDQ_WEIGHTS_POLICY)
    report = summarize(plan)
    assert report["counts"]["by_action"] == {"fold": 0, "keep": 2, "lift": 1}
    assert report["counts"]["by_reason"]["lifted"] == 1
    rules = {rule["rule"]: rule for rule in report["rules"]}
    assert rules["fold-quantize-of-constant"]["lifted"] == 1
    assert "lifted ahead of run time" in plan.explain()


# Placements -----------------------------------------------------------------------------------


def test_annotate_puts_the_stop_under_the_barrier_of_a_call_kept_on_the_parameter_path():
    graph = qdq_graph("param")
    placed = placements(
        plan_folds(graph, KEEP_QDQ_WEIGHTS_POLICY), plan_folds(graph, DEFAULT_POLICY)
    )
    assert [(p.label, p.operand, p.stops_lift, p.existing_barrier) for p in placed] == [
        ("dq", 0, True, False)
    ]
    annotated = Annotated(None, placed, "keep-qdq-weights")
    assert annotated.barriers == placed and annotated.lift_stops == placed
    assert annotated.explain().splitlines()[0] == (
        "placed 1 annotation for policy 'keep-qdq-weights': 0 fold_allow, 1 fold_barrier, "
        "1 stop_lift_params (weights as parameters)"
    )


def test_annotate_puts_a_stop_under_a_hand_placed_barrier_over_a_weight():
    g = G()
    b = g.barrier(g.param("w", *I8), label="b")
    g.call("relax.dequantize", b, label="dq", dtype="float32")
    const_barrier = g.barrier(g.const("c"), label="cb")
    g.call("relax.exp", const_barrier, label="e")
    graph = g.build()
    placed = placements(plan_folds(graph, DEFAULT_POLICY), plan_folds(graph, DEFAULT_POLICY))
    assert [(p.label, p.stops_lift, p.existing_barrier) for p in placed] == [("b", True, True)]
    annotated, _ = apply_placements(graph, placed)
    assert [n.op for n in annotated.nodes][:2] == [LIFT_STOP_OP, "fold_guard.fold_barrier"]
    # Annotating again places nothing: the barrier already stands on the stop.
    again = plan_folds(annotated, DEFAULT_POLICY)
    assert placements(again, again) == ()


def test_a_kept_call_the_lifting_would_not_move_gets_no_barrier():
    g = G()
    g.call("relax.dequantize", g.param("w", *I8), label="dq", dtype="float32", lift_rule="no")
    graph = g.build()
    assert (
        placements(plan_folds(graph, KEEP_QDQ_WEIGHTS_POLICY), plan_folds(graph, DEFAULT_POLICY))
        == ()
    )


# Properties -----------------------------------------------------------------------------------


def reference_actions(case: Case) -> Dict[int, Action]:
    """Fold, lift or keep, as a recursive definition written apart from the planner.

    A node whose inputs are all constants folds by the fold path's precedence; one whose inputs
    are all known before run time, one of them a weight parameter or a lifted node, is lifted
    unless the stock lifting rule, a barrier or a policy keep says otherwise.
    """
    graph = case.graph
    users = graph.consumers()

    @cache
    def in_cone(node_id: int) -> bool:
        if graph.nodes[node_id].annotation is Annotation.BARRIER:
            return False
        return any(
            graph.nodes[u].annotation is Annotation.ALLOW or in_cone(u) for u in users[node_id]
        )

    @cache
    def action(node_id: int) -> Action:
        node = graph.nodes[node_id]
        if node.annotation is Annotation.BARRIER:
            return Action.KEEP
        kinds = set()
        for inp in node.inputs:
            if inp.kind is InputKind.NODE:
                kinds.add(
                    {Action.FOLD: "const", Action.LIFT: "weight"}.get(action(inp.node), "run")
                )
            else:
                kinds.add(
                    {InputKind.CONSTANT: "const", InputKind.PARAMETER: "weight"}.get(
                        inp.kind, "run"
                    )
                )
        if "run" in kinds:
            return Action.KEEP
        if "weight" in kinds:
            if node.lift_rule:
                return Action.KEEP
            if node.annotation is Annotation.ALLOW or in_cone(node_id):
                return Action.LIFT
            return Action.KEEP if node.op in case.keep_ops else Action.LIFT
        if node_id in case.failures:
            return Action.KEEP
        if node.annotation is Annotation.ALLOW:
            return Action.FOLD
        if node.unfoldable is not None:
            return Action.KEEP
        if in_cone(node_id):
            return Action.FOLD
        if node.op in case.keep_ops:
            return Action.KEEP
        if node.op in case.fold_ops:
            return Action.FOLD
        return Action.FOLD if node.default_fold else Action.KEEP

    return {node.id: action(node.id) for node in graph.nodes}


@SETTINGS
@given(cases(parameters=True))
def test_matches_the_reference_on_both_paths(case):
    plan = case.plan()
    expected = reference_actions(case)
    assert {d.node: d.action for d in plan.decisions} == expected, plan.explain()


@SETTINGS
@given(cases(parameters=True))
def test_soundness_nothing_run_time_is_lifted_and_no_weight_is_folded(case):
    plan = case.plan()
    graph = case.graph
    after_barrier = set()
    for node in graph.nodes:
        sources = [inp.node for inp in node.inputs if inp.kind is InputKind.NODE]
        if node.annotation is Annotation.BARRIER or any(s in after_barrier for s in sources):
            after_barrier.add(node.id)
    reads_weight = plan.graph.reachable_from_constants(through_barriers=True, with_parameters=True)
    for node, chosen in zip(graph.nodes, plan.decisions):
        if chosen.action is Action.KEEP:
            continue
        assert node.id not in after_barrier, chosen
        assert node.id in reads_weight, decision  # nothing computed from a run-time input
        if chosen.action is Action.FOLD:
            assert node.id in plan.graph.reachable_from_constants(through_barriers=False)


@SETTINGS
@given(cases(parameters=True, allows=False))
def test_placed_annotations_make_the_default_lift_and_fold_as_the_policy(case):
    """annotate's guarantee on both paths: under the default policy, the annotated graph folds
    and lifts exactly what the policy folds and lifts on the original one, and every barrier
    over a lifted operand stands on the lifting's stop."""
    policy_plan = plan_folds(case.graph, case.policy)
    placed = placements(policy_plan, plan_folds(case.graph, DEFAULT_POLICY))
    annotated, new_id = apply_placements(case.graph, placed)
    default_plan = plan_folds(annotated, DEFAULT_POLICY)
    for node in case.graph.nodes:
        assert (
            default_plan.decisions[new_id[node.id]].action == policy_plan.decisions[node.id].action
        ), (
            node.label,
            [str(p) for p in placed],
            policy_plan.explain(),
            default_plan.explain(),
        )
    for node in annotated.nodes:
        if node.annotation is Annotation.BARRIER and node.inputs[0].kind is InputKind.NODE:
            assert not default_plan.lifts(node.inputs[0].source), default_plan.explain()
        if node.annotation is Annotation.BARRIER:
            assert node.inputs[0].kind is not InputKind.PARAMETER, default_plan.explain()


def _as_items(graph: FoldGraph, chosen: FrozenSet[Tuple[int, int]]) -> FoldGraph:
    """``graph`` with the node inputs at ``chosen`` (node id, input index) read as tuple items."""
    return FoldGraph(
        tuple(
            dataclasses.replace(
                node,
                inputs=tuple(
                    dataclasses.replace(inp, kind=InputKind.TUPLE_ITEM)
                    if (node.id, index) in chosen
                    else inp
                    for index, inp in enumerate(node.inputs)
                ),
            )
            for node in graph.nodes
        )
    )


@st.composite
def cases_with_items(draw) -> Tuple[Case, FoldGraph]:
    # No fold_allow: its subgraph ends at a tuple item (allowed_cone follows whole reads only).
    case = draw(cases(parameters=True, allows=False))
    reads = [
        (node.id, index)
        for node in case.graph.nodes
        for index, inp in enumerate(node.inputs)
        if inp.kind is InputKind.NODE
    ]
    chosen = frozenset(draw(st.sets(st.sampled_from(reads)))) if reads else frozenset()
    return case, _as_items(case.graph, chosen)


@SETTINGS
@given(cases_with_items())
def test_a_tuple_item_is_its_call_when_lifted_and_a_run_time_input_otherwise(drawn):
    """The tuple-item rule as a fixed point: replacing each tuple item by a plain read of its
    call where the plan lifts that call, and by a run-time input where it does not, gives a
    graph without tuple items that the planner decides exactly the same way."""
    case, graph = drawn
    plan = plan_folds(graph, case.policy, eval_failures=case.failures)
    resolved = FoldGraph(
        tuple(
            dataclasses.replace(
                node,
                inputs=tuple(
                    (
                        dataclasses.replace(inp, kind=InputKind.NODE)
                        if plan.lifts(inp.source)
                        else NodeInput(InputKind.RUNTIME, inp.label, inp.tensor)
                    )
                    if inp.kind is InputKind.TUPLE_ITEM
                    else inp
                    for inp in node.inputs
                ),
            )
            for node in graph.nodes
        )
    )
    again = plan_folds(resolved, case.policy, eval_failures=case.failures)
    assert summary(again) == summary(plan), (plan.explain(), again.explain())
    for node in graph.nodes:  # soundness: nothing reading a tuple item ever folds
        if any(inp.kind is InputKind.TUPLE_ITEM for inp in node.inputs):
            assert not plan.folds(node.id), plan.explain()


# Conditional rules on the parameter path -----------------------------------------------------


def _requantize_chain_on_a_weight(g: G, s2: Ref) -> None:
    s1 = g.const("s1", "float32", ())
    dq1 = g.call("relax.dequantize", g.param("W", *I8), s1, label="dq1", dtype="float32")
    q = g.call("relax.quantize", dq1, s2, label="q", dtype="int8")
    dq2 = g.call("relax.dequantize", q, s2, label="dq2", dtype="float32")
    g.call("relax.nn.conv2d", g.runtime("x", *F32), dq2, label="y")


def test_a_requantize_chain_on_a_weight_parameter_is_lifted_to_one_int8_weight():
    """dq1 and q are lifted together (one int8 weight at the last scale); dq2 stays in main."""
    g = G()
    _requantize_chain_on_a_weight(g, g.const("s2", "float32", ()))
    graph = g.build()
    plan = plan_folds(graph, KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {
        "dq1": "LIFTED fold-requantize-chain",
        "q": "LIFTED fold-quantize-of-constant",
        "dq2": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }
    placed = placements(plan, plan_folds(graph, DEFAULT_POLICY))
    assert [(p.label, p.stops_lift) for p in placed] == [("dq2", True)]


def test_a_chain_whose_quantize_is_not_lifted_keeps_its_first_dequantize():
    """The chain rule lifts dq1 only with its quantize: a run-time scale vetoes it."""
    g = G()
    _requantize_chain_on_a_weight(g, g.runtime("s2", "float32", ()))
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert decision(plan, "dq1").action is Action.KEEP
    assert decision(plan, "dq1").rule == "keep-dequantize-of-integer-constant"
    assert "q = relax.quantize is not lifted" in decision(plan, "dq1").detail
