"""Requantize chains on constants, and conditional folds (``Rule.needs_folded_consumers``).

A weight may arrive as ``dequantize(int8 W, s1) -> quantize(s2) -> dequantize(s2) -> op``
(onnxruntime's QNN flows write these). Under the QDQ policies the first dequantize folds with the
quantize into one int8 constant at ``s2`` and only the last dequantize stays; composed first,
``keep-requantize`` keeps the boundary instead. The first dequantize folds only where its
quantizes fold too: the planner checks that on the finished plan and decides it again otherwise.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
from graphdsl import G, Ref, apply_plan, decision, summary
from hypothesis import given
from hypothesis import strategies as st
from test_properties import ALL_OPS, SETTINGS, Case, cases

from fold_guard._core import (
    Action,
    FoldPolicy,
    PreconditionError,
    Rule,
    compose,
    plan_folds,
    resolve_policy,
)

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")
CHAIN = "fold-requantize-chain"
KEEP_DQ = "keep-dequantize-of-integer-constant"
FOLD_Q = "fold-quantize-of-constant"
W_I8, W_F32 = ("int8", (8, 4)), ("float32", (8, 4))


def requantize_chain(
    g: G, ir: str = "relax", *, runtime_scale: bool = False
) -> Tuple[Ref, Ref, Ref]:
    """``dq1 = dequantize(W_i8, s1)``, ``q = quantize(dq1, s2)``, ``dq2 = dequantize(q, s2)``."""
    default_fold = ir == "relax"  # stock Relay keeps every QNN op
    s1 = g.const("s1", "float32", ())
    s2 = g.runtime("s2", "float32", ()) if runtime_scale else g.const("s2", "float32", ())
    dq1 = g.call(
        f"{ir}.dequantize",
        g.const("W", *W_I8),
        s1,
        label="dq1",
        dtype="float32",
        default_fold=default_fold,
    )
    q = g.call(f"{ir}.quantize", dq1, s2, label="q", dtype="int8", default_fold=default_fold)
    dq2 = g.call(f"{ir}.dequantize", q, s2, label="dq2", dtype="float32", default_fold=default_fold)
    return dq1, q, dq2


def weight_op(ir: str) -> str:
    return "relax.nn.conv2d" if ir == "relax" else "qnn.conv2d"


@pytest.mark.parametrize("ir", ["relax", "qnn"])
@pytest.mark.parametrize("name", QDQ_POLICIES)
def test_a_chain_folds_to_one_integer_constant_at_the_last_scale(ir, name):
    """
    dq1 = dequantize(W_i8, s1)    folds: its only reader is a quantize that folds
    q   = quantize(dq1, s2)       folds: the int8 weight at scale s2
    dq2 = dequantize(q, s2)       stays: the QDQ weight the backend matches
    y   = conv2d(x, dq2)          not constant
    """
    g = G()
    _, _, dq2 = requantize_chain(g, ir)
    g.call(weight_op(ir), g.runtime("x", *W_F32), dq2, label="y")
    plan = plan_folds(g.build(), resolve_policy(name))
    assert summary(plan) == {
        "dq1": f"FOLDED {CHAIN}",
        "q": f"FOLDED {FOLD_Q}",
        "dq2": f"KEPT_BY_POLICY {KEEP_DQ}",
        "y": "NOT_CONSTANT",
    }


@pytest.mark.parametrize("ir", ["relax", "qnn"])
@pytest.mark.parametrize("name", QDQ_POLICIES)
def test_keep_requantize_composed_first_keeps_the_boundary(ir, name):
    """
    dq1 kept (keep-requantize-boundary); q and dq2 stay with it: the whole chain runs at run time
    """
    g = G()
    _, _, dq2 = requantize_chain(g, ir)
    g.call(weight_op(ir), g.runtime("x", *W_F32), dq2, label="y")
    plan = plan_folds(g.build(), resolve_policy(["keep-requantize", name]))
    assert summary(plan) == {
        "dq1": "KEPT_BY_POLICY keep-requantize-boundary",
        "q": "KEPT_WITH_INPUT keep-requantize-boundary",
        "dq2": "KEPT_WITH_INPUT keep-requantize-boundary",
        "y": "NOT_CONSTANT",
    }


def test_default_folds_the_whole_relax_chain_as_stock_does():
    g = G()
    _, _, dq2 = requantize_chain(g)
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq2, label="y")
    assert summary(plan_folds(g.build(), resolve_policy("default"))) == {
        "dq1": "FOLDED default",
        "q": "FOLDED default",
        "dq2": "FOLDED default",
        "y": "NOT_CONSTANT",
    }


def test_a_quantize_that_cannot_fold_vetoes_the_chain_rule():
    """
    dq1 = dequantize(W_i8, s1)    kept by keep-dequantize (the chain rule did not apply)
    q   = quantize(dq1, s2)       s2 is a run-time input: q cannot fold
    dq2 -> conv                   dq1 is still the conv's weight, through q and dq2
    ==>  dq1 is not folded into a float32 constant that a run-time quantize reads
    """
    g = G()
    _, _, dq2 = requantize_chain(g, runtime_scale=True)
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq2, label="y")
    plan = plan_folds(g.build(), resolve_policy("keep-qdq-weights"))
    assert summary(plan)["dq1"] == f"KEPT_BY_POLICY {KEEP_DQ}"
    assert decision(plan, "dq1").detail.endswith(
        f"({CHAIN} did not apply: q = relax.quantize does not fold)"
    )
    assert summary(plan)["q"] == "NOT_CONSTANT"


def test_a_rule_that_keeps_the_quantize_vetoes_the_chain_rule():
    """A backend's policy composed first keeps every quantize: the chain must not start."""
    keep_q = FoldPolicy(
        "keep-q",
        "keeps quantize",
        (Rule("keep-quantize", Action.KEEP, "q stays", lambda call: call.op == "relax.quantize"),),
    )
    g = G()
    _, _, dq2 = requantize_chain(g)
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq2, label="y")
    plan = plan_folds(g.build(), compose(keep_q, resolve_policy("keep-qdq-weights")))
    assert summary(plan) == {
        "dq1": f"KEPT_BY_POLICY {KEEP_DQ}",
        "q": f"KEPT_WITH_INPUT {KEEP_DQ}",
        "dq2": f"KEPT_WITH_INPUT {KEEP_DQ}",
        "y": "NOT_CONSTANT",
    }


