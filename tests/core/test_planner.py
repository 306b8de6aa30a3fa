"""Exact plans for small graphs: which calls fold, which stay, and the reason and rule for each.

Sketches use ``c*`` for literal constants, ``x`` for a run-time input, ``C`` for "becomes a
constant" and ``=`` for "stays a call".

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

import dataclasses

import pytest
from graphdsl import G, decision, summary

from fold_guard._core import (
    ALLOW_RULE,
    BARRIER_RULE,
    DEFAULT_POLICY,
    DEFAULT_RULE,
    KEEP_QDQ_WEIGHTS_POLICY,
    SIZE_GUARD_POLICY,
    Action,
    ConflictingAnnotationsError,
    FoldGraph,
    FoldNode,
    FoldPolicy,
    InputKind,
    NodeInput,
    PlanInvariantError,
    PreconditionError,
    Reason,
    Rule,
    TensorInfo,
    compose,
    plan_folds,
)

KEEP_DQ_RULE = "keep-dequantize-of-integer-constant"
FOLD_Q_RULE = "fold-quantize-of-constant"
BARRIER_DETAIL = "the barrier stays; nothing that consumes it folds"


def keep_ops(*ops, name="keep-ops"):
    """A policy that keeps exactly the calls of ``ops`` (and has no opinion on the rest)."""
    rule = Rule(name, Action.KEEP, f"keep {', '.join(ops)}", lambda call: call.op in ops)
    return FoldPolicy(name, "test policy", (rule,))


# Plain folding ---------------------------------------------------------------------------------


def test_constant_chain_folds():
    """
    e = exp(c0); n = neg(e); a = add(n, c1)   ==>   e, n, a = C
    """
    g = G()
    c0, c1 = g.const("c0"), g.const("c1")
    e = g.call("relax.exp", c0, label="e")
    n = g.call("relax.negative", e, label="n")
    g.call("relax.add", n, c1, label="a")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {"e": "FOLDED default", "n": "FOLDED default", "a": "FOLDED default"}
    assert all(d.action is Action.FOLD and d.detail == "" for d in plan.decisions)
    assert plan.policy_name == "default"
    assert [d.node for d in plan.decisions] == [0, 1, 2]


def test_call_without_inputs_folds():
    """
    z = zeros()   ==>   z = C      (a creation op has no inputs, so all of them are constant)
    """
    g = G()
    g.call("relax.zeros", label="z", dtype="float32", shape=(8, 8))
    assert summary(plan_folds(g.build(), DEFAULT_POLICY)) == {"z": "FOLDED default"}


def test_empty_graph():
    plan = plan_folds(FoldGraph(()), DEFAULT_POLICY)
    assert plan.decisions == () and plan.folded == () and plan.kept == ()


# Run-time inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("x_first", [True, False], ids=["x-first", "x-second"])
def test_runtime_input_is_not_constant(x_first):
    """
    e = exp(c); y = add(x, e); z = neg(y)   ==>   e = C; y = add(x, C); z = neg(y)
    """
    g = G()
    c, x = g.const("c"), g.runtime("x")
    e = g.call("relax.exp", c, label="e")
    y = g.call("relax.add", *((x, e) if x_first else (e, x)), label="y")
    g.call("relax.negative", y, label="z")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {"e": "FOLDED default", "y": "NOT_CONSTANT", "z": "NOT_CONSTANT"}
    assert decision(plan, "y").detail == "'x' is a run-time input"
    assert decision(plan, "z").detail == "input y is not constant"
    assert decision(plan, "y").action is Action.KEEP


@pytest.mark.parametrize("x_first", [True, False], ids=["x-first", "x-second"])
def test_runtime_input_is_the_reported_cause_over_a_barrier(x_first):
    """A run-time input is the strongest cause, whatever its position.

    b = barrier(c); y = add(x, b)   ==>   y: not constant (input x), not "kept by barrier"
    """
    g = G()
    c, x = g.const("c"), g.runtime("x")
    b = g.barrier(c, label="b")
    g.call("relax.add", *((x, b) if x_first else (b, x)), label="y")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert decision(plan, "y").reason is Reason.NOT_CONSTANT
    assert decision(plan, "y").detail == "'x' is a run-time input"


def test_not_constant_node_input_is_preferred_over_policy_keep():
    """
    y = add(x, c0); k = dequantize(c_i8); z = matmul(k, y)   ==>   z: not constant (input y)
    """
    g = G()
    x, c0, ci8 = g.runtime("x"), g.const("c0"), g.const("ci8", "int8")
    y = g.call("relax.add", x, c0, label="y")
    k = g.call("relax.dequantize", ci8, label="k", dtype="float32")
    g.call("relax.matmul", k, y, label="z")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {
        "y": "NOT_CONSTANT",
        "k": f"KEPT_BY_POLICY {KEEP_DQ_RULE}",
        "z": "NOT_CONSTANT",
    }
    assert decision(plan, "z").detail == "input y is not constant"


@pytest.mark.parametrize("barrier_first", [True, False], ids=["barrier-first", "barrier-second"])
def test_barrier_is_the_reported_cause_over_a_policy_keep(barrier_first):
    """A barrier outranks a policy keep as the cause, whatever its position.

    b = barrier(c0); k = dequantize(c_i8); z = add(b, k)   ==>   z: kept by barrier (input b)
    (k is also a matmul's weight, so keep-qdq-weights keeps it)
    """
    g = G()
    c0, ci8 = g.const("c0"), g.const("ci8", "int8")
    b = g.barrier(c0, label="b")
    k = g.call("relax.dequantize", ci8, label="k", dtype="float32")
    g.call("relax.add", *((b, k) if barrier_first else (k, b)), label="z")
    g.call("relax.matmul", g.runtime("x"), k, label="m")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan)["k"] == f"KEPT_BY_POLICY {KEEP_DQ_RULE}"
    assert summary(plan)["z"] == f"KEPT_BY_BARRIER {BARRIER_RULE}"
    assert decision(plan, "z").detail == "input b is downstream of barrier b"


# Barriers --------------------------------------------------------------------------------------


def test_barrier_keeps_itself_and_consumers_but_operand_folds():
    """
    e = exp(c0); b = barrier(e); y = neg(b); z = add(y, c1)
        ==>   e = C; b = barrier(C); y = neg(b); z = add(y, c1)
    """
    g = G()
    c0, c1 = g.const("c0"), g.const("c1")
    e = g.call("relax.exp", c0, label="e")
    b = g.barrier(e, label="b")
    y = g.call("relax.negative", b, label="y")
    g.call("relax.add", y, c1, label="z")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "e": "FOLDED default",
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "y": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "z": f"KEPT_BY_BARRIER {BARRIER_RULE}",
    }
    assert decision(plan, "b").detail == "operand is constant; " + BARRIER_DETAIL
    assert decision(plan, "y").detail == "input b is downstream of barrier b"
    # The origin is carried down the chain: z names its input y and the barrier b.
    assert decision(plan, "z").detail == "input y is downstream of barrier b"


def test_barrier_on_a_literal_constant():
    """
    b = barrier(c); y = neg(b)   ==>   unchanged
    """
    g = G()
    b = g.barrier(g.const("c"), label="b")
    g.call("relax.negative", b, label="y")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "y": f"KEPT_BY_BARRIER {BARRIER_RULE}",
    }
    assert decision(plan, "b").detail.startswith("operand is constant")


def test_barrier_on_a_runtime_value():
    """
    b = barrier(x)   ==>   unchanged, and the detail does not claim the operand is constant
    """
    g = G()
    g.barrier(g.runtime("x"), label="b")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert decision(plan, "b").reason is Reason.KEPT_BY_BARRIER
    assert decision(plan, "b").detail == BARRIER_DETAIL


def test_barrier_blocks_only_its_own_consumers():
    """
    e = exp(c); b = barrier(e); y = neg(b); w = neg(e)   ==>   e = C; w = C; b, y stay
    """
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    b = g.barrier(e, label="b")
    g.call("relax.negative", b, label="y")
    g.call("relax.negative", e, label="w")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert [d.label for d in plan.folded] == ["e", "w"]
    assert [d.label for d in plan.kept] == ["b", "y"]


def test_barrier_beats_a_policy_that_would_fold():
    """A policy rule that folds everything still cannot fold a barrier or its consumers."""
    fold_all = FoldPolicy("fold-all", "", (Rule("fold-all", Action.FOLD, "", lambda call: True),))
    g = G()
    b = g.barrier(g.const("c"), label="b")
    g.call("relax.negative", b, label="y")
    assert summary(plan_folds(g.build(), fold_all)) == {
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "y": f"KEPT_BY_BARRIER {BARRIER_RULE}",
    }


# fold_allow ------------------------------------------------------------------------------------


def test_allow_forces_fold_of_default_keep():
    """The IR's default would keep ``d`` (e.g. Relay's QNN ops); the allow cone folds it.

    d = qnn.dequantize(c_i8); a = allow(d)   ==>   d, a = C
    """
    g = G()
    d = g.call(
        "qnn.dequantize",
        g.const("ci8", "int8"),
        label="d",
        dtype="float32",
        default_fold=False,
        default_rule="relay: QNN ops are not folded",
    )
    g.allow(d, label="a")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {"d": f"FOLDED {ALLOW_RULE}", "a": f"FOLDED {ALLOW_RULE}"}
    assert decision(plan, "d").detail == "inside a fold_allow subgraph"
    assert decision(plan, "a").detail == "operand is constant; the annotation is removed"


def test_without_allow_default_keep_stays():
    """The control for the test above.

    d = qnn.dequantize(c_i8); n = neg(d)   ==>   unchanged
    """
    g = G()
    d = g.call(
        "qnn.dequantize",
        g.const("ci8", "int8"),
        label="d",
        dtype="float32",
        default_fold=False,
        default_rule="relay: QNN ops are not folded",
    )
    g.call("relax.negative", d, label="n")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "d": f"KEPT_BY_POLICY {DEFAULT_RULE}",
        "n": f"KEPT_WITH_INPUT {DEFAULT_RULE}",
    }
    assert decision(plan, "d").detail == "relay: QNN ops are not folded"
    assert decision(plan, "n").detail == "input d was kept (d = qnn.dequantize)"
    assert (decision(plan, "d").root, decision(plan, "n").root) == (None, decision(plan, "d").node)


@pytest.mark.parametrize("default_fold", [True, False])
def test_allow_overrides_policy_keep_through_the_whole_cone(default_fold):
    """Every call upstream of the allow's operand folds, policy and default notwithstanding.

    d = dequantize(c_i8); n = neg(c1); s = add(d, n); a = allow(s)   ==>   d, n, s, a = C
    """
    g = G()
    d = g.call(
        "relax.dequantize",
        g.const("ci8", "int8"),
        label="d",
        dtype="float32",
        default_fold=default_fold,
    )
    n = g.call("relax.negative", g.const("c1"), label="n", default_fold=default_fold)
    s = g.call("relax.add", d, n, label="s", default_fold=default_fold)
    g.allow(s, label="a")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {k: f"FOLDED {ALLOW_RULE}" for k in ["d", "n", "s", "a"]}


def test_allow_of_a_literal_constant_folds():
    """
    a = allow(c)   ==>   a = C   (the annotation disappears)
    """
    g = G()
    g.allow(g.const("c"), label="a")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {"a": f"FOLDED {ALLOW_RULE}"}


def test_allow_of_allow():
    """
    a1 = allow(c); a2 = allow(a1)   ==>   a1, a2 = C
    """
    g = G()
    a1 = g.allow(g.const("c"), label="a1")
    g.allow(a1, label="a2")
    assert summary(plan_folds(g.build(), DEFAULT_POLICY)) == {
        "a1": f"FOLDED {ALLOW_RULE}",
        "a2": f"FOLDED {ALLOW_RULE}",
    }


def test_allow_over_runtime_dependent_operand_stays():
    """The constant part of the cone still folds; the rest, and the allow, stay as not constant.

    d = dequantize(c_i8); s = add(x, d); a = allow(s)   ==>   d = C; s = add(x, C); a = allow(s)
    """
    g = G()
    d = g.call("relax.dequantize", g.const("ci8", "int8"), label="d", dtype="float32")
    s = g.call("relax.add", g.runtime("x"), d, label="s")
    g.allow(s, label="a")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {"d": f"FOLDED {ALLOW_RULE}", "s": "NOT_CONSTANT", "a": "NOT_CONSTANT"}
    assert decision(plan, "s").detail == "'x' is a run-time input"
    assert decision(plan, "a").detail == "input s is not constant"


def test_allow_applies_only_to_its_cone():
    """A policy keep outside the cone is untouched; a node shared with the cone folds for all users.

    d1 = dequantize(c1_i8); a = allow(d1); d2 = dequantize(c2_i8); u = add(d1, d2);
    m = matmul(x, u)
        ==>   d1, a = C; d2 kept by policy (a weight, through u); u kept (input d2)
    """
    g = G()
    d1 = g.call("relax.dequantize", g.const("c1", "int8"), label="d1", dtype="float32")
    g.allow(d1, label="a")
    d2 = g.call("relax.dequantize", g.const("c2", "int8"), label="d2", dtype="float32")
    u = g.call("relax.add", d1, d2, label="u")
    g.call("relax.matmul", g.runtime("x"), u, label="m")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {
        "d1": f"FOLDED {ALLOW_RULE}",
        "a": f"FOLDED {ALLOW_RULE}",
        "d2": f"KEPT_BY_POLICY {KEEP_DQ_RULE}",
        "u": f"KEPT_WITH_INPUT {KEEP_DQ_RULE}",
        "m": "NOT_CONSTANT",
    }
    assert decision(plan, "u").detail == "input d2 was kept (d2 = relax.dequantize)"


@pytest.mark.parametrize("upstream_default_fold", [True, False])
def test_barrier_inside_allowed_subgraph_wins(upstream_default_fold):
    """The allow cone stops at the barrier: above it only the default/policy decides.

    e = exp(c); b = barrier(e); n = neg(b); a = allow(n)
        ==>   e = C if the default folds exp; b, n, a stay (kept by barrier)
    """
    g = G()
    e = g.call(
        "relax.exp",
        g.const("c"),
        label="e",
        default_fold=upstream_default_fold,
        default_rule="no exp",
    )
    b = g.barrier(e, label="b")
    n = g.call("relax.negative", b, label="n")
    g.allow(n, label="a")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "e": "FOLDED default" if upstream_default_fold else "KEPT_BY_POLICY default",
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "n": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "a": f"KEPT_BY_BARRIER {BARRIER_RULE}",
    }
    assert decision(plan, "a").detail == "input n is downstream of barrier b"


def test_barrier_of_allow_is_fine():
    """fold_barrier(fold_allow(x)) is the documented way to fold a value and keep it fenced.

    d = qnn.dequantize(c_i8) [default keeps]; a = allow(d); b = barrier(a); y = neg(b)
        ==>   d, a = C; b = barrier(C); y stays
    """
    g = G()
    d = g.call(
        "qnn.dequantize", g.const("ci8", "int8"), label="d", dtype="float32", default_fold=False
    )
    a = g.allow(d, label="a")
    b = g.barrier(a, label="b")
    g.call("relax.negative", b, label="y")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "d": f"FOLDED {ALLOW_RULE}",
        "a": f"FOLDED {ALLOW_RULE}",
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "y": f"KEPT_BY_BARRIER {BARRIER_RULE}",
    }
    assert decision(plan, "b").detail.startswith("operand is constant")


@pytest.mark.parametrize("operand", ["constant", "runtime", "node"])
def test_allow_of_barrier_is_a_conflict(operand):
    """
    b = barrier(v); a = allow(b)   ==>   ConflictingAnnotationsError naming a and b
    """
    g = G(function="subgraph_0")
    if operand == "constant":
        v = g.const("c")
    elif operand == "runtime":
        v = g.runtime("x")
    else:
        v = g.call("relax.exp", g.const("c"), label="e")
    b = g.barrier(v, label="my_barrier")
    g.allow(b, label="my_allow")
    with pytest.raises(ConflictingAnnotationsError) as info:
        plan_folds(g.build(), DEFAULT_POLICY)
    message = str(info.value)
    assert "my_allow" in message and "my_barrier" in message and "subgraph_0" in message
    assert "fold_barrier(fold_allow(x))" in message  # the hint
    assert isinstance(info.value, PreconditionError)


# Calls that can never fold ---------------------------------------------------------------------

UNFOLDABLE = [
    (Reason.IMPURE, "relax.print is impure"),
    (Reason.UNSUPPORTED, "no FLegalize for my.op"),
    (Reason.DYNAMIC_SHAPE, "output shape (n, 4) is symbolic"),
]


@pytest.mark.parametrize("reason,detail", UNFOLDABLE, ids=[r.name for r, _ in UNFOLDABLE])
@pytest.mark.parametrize("allowed", [False, True], ids=["plain", "in-allow-cone"])
def test_unfoldable_keeps_its_reason(reason, detail, allowed):
    """
    e = exp(c); u = op(e) [unfoldable]; n = neg(u); (a = allow(n))
        ==>   e = C; u, n, (a) stay: u with its own reason, n as not constant,
              a with u's reason (an allow names the root cause it could not get past)
    """
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    u = g.call("my.op", e, label="u", unfoldable=reason, unfoldable_detail=detail)
    n = g.call("relax.negative", u, label="n")
    expected = {
        "e": f"FOLDED {ALLOW_RULE if allowed else DEFAULT_RULE}",
        "u": reason.name,
        "n": "NOT_CONSTANT",
    }
    if allowed:
        g.allow(n, label="a")
        expected["a"] = reason.name  # the allow reports the root cause it could not get past
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == expected
    assert decision(plan, "u").detail == detail
    assert decision(plan, "n").detail == "input u is not constant"
    if allowed:
        assert decision(plan, "a").detail == f"operand n cannot fold: u: {detail}"


def test_unfoldable_beats_a_policy_that_would_fold():
    fold_all = FoldPolicy("fold-all", "", (Rule("fold-all", Action.FOLD, "", lambda call: True),))
    g = G()
    g.call(
        "relax.print", g.const("c"), label="p", unfoldable=Reason.IMPURE, unfoldable_detail="impure"
    )
    assert summary(plan_folds(g.build(), fold_all)) == {"p": "IMPURE"}


@pytest.mark.parametrize("allowed", [False, True], ids=["plain", "in-allow-cone"])
def test_eval_failure_keeps_node_and_downstream(allowed):
    """
    e = exp(c) [evaluation fails]; n = neg(e); (a = allow(n))
        ==>   e: evaluation failed (with the error text); n: not constant;
              (a): evaluation failed, naming e
    """
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    n = g.call("relax.negative", e, label="n")
    expected = {"e": "EVAL_FAILED", "n": "NOT_CONSTANT"}
    if allowed:
        g.allow(n, label="a")
        expected["a"] = "EVAL_FAILED"
    plan = plan_folds(g.build(), DEFAULT_POLICY, eval_failures={0: "TVMError: boom"})
    assert summary(plan) == expected
    assert decision(plan, "e").detail == "TVMError: boom"
    assert decision(plan, "n").detail == "input e is not constant"
    if allowed:
        assert decision(plan, "a").detail == "operand n cannot fold: e: TVMError: boom"


def test_eval_failure_on_a_non_constant_node_reports_the_input():
    """A node that was never constant-evaluable reports that, not a failure the adapter recorded."""
    g = G()
    g.call("relax.exp", g.runtime("x"), label="e")
    plan = plan_folds(g.build(), DEFAULT_POLICY, eval_failures={0: "boom"})
    assert summary(plan) == {"e": "NOT_CONSTANT"}


# Policy and default ----------------------------------------------------------------------------


def test_policy_keep_propagates_with_the_upstream_rule():
    """
    d = dequantize(c_i8); s = add(d, c1); n = neg(s); m = matmul(x, n)
        ==>   unchanged, all kept by the dq rule (d is m's weight, through s and n)
    """
    g = G()
    d = g.call("relax.dequantize", g.const("ci8", "int8"), label="d", dtype="float32")
    s = g.call("relax.add", d, g.const("c1"), label="s")
    n = g.call("relax.negative", s, label="n")
    g.call("relax.matmul", g.runtime("x"), n, label="m")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {
        "d": f"KEPT_BY_POLICY {KEEP_DQ_RULE}",
        "s": f"KEPT_WITH_INPUT {KEEP_DQ_RULE}",
        "n": f"KEPT_WITH_INPUT {KEEP_DQ_RULE}",
        "m": "NOT_CONSTANT",
    }
    (rule,) = (rule for rule in KEEP_QDQ_WEIGHTS_POLICY.rules if rule.name == KEEP_DQ_RULE)
    assert decision(plan, "d").detail == rule.description
    root = "d = relax.dequantize"
    assert decision(plan, "s").detail == f"input d was kept ({root})"
    assert (
        decision(plan, "n").detail == f"input s was kept ({root})"
    )  # the root stays the kept node
    assert decision(plan, "n").root == decision(plan, "s").root == decision(plan, "d").node


def test_policy_fold_rule_records_its_name():
    """
    q = quantize(c)   ==>   q = C, rule fold-quantize-of-constant
    """
    g = G()
    g.call("relax.quantize", g.const("w"), label="q", dtype="int8")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert summary(plan) == {"q": f"FOLDED {FOLD_Q_RULE}"}
    (rule,) = (rule for rule in KEEP_QDQ_WEIGHTS_POLICY.rules if rule.name == FOLD_Q_RULE)
    assert decision(plan, "q").detail == rule.description


@pytest.mark.parametrize("default_fold", [True, False])
def test_policy_beats_default(default_fold):
    """A policy verdict wins over the IR's default in both directions."""
    fold_q = FoldPolicy("fold-q", "", (Rule("fold-q", Action.FOLD, "", lambda c: c.op == "q"),))
    keep_k = keep_ops("k")
    g = G()
    g.call("q", g.const("c0"), label="q", default_fold=default_fold)
    g.call("k", g.const("c1"), label="k", default_fold=default_fold)
    assert summary(plan_folds(g.build(), compose(fold_q, keep_k))) == {
        "q": "FOLDED fold-q",
        "k": "KEPT_BY_POLICY keep-ops",
    }


def test_default_fold_false_is_kept_by_policy_default():
    """
    s = shape_of(c) [default: not folded outside dataflow]; n = neg(s)   ==>   unchanged
    """
    g = G()
    s = g.call(
        "relax.shape_of",
        g.const("c"),
        label="s",
        default_fold=False,
        default_rule="relax: ops fold only inside dataflow blocks",
    )
    g.call("relax.negative", s, label="n")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "s": f"KEPT_BY_POLICY {DEFAULT_RULE}",
        "n": f"KEPT_WITH_INPUT {DEFAULT_RULE}",
    }
    assert decision(plan, "s").detail == "relax: ops fold only inside dataflow blocks"
    assert decision(plan, "n").detail == "input s was kept (s = relax.shape_of)"


