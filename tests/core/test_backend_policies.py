"""The backend policies (qdq-accelerator, weights-only) and the placement of annotations for a policy.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
from graphdsl import G, Ref, apply_placements, summary
from hypothesis import HealthCheck, given, settings
from support.profiles import examples
from test_properties import cases

import fold_guard
import fold_guard.policies
from fold_guard._core import (
    DEFAULT_POLICY,
    FOLD_QNN_POLICY,
    Annotation,
    FoldGraph,
    compose,
    plan_folds,
)
from fold_guard._core.annotate import Annotated, placements
from fold_guard._core.builtin_policies import QDQ_ACCELERATOR_POLICY, WEIGHTS_ONLY_POLICY
from fold_guard._core.graph import TensorInfo
from fold_guard._core.uses import GraphUses

I8, F32 = ("int8", (8, 4)), ("float32", (8, 4))


def qdq_weight(g: G, kind: str = "relax") -> Tuple[Ref, Ref]:
    """``w_q = quantize(W)``, ``w = dequantize(w_q)`` in ``kind``'s op names; returns (w_q, w)."""
    w = g.const("W", *F32)
    scale = g.const("scale", "float32", ())
    w_q = g.call(
        f"{kind}.quantize", w, scale, label="w_q", dtype="int8", default_fold=kind == "relax"
    )
    w_dq = g.call(
        f"{kind}.dequantize", w_q, scale, label="w", dtype="float32", default_fold=kind == "relax"
    )
    return w_q, w_dq


# qdq-accelerator ------------------------------------------------------------------------------


def test_qdq_accelerator_folds_weights_to_int8_and_keeps_their_dequantize():
    g = G()
    _, w = qdq_weight(g)
    g.call("relax.matmul", g.runtime("x", *F32), w, label="y")
    assert summary(plan_folds(g.build(), QDQ_ACCELERATOR_POLICY)) == {
        "w_q": "FOLDED fold-quantize-of-constant",
        "w": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }


def test_qdq_accelerator_keeps_quantized_ops_even_composed_before_fold_qnn():
    g = G()
    shift = g.call(
        "qnn.add",
        g.const("a", "int8", (8,)),
        g.const("b", "int8", (8,)),
        label="shift",
        default_fold=False,
    )
    g.call("qnn.add", g.runtime("x", "int8", (8,)), shift, label="y", default_fold=False)
    graph = g.build()
    composed = plan_folds(graph, compose(QDQ_ACCELERATOR_POLICY, FOLD_QNN_POLICY))
    assert summary(composed)["shift"] == "KEPT_BY_POLICY keep-quantized-ops"
    # keep-qdq-weights has no opinion on qnn.add, so fold-qnn lowers it
    keep_qdq = compose(fold_guard.get_policy("keep-qdq-weights"), FOLD_QNN_POLICY)
    assert summary(plan_folds(graph, keep_qdq))["shift"] == "FOLDED fold-qnn-ops"


def test_a_requantize_of_a_constant_folds_under_the_qdq_policies_unless_kept():
    """``qnn.requantize(<int32 const>)`` is a requantize chain in one op (FQ2I makes one of DQ -> Q).

    b_rq = qnn.requantize(b)   [b: int32 constant]
    y    = qnn.add(x, b_rq)
    ==>  b_rq folds to an integer constant at its output scale; keep-requantize keeps it
    """
    g = G()
    bias = g.call("qnn.requantize", g.const("b", "int32", (8,)), label="b_rq", default_fold=False)
    g.call("qnn.add", g.runtime("x", "int8", (8,)), bias, label="y", default_fold=False)
    graph = g.build()
    for name in ("keep-qdq-weights", "qdq-accelerator"):
        policy = compose(fold_guard.get_policy(name), FOLD_QNN_POLICY)
        assert summary(plan_folds(graph, policy))["b_rq"] == "FOLDED fold-requantize-of-constant"
        kept = fold_guard.policies.resolve_policy(["keep-requantize", name])
        assert summary(plan_folds(graph, kept))["b_rq"] == "KEPT_BY_POLICY keep-requantize-boundary"
    # default: stock Relay keeps every QNN op
    assert summary(plan_folds(graph, DEFAULT_POLICY))["b_rq"] == "KEPT_BY_POLICY default"


def test_qdq_accelerator_folds_relay_qnn_quantize_of_weights():
    g = G()
    _, w = qdq_weight(g, "qnn")  # adds w_q and w to g
    g.call("nn.dense", g.runtime("x", *F32), w, label="y", default_fold=False)
    plan = plan_folds(g.build(), QDQ_ACCELERATOR_POLICY)
    assert summary(plan)["w_q"] == "FOLDED fold-quantize-of-constant"
    assert summary(plan)["w"] == "KEPT_BY_POLICY keep-dequantize-of-integer-constant"


