"""Property tests on random small Relay DAGs with random ``fold_barrier`` (and ``fold_allow``) placements.

Each module is a DAG of float ops on shape (2, 3) over a few constants and one run-time input
``x``; some results are wrapped in ``fold_allow`` and then some in ``fold_barrier`` (in that
order, so ``fold_allow(fold_barrier(.))``, an error, never occurs), and every value is returned in
a tuple so nothing is dead code::

    v0 = add(c0, c1)           b0 = fold_barrier(v0)   # v0 folds under the barrier
    v1 = multiply(b0, c1)      # downstream of a barrier: must never fold
    v2 = exp(v1)               # downstream too
    v3 = subtract(x, v0)       # run-time
    main(x) = (v0, b0, v1, v2, v3)

Properties (guarantees 1 to 4):

* after our pass, and after a later stock ``FoldConstant``, the number of barriers is unchanged and
  the calls downstream of a barrier are all still there (the same multiset of ops);
* our pass leaves no call that could have folded: every remaining call other than a barrier
  reads ``x`` or a barrier somewhere upstream;
* without annotations, our pass is structurally equal to stock ``FoldConstant()``;
* the built module gives bit-identical outputs before annotation and after our pass (the ops are
  evaluated the same way at fold time and at run time, and nothing is reassociated);
* the input is never mutated; the pass is deterministic and idempotent.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relay
from tvm.contrib import graph_executor

import fold_guard.relay as fgr

TARGET = tvm.target.Target(
    "llvm -mtriple=x86_64-linux-gnu"
)  # hhb's default "llvm" triple is riscv64
SHAPE = (2, 3)
BINARY = (relay.add, relay.multiply, relay.subtract, relay.maximum)
UNARY = (relay.negative, relay.exp)
OPS = BINARY + UNARY
X = np.array([[0.5, -1.0, 2.0], [-0.25, 1.5, 0.0]], dtype="float32")
STOCK = relay.transform.FoldConstant()

# One step: (op index, left operand choice, right operand choice, barrier?, allow if 0)
_STEP = st.tuples(
    st.integers(0, len(OPS) - 1),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 16),
    st.booleans(),
    st.integers(0, 5),  # 0 means: wrap in fold_allow (about one step in six)
)
_SPEC = st.tuples(
    st.lists(
        st.lists(st.integers(-3, 3), min_size=6, max_size=6), min_size=1, max_size=3
    ),  # constants
    st.lists(_STEP, min_size=1, max_size=8),
)
Spec = tuple[list[list[int]], list[tuple[int, int, int, bool, int]]]


def build(spec: Spec, *, annotate: bool = True) -> tvm.IRModule:
    """The module a spec describes; ``annotate=False`` gives the same DAG without annotations."""
    constants, steps = spec
    x = relay.var("x", shape=SHAPE, dtype="float32")
    pool: list[relay.Expr] = [
        relay.const(np.array(c, dtype="float32").reshape(SHAPE)) for c in constants
    ] + [x]
    outputs: list[relay.Expr] = []
    for op, left, right, barrier, allow in steps:
        a, b = pool[left % len(pool)], pool[right % len(pool)]
        value = OPS[op](a, b) if OPS[op] in BINARY else OPS[op](a)
        outputs.append(value)
        if annotate and allow == 0:
            value = fgr.fold_allow(value)
            outputs.append(value)
        if annotate and barrier:
            value = fgr.fold_barrier(value)
            outputs.append(value)
        pool.append(value)
    body = relay.Tuple(outputs)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))


# ----------------------------------------------------------------------------------- helpers


def _op_name(expr: relay.Expr) -> str:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return ""


def _facts(mod: tvm.IRModule) -> tuple[int, Counter, list[str]]:
    """(number of barriers, multiset of ops downstream of a barrier, calls that could have folded).

    A call is *downstream* when one of its arguments is a barrier or downstream; it is *live*
    when it reads ``x`` or is downstream. A call that is neither a barrier nor live has only
    constants upstream and no barrier in the way, so our default-policy pass must have folded it.
    """
    downstream: dict[relay.Expr, bool] = {}
    live: dict[relay.Expr, bool] = {}
    barriers = 0
    below: Counter = Counter()
    foldable: list[str] = []

    def visit(node: relay.Expr) -> None:
        nonlocal barriers
        if isinstance(node, relay.Var):
            live[node] = True
            return
        if isinstance(node, relay.Tuple):
            live[node] = any(live.get(f, False) for f in node.fields)
            downstream[node] = any(downstream.get(f, False) for f in node.fields)
            return
        if not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op):
            return
        args = list(node.args)
        if node.op.name == "fold_barrier":
            barriers += 1
            downstream[node] = live[node] = True
            return
        downstream[node] = any(downstream.get(a, False) for a in args)
        live[node] = downstream[node] or any(live.get(a, False) for a in args)
        if downstream[node]:
            below[node.op.name] += 1
        if not live[node]:
            foldable.append(node.op.name)

    relay.analysis.post_order_visit(mod["main"], visit)
    return barriers, below, foldable


def _run(mod: tvm.IRModule) -> list[np.ndarray]:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    runtime = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runtime.set_input(x=X)
    runtime.run()
    return [runtime.get_output(i).numpy() for i in range(runtime.get_num_outputs())]


def _outputs_without_annotations(spec: Spec) -> list[int]:
    """Index map: for each output of the annotated module, the output of the plain one it equals."""
    index: list[int] = []
    for plain, (_op, _left, _right, barrier, allow) in enumerate(spec[1]):
        index.extend([plain] * (1 + (allow == 0) + bool(barrier)))
    return index


def _assert_unchanged(mod: tvm.IRModule, saved: str) -> None:
    """Guarantee 4 (structurally; test_annotations.py checks the ``save_json`` text byte for byte)."""
    tvm.ir.assert_structural_equal(mod, tvm.ir.load_json(saved), map_free_vars=True)


_SETTINGS = settings(
    max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------------------------- properties


@_SETTINGS
@given(_SPEC)
def test_barriers_hold_and_the_pass_is_pure(spec: Spec) -> None:
    mod = build(spec)
    saved = tvm.ir.save_json(mod)
    barriers, below, _ = _facts(mod)

    ours = fgr.FoldConstant()(mod)
    _assert_unchanged(mod, saved)
    after_barriers, after_below, foldable = _facts(ours)
    assert after_barriers == barriers
    assert after_below == below, "a call downstream of a barrier was folded"
    assert foldable == [], f"calls left that should have folded: {foldable}"

    # Guarantee 3: a later stock pass keeps every barrier and everything below it.
    stock_after = STOCK(ours)
    stock_barriers, stock_below, _ = _facts(stock_after)
    assert (stock_barriers, stock_below) == (barriers, below)
    tvm.ir.assert_structural_equal(stock_after, ours, map_free_vars=True)

    # Idempotence and determinism (guarantee 4).
    tvm.ir.assert_structural_equal(fgr.FoldConstant()(ours), ours, map_free_vars=True)
    again = fgr.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(again, ours, map_free_vars=True)
    first, second = fgr.plan(mod), fgr.plan(mod)
    assert [(d.label, d.op, d.action, d.reason) for d in first.decisions] == [
        (d.label, d.op, d.action, d.reason) for d in second.decisions
    ]


@pytest.mark.slow
@_SETTINGS
@given(_SPEC)
def test_without_annotations_ours_is_stock(spec: Spec) -> None:
    plain = build(spec, annotate=False)
    tvm.ir.assert_structural_equal(
        fgr.FoldConstant()(plain), STOCK(build(spec, annotate=False)), map_free_vars=True
    )


@pytest.mark.slow
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_SPEC)
def test_built_outputs_match_the_unannotated_module(spec: Spec) -> None:
    reference = _run(build(spec, annotate=False))
    ours = fgr.FoldConstant()(build(spec))
    outputs = _run(ours)
    index = _outputs_without_annotations(spec)
    assert len(outputs) == len(index)
    for k, (got, source) in enumerate(zip(outputs, index)):
        # Bit-identical: the same kernels compute the same values at fold time and at run time.
        np.testing.assert_array_equal(got, reference[source], err_msg=f"output {k}")


# ------------------------------------------------------------------ the examples in the docstring


def _docstring_spec() -> Spec:
    # c0 = [0..5], c1 = 2s; pool: c0, c1, x, then each step's (annotated) value.
    constants = [[0, 1, 2, 3, -1, -2], [2, 2, 2, 2, 2, 2]]
    steps = [
        (0, 0, 1, True, 1),  # v0 = add(c0, c1); b0 = barrier(v0)        -> pool[3] = b0
        (1, 3, 1, False, 1),  # v1 = multiply(b0, c1)                    -> pool[4]
        (5, 4, 0, False, 1),  # v2 = exp(v1)                             -> pool[5]
        (2, 2, 3, False, 1),  # v3 = subtract(x, b0)                     -> pool[6]
    ]
    return constants, steps


def test_docstring_example():
    """The shape the module docstring draws: the operand folds, nothing below the barrier does."""
    spec = _docstring_spec()
    mod = build(spec)
    assert _facts(mod) == (1, Counter({"multiply": 1, "exp": 1, "subtract": 1}), ["add"])
    ours = fgr.FoldConstant(strict=True)(mod)
    assert _facts(ours) == (1, Counter({"multiply": 1, "exp": 1, "subtract": 1}), [])
    np.testing.assert_array_equal(_run(ours)[0], np.array([[2, 3, 4], [5, 1, 0]], dtype="float32"))


def test_facts_detect_a_fold_below_a_barrier():
    """The checker itself can fail: stock folding through a plain op changes the downstream count."""
    constants, _ = _docstring_spec()
    x = relay.var("x", shape=SHAPE, dtype="float32")
    c0 = relay.const(np.array(constants[0], dtype="float32").reshape(SHAPE))
    below = relay.multiply(fgr.fold_barrier(c0), c0)
    annotated = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([below, x])))
    )
    _, before_below, _ = _facts(annotated)
    # Remove the barrier by hand, as a pass that ignored it would, and fold with stock.
    stripped = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([relay.multiply(c0, c0), x])))
    )
    _, stripped_below, foldable = _facts(STOCK(stripped))
    assert (
        before_below == Counter({"multiply": 1}) and stripped_below == Counter() and foldable == []
    )