def test_value_from_a_barriers_type_is_kept_by_the_barrier():
    """
    b = fold_barrier(x); s = shape_of(b) [value from b's static type, no input]   ==>   s kept
    t = shape_of(y)      [value from y's static type, y a run-time input]          ==>   t folds
    """
    g = G()
    b = g.barrier(g.runtime("x"), label="b")
    g.call("shape_of", label="s", outputs=[TensorInfo.of("int32", (1,))], type_of=b)
    y = g.call("relax.exp", g.runtime("y"), label="y")
    g.call("shape_of", label="t", outputs=[TensorInfo.of("int32", (1,))], type_of=y)
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    assert summary(plan) == {
        "b": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "s": f"KEPT_BY_BARRIER {BARRIER_RULE}",
        "y": "NOT_CONSTANT",
        "t": f"FOLDED {DEFAULT_RULE}",
    }
    assert decision(plan, "s").detail == "input b is downstream of barrier b"
    assert decision(plan, "s").root == 0


def test_type_source_must_come_first():
    t = TensorInfo.of("int32", (1,))
    with pytest.raises(PlanInvariantError, match="reads the type of node 1"):
        FoldGraph(
            (
                FoldNode(0, "shape_of", "s", "main", (), (t,), type_source=1),
                FoldNode(1, "exp", "e", "main", (), (t,)),
            )
        )