def test_a_barrier_on_the_quantize_input_stops_the_chain_rule():
    """dq1 -> fold_barrier -> q: dq1's reader is the barrier, not a quantize."""
    g = G()
    dq1 = g.call(
        "relax.dequantize",
        g.const("W", *W_I8),
        g.const("s1", "float32", ()),
        label="dq1",
        dtype="float32",
    )
    b = g.barrier(dq1, label="b")
    q = g.call("relax.quantize", b, g.const("s2", "float32", ()), label="q", dtype="int8")
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), q, label="y")
    plan = plan_folds(g.build(), resolve_policy("keep-qdq-weights"))
    assert summary(plan)["dq1"] == f"KEPT_BY_POLICY {KEEP_DQ}"


def test_a_dequantize_with_another_reader_is_no_chain():
    """dq1 feeds a quantize and a conv: folding it would put a float32 weight into the conv."""
    g = G()
    dq1, _, _ = requantize_chain(g)
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq1, label="y")
    plan = plan_folds(g.build(), resolve_policy("keep-qdq-weights"))
    assert summary(plan)["dq1"] == f"KEPT_BY_POLICY {KEEP_DQ}"


def test_a_quantize_reading_the_dequantize_as_its_scale_is_no_chain():
    g = G()
    dq1 = g.call(
        "relax.dequantize",
        g.const("S", "int8", ()),
        g.const("s1", "float32", ()),
        label="dq1",
        dtype="float32",
    )
    q = g.call("relax.quantize", g.const("W", *W_F32), dq1, label="q", dtype="int8")
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), q, label="y")
    plan = plan_folds(g.build(), resolve_policy("keep-qdq-weights"))
    assert summary(plan)["dq1"] == f"KEPT_BY_POLICY {KEEP_DQ}"


def test_a_two_step_chain_folds_to_its_last_scale():
    """
    dq1 -> q2 -> dq2 -> q3 -> dq3 -> conv    ==>    only dq3 stays, on the int8 constant q3
    """
    g = G()
    _, _, dq2 = requantize_chain(g)
    q3 = g.call("relax.quantize", dq2, g.const("s3", "float32", ()), label="q3", dtype="int8")
    dq3 = g.call("relax.dequantize", q3, g.const("s3", "float32", ()), label="dq3", dtype="float32")
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq3, label="y")
    assert summary(plan_folds(g.build(), resolve_policy("qdq-accelerator"))) == {
        "dq1": f"FOLDED {CHAIN}",
        "q": f"FOLDED {FOLD_Q}",
        "dq2": f"FOLDED {CHAIN}",
        "q3": f"FOLDED {FOLD_Q}",
        "dq3": f"KEPT_BY_POLICY {KEEP_DQ}",
        "y": "NOT_CONSTANT",
    }


