"""Property tests of the planner over random DAGs (STYLE item 13).

A random case is: 1-3 literal constants ``k*``, 0-2 run-time inputs ``x*``, 1-14 calls ``v*``
(unary or binary NumPy-backed ops, ``fold_barrier``, ``fold_allow``), each op call with a random
``default_fold`` and, rarely, an ``unfoldable`` reason or an evaluation failure; and a policy that
keeps a random set of ops and folds another. Unless a test asks for it, no ``fold_allow`` reads a
``fold_barrier`` directly (that conflict is an error, tested on its own).

    k0 ─ v0=exp ─ v1=barrier ─ v3=add ─ v4=allow          v0 = C; v1..v4 stay (barrier)
    x0 ─────────── v2=neg ────┘                  ==>      v2 stays (not constant)

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Dict, FrozenSet, Mapping, Set

import numpy as np
import pytest
from graphdsl import NUMPY_OPS, G, apply_plan, evaluate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples

from fold_guard._core import (
    DEFAULT_POLICY,
    Action,
    Annotation,
    ConflictingAnnotationsError,
    FoldGraph,
    FoldPolicy,
    InputKind,
    Reason,
    Rule,
    plan_folds,
)
from fold_guard._core.driver import has_inputs, pending_levels

UNARY_OPS = ("relax.negative", "relax.clip_exp", "relax.tanh")
BINARY_OPS = ("relax.add", "relax.multiply", "relax.subtract")
ALL_OPS = UNARY_OPS + BINARY_OPS
UNFOLDABLE = (Reason.IMPURE, Reason.UNSUPPORTED, Reason.DYNAMIC_SHAPE)

SETTINGS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass(frozen=True)
class Case:
    graph: FoldGraph
    policy: FoldPolicy
    failures: Mapping[int, str]
    keep_ops: FrozenSet[str]
    fold_ops: FrozenSet[str]
    conflict: bool  # some fold_allow reads a fold_barrier directly

    def plan(self):
        return plan_folds(self.graph, self.policy, eval_failures=self.failures)


def make_policy(keep_ops: FrozenSet[str], fold_ops: FrozenSet[str]) -> FoldPolicy:
    rules = (
        Rule("keep-random", Action.KEEP, "random keep set", lambda call: call.op in keep_ops),
        Rule("fold-random", Action.FOLD, "random fold set", lambda call: call.op in fold_ops),
    )
    return FoldPolicy("random", "keeps and folds random op sets", rules)


@st.composite
def cases(
    draw,
    *,
    annotations: bool = True,
    policy: bool = True,
    conflicts: bool = False,
    parameters: bool = False,
    allows: bool = True,
) -> Case:
    """A random case (module doc). ``parameters`` adds 0-2 weight parameters ``w*`` and gives
    some calls a stock lifting rule that keeps them at run time; ``allows=False`` draws barriers
    but no ``fold_allow``."""
    g = G()
    refs = [g.const(f"k{i}") for i in range(draw(st.integers(1, 3)))]
    refs += [g.runtime(f"x{i}") for i in range(draw(st.integers(0, 2)))]
    if parameters:
        refs += [g.param(f"w{i}") for i in range(draw(st.integers(0, 2)))]
    kinds = ["op"] * 6 + ["barrier"] + (["allow"] if allows else []) if annotations else ["op"]
    barriers: Set[int] = set()
    op_nodes = []
    conflict = False
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(kinds))
        label = f"v{i}"
        if kind == "barrier":
            ref = g.barrier(refs[draw(st.integers(0, len(refs) - 1))], label=label)
            barriers.add(ref.node)
        elif kind == "allow":
            candidates = (
                refs if conflicts else [r for r in refs if r.node not in barriers or r.node is None]
            )
            operand = candidates[draw(st.integers(0, len(candidates) - 1))]
            conflict = conflict or (operand.node is not None and operand.node in barriers)
            ref = g.allow(operand, label=label)
        else:
            op = draw(st.sampled_from(ALL_OPS))
            arity = 1 if op in UNARY_OPS else 2
            args = [refs[draw(st.integers(0, len(refs) - 1))] for _ in range(arity)]
            unfoldable = draw(st.sampled_from((None,) * 9 + UNFOLDABLE))
            ref = g.call(
                op,
                *args,
                label=label,
                default_fold=draw(st.sampled_from([True, True, True, False])),
                default_rule="stock pass keeps it",
                unfoldable=unfoldable,
                unfoldable_detail="" if unfoldable is None else f"{unfoldable.text} {label}",
                lift_rule=draw(st.sampled_from(["", "", "", "stock lifting keeps it"]))
                if parameters
                else "",
            )
            op_nodes.append(ref.node)
        refs.append(ref)
    failures = {}
    if op_nodes and draw(st.integers(0, 3)) == 0:
        failed = draw(st.sampled_from(op_nodes))
        failures = {failed: f"boom in v{failed}"}
    keep = frozenset(draw(st.sets(st.sampled_from(ALL_OPS), max_size=3))) if policy else frozenset()
    fold = frozenset(draw(st.sets(st.sampled_from(ALL_OPS), max_size=3))) if policy else frozenset()
    chosen = make_policy(keep, fold) if policy else DEFAULT_POLICY
    return Case(g.build(), chosen, failures, keep, fold, conflict)


# Graph helpers ---------------------------------------------------------------------------------


def ancestors(graph: FoldGraph) -> Dict[int, FrozenSet[int]]:
    """Node id -> ids of every node it transitively reads (not itself)."""
    result: Dict[int, FrozenSet[int]] = {}
    for node in graph.nodes:
        acc: Set[int] = set()
        for inp in node.inputs:
            if inp.kind is InputKind.NODE:
                acc.add(inp.node)
                acc |= result[inp.node]
        result[node.id] = frozenset(acc)
    return result


def reads_runtime(graph: FoldGraph, anc_map: Mapping[int, FrozenSet[int]], node_id: int) -> bool:
    """Whether a run-time input is reachable upstream of ``node_id`` (itself included)."""
    return any(
        inp.kind is InputKind.RUNTIME
        for n in anc_map[node_id] | {node_id}
        for inp in graph.nodes[n].inputs
    )


def is_clean(case: Case, anc_map, node_id: int) -> bool:
    """Nothing at or upstream of ``node_id`` stops folding: no run-time input, barrier,
    unfoldable call or failed evaluation."""
    graph = case.graph
    for n in anc_map[node_id] | {node_id}:
        node = graph.nodes[n]
        if (
            node.annotation is Annotation.BARRIER
            or node.unfoldable is not None
            or n in case.failures
        ):
            return False
    return not reads_runtime(graph, anc_map, node_id)


def reference_fold_no_annotations(case: Case) -> Dict[int, bool]:
    """Stock semantics, written independently: fold iff evaluable, default_fold, and every input
    is a literal or a folded node."""
    graph = case.graph

    @cache
    def folds(node_id: int) -> bool:
        node = graph.nodes[node_id]
        if node.unfoldable is not None or node_id in case.failures or not node.default_fold:
            return False
        return all(
            inp.kind is InputKind.CONSTANT or (inp.kind is InputKind.NODE and folds(inp.node))
            for inp in node.inputs
        )

    return {node.id: folds(node.id) for node in graph.nodes}


def reference_fold(case: Case) -> Dict[int, bool]:
    """The full precedence (barrier > allow > policy > default), as a recursive definition.

    A node is in an allow cone when it is not a barrier and one of its consumers is a fold_allow
    or is itself in an allow cone.
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
    def folds(node_id: int) -> bool:
        node = graph.nodes[node_id]
        if node.annotation is Annotation.BARRIER:
            return False
        if not all(
            inp.kind is InputKind.CONSTANT or (inp.kind is InputKind.NODE and folds(inp.node))
            for inp in node.inputs
        ):
            return False
        if node_id in case.failures:
            return False
        if node.annotation is Annotation.ALLOW:
            return True
        if node.unfoldable is not None:
            return False
        if in_cone(node_id):
            return True
        if node.op in case.keep_ops:
            return False
        if node.op in case.fold_ops:
            return True
        return node.default_fold

    return {node.id: folds(node.id) for node in graph.nodes}