def test_policy_sees_only_constant_calls():
    """Rules are never asked about a call with a non-constant input."""
    seen = []
    spy = FoldPolicy(
        "spy",
        "",
        (Rule("spy", Action.KEEP, "", lambda call: seen.append(call.node.label) or False),),
    )
    g = G()
    e = g.call("relax.exp", g.const("c"), label="e")
    g.call("relax.add", e, g.runtime("x"), label="y")
    b = g.barrier(e, label="b")
    g.call("relax.negative", b, label="n")
    g.allow(e, label="a")
    plan_folds(g.build(), spy)
    assert seen == []  # e is in the allow cone; nothing else is constant


# Graph invariants ------------------------------------------------------------------------------

_T = TensorInfo.of("float32", (4,))


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param((FoldNode(1, "relax.exp", "e", "main", (), (_T,)),), id="id-not-position"),
        pytest.param(
            (
                FoldNode(
                    0, "relax.exp", "e", "main", (NodeInput(InputKind.NODE, "n", _T, 1),), (_T,)
                ),
                FoldNode(1, "relax.negative", "n", "main", (), (_T,)),
            ),
            id="forward-reference",
        ),
        pytest.param(
            (
                FoldNode(
                    0, "relax.exp", "e", "main", (NodeInput(InputKind.NODE, "e", _T, 0),), (_T,)
                ),
            ),
            id="self-reference",
        ),
        pytest.param(
            (
                FoldNode(
                    0, "relax.exp", "e", "main", (NodeInput(InputKind.NODE, "?", _T, None),), (_T,)
                ),
            ),
            id="missing-node-id",
        ),
        pytest.param(
            (
                FoldNode(
                    0, "relax.exp", "e", "main", (NodeInput(InputKind.NODE, "?", _T, -1),), (_T,)
                ),
            ),
            id="negative-node-id",
        ),
    ],
)
def test_graph_not_topologically_ordered_is_rejected(nodes):
    with pytest.raises(PlanInvariantError, match="main/e"):
        FoldGraph(nodes)