def test_a_veto_late_in_a_chain_keeps_the_earlier_steps_folded():
    """
    dq1 -> q -> dq2 -> q3 (run-time scale) -> dq3
    ==>  dq2 kept (its quantize cannot fold); dq1 and q still fold: q is read only by dq2
    """
    g = G()
    _, _, dq2 = requantize_chain(g)
    q3 = g.call("relax.quantize", dq2, g.runtime("s3", "float32", ()), label="q3", dtype="int8")
    dq3 = g.call("relax.dequantize", q3, g.const("s4", "float32", ()), label="dq3", dtype="float32")
    g.call("relax.nn.conv2d", g.runtime("x", *W_F32), dq3, label="y")
    assert summary(plan_folds(g.build(), resolve_policy("keep-qdq-weights"))) == {
        "dq1": f"FOLDED {CHAIN}",
        "q": f"FOLDED {FOLD_Q}",
        "dq2": f"KEPT_BY_POLICY {KEEP_DQ}",
        "q3": "NOT_CONSTANT",
        "dq3": "NOT_CONSTANT",
        "y": "NOT_CONSTANT",
    }


def test_the_budget_outranks_the_chain_rule():
    """dq1's float32 result (128 bytes) is over a 64-byte budget; q's int8 result is not."""
    g = G()
    requantize_chain(g)
    policy = compose(resolve_policy("keep-qdq-weights"), FoldPolicy("b", "budget", (), 64))
    plan = plan_folds(g.build(), policy)
    assert summary(plan)["dq1"] == "OVER_BUDGET max_fold_bytes"


def test_a_keep_rule_cannot_be_conditional():
    with pytest.raises(PreconditionError, match="needs_folded_consumers makes a fold conditional"):
        Rule("r", Action.KEEP, "d", lambda call: True, needs_folded_consumers=True)


# Properties of conditional folds over random graphs ------------------------------------------


def with_conditional_rule(case: Case, conditional_ops) -> Case:
    """``case`` with a policy: keep its keep set, fold ``conditional_ops`` only with their readers."""
    rules = (
        Rule("keep-random", Action.KEEP, "random keep set", lambda c: c.op in case.keep_ops),
        Rule(
            "fold-with-readers",
            Action.FOLD,
            "folds only where its readers fold",
            lambda c: c.op in conditional_ops,
            needs_folded_consumers=True,
        ),
        Rule("fold-random", Action.FOLD, "random fold set", lambda c: c.op in case.fold_ops),
    )
    policy = FoldPolicy("conditional", "a conditional fold rule", rules)
    return Case(case.graph, policy, case.failures, case.keep_ops, case.fold_ops, case.conflict)


def folded_by_conditional(plan) -> Dict[int, bool]:
    return {
        d.node: d.rule == "fold-with-readers" for d in plan.decisions if d.action is Action.FOLD
    }


CONDITIONAL_OPS = st.sets(st.sampled_from(ALL_OPS), min_size=1, max_size=3)


@SETTINGS
@given(cases(), CONDITIONAL_OPS)
def test_a_conditional_fold_always_has_every_reader_folded(case, ops):
    """Soundness: a node a conditional rule folds has no reader that does not fold; and a node
    the rule was vetoed on (its detail says so) has one that does not."""
    case = with_conditional_rule(case, frozenset(ops))
    plan = case.plan()
    users = case.graph.consumers()
    for node_id, conditional in folded_by_conditional(plan).items():
        if conditional:
            assert all(plan.folds(user) for user in users[node_id])
    for d in plan.decisions:
        if "fold-with-readers did not apply" in d.detail:
            assert not all(plan.folds(user) for user in users[d.node])


@SETTINGS
@given(cases(), CONDITIONAL_OPS)
def test_planning_the_applied_plan_again_folds_nothing(case, ops):
    """Idempotence with a conditional rule: the folded graph plans to no new fold."""
    case = with_conditional_rule(case, frozenset(ops))
    first = case.plan()
    applied, new_id = apply_plan(first)
    failures = {new_id[i]: text for i, text in case.failures.items() if i in new_id}
    second = plan_folds(applied, case.policy, eval_failures=failures)
    assert second.folded == ()
    for old, new in new_id.items():
        a, b = first.decisions[old], second.decisions[new]
        assert (a.action, a.reason, a.rule) == (b.action, b.reason, b.rule)