# Properties ------------------------------------------------------------------------------------


@SETTINGS
@given(cases())
def test_soundness(case):
    """No folded node has a run-time input, a barrier, an unfoldable call or a failed evaluation
    at or upstream of it; every barrier is kept; FOLD goes with FOLDED and only with it."""
    plan = case.plan()
    graph = case.graph
    anc_map = ancestors(graph)
    assert len(plan.decisions) == len(graph.nodes)
    for node, d in zip(graph.nodes, plan.decisions):
        assert d.node == node.id and d.label == node.label and d.op == node.op
        assert (d.action is Action.FOLD) == (d.reason is Reason.FOLDED)
        if node.annotation is Annotation.BARRIER:
            assert d.action is Action.KEEP and d.reason is Reason.KEPT_BY_BARRIER
        if d.action is Action.FOLD:
            assert is_clean(case, anc_map, node.id), node
            # Closure: everything a folded node reads is a literal or folded too.
            for inp in node.inputs:
                assert inp.kind is InputKind.CONSTANT or plan.folds(inp.node)


@SETTINGS
@given(cases())
def test_reasons_point_at_a_real_cause(case):
    """A kept node's reason names something that is really there.

    * KEPT_BY_BARRIER: the node is a barrier or a barrier is upstream.
    * NOT_CONSTANT: a non-constant input, and a run-time input / unfoldable / failed node upstream.
    * IMPURE / UNSUPPORTED / DYNAMIC_SHAPE: the node's own unfoldable reason and detail, or, for a
      fold_allow, an upstream node with that reason, named in the detail.
    * EVAL_FAILED: the node's own failure, with the adapter's text as detail, or, for a
      fold_allow, an upstream failure named in the detail.
    * KEPT_BY_POLICY: the rule kept this node, whose inputs are all constant.
    * KEPT_WITH_INPUT: a node upstream (its ``root``) was kept by a rule.
    """
    plan = case.plan()
    graph = case.graph
    anc_map = ancestors(graph)
    for node, d in zip(graph.nodes, plan.decisions):
        up = anc_map[node.id] | {node.id}
        has_nonconstant_input = any(
            inp.kind is InputKind.RUNTIME
            or (inp.kind is InputKind.NODE and not plan.folds(inp.node))
            for inp in node.inputs
        )
        if d.reason is Reason.KEPT_BY_BARRIER:
            assert any(graph.nodes[n].annotation is Annotation.BARRIER for n in up)
        elif d.reason is Reason.NOT_CONSTANT:
            assert has_nonconstant_input
            assert reads_runtime(graph, anc_map, node.id) or any(
                graph.nodes[n].unfoldable is not None or n in case.failures
                for n in anc_map[node.id]
            )
            reads_runtime_directly = any(inp.kind is InputKind.RUNTIME for inp in node.inputs)
            if reads_runtime_directly and d.detail.endswith(" is a run-time input"):
                assert any(
                    repr(inp.label) in d.detail
                    for inp in node.inputs
                    if inp.kind is InputKind.RUNTIME
                )
            else:
                assert d.detail.startswith("input ") and d.detail.endswith(" is not constant")
        elif d.reason in UNFOLDABLE and has_nonconstant_input:
            assert node.annotation is Annotation.ALLOW
            roots = [n for n in anc_map[node.id] if graph.nodes[n].unfoldable is d.reason]
            assert any(graph.nodes[n].unfoldable_detail in d.detail for n in roots)
        elif d.reason in UNFOLDABLE:
            assert node.unfoldable is d.reason and d.detail == node.unfoldable_detail
        elif d.reason is Reason.EVAL_FAILED and has_nonconstant_input:
            assert node.annotation is Annotation.ALLOW
            assert any(case.failures[n] in d.detail for n in anc_map[node.id] if n in case.failures)
        elif d.reason is Reason.EVAL_FAILED:
            assert d.detail == case.failures[node.id]
        elif d.reason is Reason.KEPT_BY_POLICY:
            # A rule kept this very call: all its inputs are constant.
            assert (
                d.rule in ("keep-random", "default")
                and not has_nonconstant_input
                and d.root is None
            )
            assert node.op in case.keep_ops if d.rule == "keep-random" else not node.default_fold
        elif d.reason is Reason.KEPT_WITH_INPUT:
            # Kept because an input was kept: the root is an ancestor some rule kept, with this rule.
            assert has_nonconstant_input and d.root in up
            assert (
                plan.decisions[d.root].reason is Reason.KEPT_BY_POLICY
                and plan.decisions[d.root].rule == d.rule
            )
            kept_by_rule = [
                n
                for n in up
                if graph.nodes[n].op in case.keep_ops or not graph.nodes[n].default_fold
            ]
            assert kept_by_rule