def test_consumers_map():
    g = G()
    c = g.const("c")
    e = g.call("relax.exp", c, label="e")
    g.call("relax.add", e, e, label="a")
    g.call("relax.negative", e, label="n")
    assert g.build().consumers() == {0: (1, 1, 2), 1: (), 2: ()}


def test_plan_is_frozen():
    g = G()
    g.call("relax.exp", g.const("c"), label="e")
    plan = plan_folds(g.build(), DEFAULT_POLICY)
    with pytest.raises(AttributeError):
        plan.decisions = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        plan.decisions[0].action = Action.KEEP  # type: ignore[misc]


@pytest.mark.parametrize("blocked_first", ["policy", "unfoldable"])
def test_reported_cause_does_not_depend_on_argument_order(blocked_first):
    """
    k = dequantize(c_i8) [kept by policy] | u = print(c) [impure];  b = barrier(c)
    y1 = add(k|u, b); y2 = add(b, k|u)   ==>   y1 and y2 should report the same reason
    """
    g = G()
    c = g.const("c")
    if blocked_first == "policy":
        k = g.call("relax.dequantize", g.const("ci8", "int8"), label="k", dtype="float32")
    else:
        k = g.call(
            "relax.print", c, label="k", unfoldable=Reason.IMPURE, unfoldable_detail="impure"
        )
    b = g.barrier(c, label="b")
    g.call("relax.add", k, b, label="y1")
    g.call("relax.add", b, k, label="y2")
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)
    assert decision(plan, "y1").reason is decision(plan, "y2").reason