# weights-only ---------------------------------------------------------------------------------


def weights_only(graph: FoldGraph) -> Dict[str, str]:
    return summary(plan_folds(graph, WEIGHTS_ONLY_POLICY))


def test_weights_only_counts_a_read_of_the_type_as_a_use():
    """A value whose static type is also read (Relay ``shape_of``) does not end only as a weight.

    w = exp(W); b = fold_barrier(w); conv(x, b); s = shape_of(b) [type of b]; add(x, s)
    ==>   w kept by weights-only, as when shape_of read b's value
    """
    g = G()
    x = g.runtime("x", *F32)
    b = g.barrier(g.call("relax.exp", g.const("W", *F32), label="w"), label="b")
    g.call("relax.nn.conv2d", x, b, label="conv")
    s = g.call("shape_of", label="s", outputs=[TensorInfo.of("int32", (4,))], type_of=b)
    g.call("relax.add", x, s, label="y")
    assert weights_only(g.build())["w"] == "KEPT_BY_POLICY keep-non-weight-constants"


def test_weights_only_folds_a_weight_chain_and_keeps_other_constants():
    g = G()
    x = g.runtime("x", *F32)
    w = g.call(
        "relax.reshape", g.call("relax.exp", g.const("W", *F32), label="w_exp"), label="w_reshape"
    )
    y = g.call("relax.nn.conv2d", x, w, label="conv")
    shift = g.call("relax.exp", g.const("S", *F32), label="shift")
    g.call("relax.add", y, shift, label="y_plus_shift")  # bias of a conv: folds
    c = g.call("relax.tanh", g.const("C", *F32), label="not_weight")
    g.call("relax.multiply", x, c, label="scaled")  # an activation times a constant: not a weight
    assert weights_only(g.build()) == {
        "w_exp": "FOLDED default",
        "w_reshape": "FOLDED default",
        "conv": "NOT_CONSTANT",
        "shift": "FOLDED default",
        "y_plus_shift": "NOT_CONSTANT",
        "not_weight": "KEPT_BY_POLICY keep-non-weight-constants",
        "scaled": "NOT_CONSTANT",
    }


def test_weights_only_bias_needs_a_weight_op_on_the_other_side():
    g = G()
    x = g.runtime("x", *F32)
    c = g.call("relax.exp", g.const("C", *F32), label="c")
    g.call("relax.add", x, c, label="residual")  # x is an input, not a conv output
    d = g.call("relax.exp", g.const("D", *F32), label="d")
    g.call(
        "nn.bias_add", g.call("nn.dense", x, g.const("W", *F32), label="dense"), d, label="biased"
    )
    plan = weights_only(g.build())
    assert plan["c"] == "KEPT_BY_POLICY keep-non-weight-constants"
    assert plan["d"] == "FOLDED default"


def test_weights_only_keeps_a_constant_with_one_non_weight_use_and_one_without_uses():
    g = G()
    x = g.runtime("x", *F32)
    shared = g.call("relax.exp", g.const("W", *F32), label="shared")
    g.call("relax.matmul", x, shared, label="mm")
    g.call("relax.subtract", x, shared, label="sub")
    g.call("relax.tanh", g.const("R", *F32), label="returned")  # no consumer in the graph
    plan = weights_only(g.build())
    assert plan["shared"] == "KEPT_BY_POLICY keep-non-weight-constants"
    assert plan["returned"] == "KEPT_BY_POLICY keep-non-weight-constants"


def test_weights_only_looks_through_annotations_and_qdq():
    g = G()
    w_q, w = qdq_weight(g)
    barrier = g.barrier(w, label="b")
    g.call("relax.nn.conv2d", g.runtime("x", *F32), barrier, label="conv")
    uses = GraphUses(g.build())
    assert (
        uses.feeds_only_weights(w_q.node)
        and uses.feeds_only_weights(w.node)
        and uses.feeds_only_weights(barrier.node)
    )
    plan = plan_folds(g.build(), compose(QDQ_ACCELERATOR_POLICY, WEIGHTS_ONLY_POLICY))
    assert summary(plan)["w_q"] == "FOLDED fold-quantize-of-constant"


def test_weights_only_node_reading_a_runtime_value_is_never_a_weight_feeder():
    g = G()
    x = g.runtime("x", *F32)
    h = g.call("relax.exp", x, label="h")
    g.call("relax.matmul", x, h, label="mm")
    assert not GraphUses(g.build()).feeds_only_weights(h.node)