@SETTINGS
@given(cases())
def test_precedence_allow_over_policy_and_default(case):
    """Every node of an allow's cone folds when the whole cone is clean (no run-time input,
    barrier, unfoldable call or failed evaluation upstream), whatever the policy and default say.
    Also: any cone node (stopping at barriers) that is itself clean folds."""
    plan = case.plan()
    graph = case.graph
    anc_map = ancestors(graph)
    for node in graph.nodes:
        if node.annotation is not Annotation.ALLOW:
            continue
        if is_clean(case, anc_map, node.id):
            for n in anc_map[node.id] | {node.id}:
                assert plan.folds(n), (node.label, graph.nodes[n])
        # The cone, stopping at barriers, by an explicit walk.
        cone, stack = set(), [node.id]
        while stack:
            for inp in graph.nodes[stack.pop()].inputs:
                if (
                    inp.kind is InputKind.NODE
                    and graph.nodes[inp.node].annotation is not Annotation.BARRIER
                ):
                    if inp.node not in cone:
                        cone.add(inp.node)
                        stack.append(inp.node)
        for n in cone:
            if is_clean(case, anc_map, n):
                assert plan.folds(n)
                assert plan.decisions[n].rule in ("fold_allow",)


@SETTINGS
@given(cases(annotations=False, policy=False))
def test_matches_reference_without_annotations(case):
    """No annotations, DEFAULT_POLICY: a node folds iff it is evaluable, its default folds it, and
    all its inputs are literals or folded nodes (the stock pass)."""
    plan = case.plan()
    expected = reference_fold_no_annotations(case)
    assert {n: plan.folds(n) for n in expected} == expected
    for d in plan.kept:
        if d.reason in (Reason.KEPT_BY_POLICY, Reason.KEPT_WITH_INPUT):
            assert d.rule == "default"
        assert d.reason is not Reason.KEPT_BY_BARRIER