# allow_roots: where annotation helpers put fold_allow --------------------------------------------


def _qnn_chain_graph(barrier: bool):
    """w -> qnn.quantize -> [fold_barrier] -> qnn.requantize -> qnn.dense(x, .)  (x at run time)."""
    from fold_guard._core.graph import (
        Annotation,
        FoldGraph,
        FoldNode,
        InputKind,
        NodeInput,
        TensorInfo,
    )

    t = TensorInfo.of("int8", (4, 4))
    w = NodeInput(InputKind.CONSTANT, "w", TensorInfo.of("float32", (4, 4)))
    x = NodeInput(InputKind.RUNTIME, "x", t)
    nodes = [FoldNode(0, "qnn.quantize", "q", "main", (w,), (t,), default_fold=False)]
    if barrier:
        nodes.append(
            FoldNode(
                1,
                "fold_barrier",
                "b",
                "main",
                (NodeInput(InputKind.NODE, "q", t, 0),),
                (t,),
                annotation=Annotation.BARRIER,
            )
        )
    last = len(nodes) - 1
    nodes.append(
        FoldNode(
            len(nodes),
            "qnn.requantize",
            "r",
            "main",
            (NodeInput(InputKind.NODE, "p", t, last),),
            (t,),
            default_fold=False,
        )
    )
    nodes.append(
        FoldNode(
            len(nodes),
            "qnn.dense",
            "d",
            "main",
            (x, NodeInput(InputKind.NODE, "r", t, len(nodes) - 1)),
            (t,),
            default_fold=False,
        )
    )
    return FoldGraph(tuple(nodes))