def test_builtin_policies_are_public_and_listed_with_their_rules():
    names = [policy.name for policy in fold_guard.policies.list_policies()]
    assert {"qdq-accelerator", "weights-only", "size-guard"} <= set(names)
    assert (
        fold_guard.policies.get_policy("qdq-accelerator")
        is fold_guard.policies.QDQ_ACCELERATOR_POLICY
    )
    text = fold_guard.policies.describe_policies()
    for policy in fold_guard.policies.list_policies():
        for rule in policy.rules:
            assert rule.name in text


# placements -----------------------------------------------------------------------------------


def test_placements_relax_qdq_weight_gets_a_barrier_on_the_dequantize_operand():
    g = G()
    _, w = qdq_weight(g)
    g.call("relax.matmul", g.runtime("x", *F32), w, label="y")
    graph = g.build()
    placed = placements(
        plan_folds(graph, QDQ_ACCELERATOR_POLICY), plan_folds(graph, DEFAULT_POLICY)
    )
    assert [str(p) for p in placed] == [
        "main: fold_barrier on w_q: int8[8, 4] (input 0 of w = relax.dequantize) [keep-dequantize-of-integer-constant]"
    ]


def test_placements_relay_qnn_quantize_gets_an_allow_and_no_barrier():
    g = G()
    _, w = qdq_weight(g, "qnn")
    g.call("nn.dense", g.runtime("x", *F32), w, label="y")
    graph = g.build()
    placed = placements(
        plan_folds(graph, QDQ_ACCELERATOR_POLICY), plan_folds(graph, DEFAULT_POLICY)
    )
    assert [str(p) for p in placed] == [
        "main: fold_allow around w_q = qnn.quantize [fold-quantize-of-constant]"
    ]
    annotated = Annotated(None, placed, "qdq-accelerator")
    assert annotated.allows == placed and annotated.barriers == ()
    assert (
        annotated.explain().splitlines()[0]
        == "placed 1 annotation for policy 'qdq-accelerator': 1 fold_allow, 0 fold_barrier"
    )


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(annotations=False))
def test_placed_annotations_make_the_default_decide_as_the_policy(case):
    """Guarantee behind every annotation helper: the default policy on the annotated graph folds
    exactly what the policy folds on the original graph (annotations aside)."""
    policy_plan = plan_folds(case.graph, case.policy)
    placed = placements(policy_plan, plan_folds(case.graph, DEFAULT_POLICY))
    annotated, new_id = apply_placements(case.graph, placed)
    default_plan = plan_folds(annotated, DEFAULT_POLICY)
    for node in case.graph.nodes:
        assert default_plan.folds(new_id[node.id]) == policy_plan.folds(node.id), (
            node.label,
            [str(p) for p in placed],
            policy_plan.explain(),
            default_plan.explain(),
        )


def test_placements_compare_plans_of_one_graph():
    g = G()
    g.call("relax.exp", g.const("c"))
    other = G()
    other.call("relax.exp", other.const("c"))
    with pytest.raises(fold_guard.PlanInvariantError):
        placements(plan_folds(g.build(), DEFAULT_POLICY), plan_folds(other.build(), DEFAULT_POLICY))


def test_a_call_kept_below_an_allow_root_gets_a_barrier_although_the_default_plan_never_reached_it():
    # x = f(C) folds only by the policy; y = g(x) is kept by the policy. The un-annotated default
    # plan keeps x, so y is "not constant" there; once x is allowed, the default would fold y.
    g = G()
    x = g.call("relax.tanh", g.const("C"), label="x", default_fold=False)
    g.call("relax.negative", x, label="y")
    graph = g.build()
    policy = fold_guard.FoldPolicy(
        "p",
        "",
        (
            fold_guard.Rule(
                "fold-tanh", fold_guard.Action.FOLD, "", lambda c: c.op == "relax.tanh"
            ),
            fold_guard.Rule(
                "keep-negative", fold_guard.Action.KEEP, "", lambda c: c.op == "relax.negative"
            ),
        ),
    )
    placed = placements(plan_folds(graph, policy), plan_folds(graph, DEFAULT_POLICY))
    assert [(p.annotation, p.label) for p in placed] == [
        (Annotation.ALLOW, "x"),
        (Annotation.BARRIER, "y"),
    ]
    annotated, new_id = apply_placements(graph, placed)
    assert not plan_folds(annotated, DEFAULT_POLICY).folds(new_id[1])