@SETTINGS
@given(cases())
def test_matches_reference_with_annotations_and_policy(case):
    plan = case.plan()
    expected = reference_fold(case)
    assert {n: plan.folds(n) for n in expected} == expected


@SETTINGS
@given(cases(conflicts=True))
def test_allow_of_barrier_always_raises(case):
    if case.conflict:
        with pytest.raises(ConflictingAnnotationsError):
            case.plan()
    else:
        case.plan()


@SETTINGS
@given(cases())
def test_determinism(case):
    """Planning twice, or planning an equal copy of the graph, gives equal plans."""
    first = case.plan()
    assert case.plan() == first
    copy = FoldGraph(tuple(case.graph.nodes))
    again = plan_folds(copy, case.policy, eval_failures=dict(case.failures))
    assert again.decisions == first.decisions


@SETTINGS
@given(cases())
def test_idempotence(case):
    """Apply the plan (folded nodes become literal constants of their consumers, ids renumbered)
    and plan again with the same policy and the remaining failures.

    Property: nothing folds the second time, and every remaining node gets exactly the decision
    it got the first time (same reason, rule and detail). The policies here look only at op names;
    a rule that tells a literal from a folded input (``CallView.input_is_constant_literal``) could
    legitimately break this.
    """
    first = case.plan()
    applied, new_id = apply_plan(first)
    failures = {new_id[i]: text for i, text in case.failures.items() if i in new_id}
    second = plan_folds(applied, case.policy, eval_failures=failures)
    assert second.folded == ()
    for old, new in new_id.items():
        a, b = first.decisions[old], second.decisions[new]
        assert (a.label, a.op, a.action, a.reason, a.rule, a.detail) == (
            b.label,
            b.op,
            b.action,
            b.reason,
            b.rule,
            b.detail,
        )