def test_allow_roots_is_the_top_of_each_extra_constant_subgraph():
    from fold_guard._core import DEFAULT_POLICY, FOLD_QNN_POLICY, allow_roots

    graph = _qnn_chain_graph(barrier=False)
    assert allow_roots(plan_folds(graph, FOLD_QNN_POLICY), plan_folds(graph, DEFAULT_POLICY)) == (
        1,
    )


def test_allow_roots_stop_at_barriers():
    """A barrier splits the constant chain: only the part above it is a root; below is not constant."""
    from fold_guard._core import DEFAULT_POLICY, FOLD_QNN_POLICY, allow_roots

    graph = _qnn_chain_graph(barrier=True)
    assert allow_roots(plan_folds(graph, FOLD_QNN_POLICY), plan_folds(graph, DEFAULT_POLICY)) == (
        0,
    )


def test_allow_roots_rejects_plans_of_different_graphs():
    from fold_guard._core import DEFAULT_POLICY, PlanInvariantError, allow_roots

    with pytest.raises(PlanInvariantError):
        allow_roots(
            plan_folds(_qnn_chain_graph(False), DEFAULT_POLICY),
            plan_folds(_qnn_chain_graph(False), DEFAULT_POLICY),
        )


# ----------------------------------------------------------------------------------- lowered calls


def _lowered_graph():
    """k = call_tir(<kernel>, c); an already lowered call on a constant (Relax after LegalizeOps)."""
    t = TensorInfo.of("int8", (4, 4))
    node = FoldNode(
        0,
        "relax.call_tir",
        "k",
        "main",
        (NodeInput(InputKind.CONSTANT, "c", t),),
        (t,),
        lowered=True,
    )
    return FoldGraph((node,))


def test_an_unrecognised_lowered_call_follows_the_default_and_says_so():
    """k = call_tir(<no name>, c): keep-qdq-weights has no rule for it; the IR's default folds it."""
    d = plan_folds(_lowered_graph(), KEEP_QDQ_WEIGHTS_POLICY).decisions[0]
    assert (d.action, d.reason, d.rule) == (Action.FOLD, Reason.FOLDED, "default")
    assert "not recognised by the rules of policy 'keep-qdq-weights'" in d.detail


def test_an_unrecognised_lowered_call_is_kept_under_a_keep_fallback():
    policy = dataclasses.replace(KEEP_QDQ_WEIGHTS_POLICY, lowered_fallback=Action.KEEP)
    d = plan_folds(_lowered_graph(), policy).decisions[0]
    assert (d.action, d.reason, d.rule) == (Action.KEEP, Reason.KEPT_BY_POLICY, "lowered_fallback")
    assert "not recognised" in d.detail and "kept" in d.detail