@SETTINGS
@given(cases(), st.integers(0, 2**32 - 1))
def test_semantic_equivalence(case, seed):
    """A NumPy interpreter gives the same values before and after folding.

    Folded values are computed from the literal constants alone (a folded node that touched a
    run-time input would raise KeyError); the applied graph then runs with those constants and
    random run-time inputs.
    """
    plan = case.plan()
    graph = case.graph
    rng = np.random.default_rng(seed)
    leaves = {
        inp.label: inp
        for node in graph.nodes
        for inp in node.inputs
        if inp.kind is not InputKind.NODE
    }
    constants = {
        k: rng.standard_normal(4).astype("float32")
        for k, v in leaves.items()
        if v.kind is InputKind.CONSTANT
    }
    runtime = {
        k: rng.standard_normal(4).astype("float32")
        for k, v in leaves.items()
        if v.kind is InputKind.RUNTIME
    }

    with np.errstate(all="ignore"):
        reference = evaluate(graph, {**constants, **runtime})
        # Step 1: evaluate only the folded nodes, seeing only literal constants.
        folded_values: Dict[str, np.ndarray] = {}
        values: Dict[int, np.ndarray] = {}
        for node in graph.nodes:
            if not plan.folds(node.id):
                continue
            args = [
                values[i.node] if i.kind is InputKind.NODE else constants[i.label]
                for i in node.inputs
            ]
            values[node.id] = NUMPY_OPS[node.op](*args)
            folded_values[node.label] = values[node.id]
        # Step 2: run the applied graph.
        applied, _ = apply_plan(plan)
        after = evaluate(applied, {**constants, **runtime, **folded_values})

    for label, value in folded_values.items():
        np.testing.assert_array_equal(value, reference[label])
    assert set(after) | set(folded_values) == set(reference)
    for label, value in after.items():
        np.testing.assert_array_equal(value, reference[label])


@given(cases(), st.data())
def test_levels_schedule_what_node_by_node_evaluates(case, data):
    """Evaluating ``pending_levels`` a level at a time sees what plan order does node by node.

    Every node of a level reads only values present when its level starts, the levels hold exactly
    the nodes a walk in plan order evaluates (skipping a node whose input has no value, with the
    same random evaluation failures), and both end with the same values: so an adapter may run a
    level's calls at once.
    """
    plan = case.plan()
    folded = [d.node for d in plan.folded]
    failing = data.draw(st.sets(st.sampled_from(folded))) if folded else set()

    one_by_one: Dict[int, bool] = {}
    yielded = []
    for decision in plan.folded:
        node = plan.graph.nodes[decision.node]
        if not has_inputs(node, one_by_one):
            continue
        yielded.append(node.id)
        if node.id not in failing:
            one_by_one[node.id] = True

    by_level: Dict[int, bool] = {}
    scheduled = []
    for level in pending_levels(plan, by_level):
        for node in level:
            sources = [inp.source for inp in node.inputs if inp.kind is InputKind.NODE]
            assert all(source in by_level for source in sources), (node.label, sources)
        scheduled += [node.id for node in level]
        by_level.update((node.id, True) for node in level if node.id not in failing)

    assert sorted(scheduled) == sorted(yielded)
    assert by_level == one_by_one