def test_size_only_policy_and_default_decide_a_lowered_call():
    assert not SIZE_GUARD_POLICY.reads_ops and not DEFAULT_POLICY.reads_ops
    for policy in (DEFAULT_POLICY, SIZE_GUARD_POLICY):
        assert plan_folds(_lowered_graph(), policy).decisions[0].reason is Reason.FOLDED


def test_a_rule_declaring_it_reads_no_ops_decides_a_lowered_call():
    rule = Rule("keep-all", Action.KEEP, "keep everything", lambda call: True, reads_ops=False)
    plan = plan_folds(_lowered_graph(), FoldPolicy("sizes", "test", (rule,)))
    assert (plan.decisions[0].reason, plan.decisions[0].rule) == (Reason.KEPT_BY_POLICY, "keep-all")


def test_a_lowered_call_behind_a_runtime_input_asks_no_policy():
    """Only calls with constant inputs reach a policy, so only they can raise."""
    t = TensorInfo.of("int8", (4, 4))
    node = FoldNode(
        0,
        "relax.call_tir",
        "k",
        "main",
        (NodeInput(InputKind.RUNTIME, "x", t),),
        (t,),
        lowered=True,
    )
    assert (
        plan_folds(FoldGraph((node,)), KEEP_QDQ_WEIGHTS_POLICY).decisions[0].reason
        is Reason.NOT_CONSTANT
    )
