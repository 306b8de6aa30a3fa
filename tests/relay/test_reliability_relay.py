"""Reliability defects of the Relay adapter found by a hostile-input review.

Each test failed on the code before its fix; the docstring says what broke.

White-box on purpose: it tests the Relay engine's evaluation (``_engine.evaluate``), a fault
injected into it, a private mechanism.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from relay_ir import op_calls
from support.reliability import check_concurrent_like_sequential
from tvm import relay

import fold_guard
import fold_guard.relay as fgr
from fold_guard import Reason
from fold_guard.relay._engine import evaluate as _evaluate

SHAPE = (2, 3)
A = np.arange(6, dtype="float32").reshape(SHAPE)


def _x(name: str = "x", shape=SHAPE) -> relay.Var:
    return relay.var(name, shape=shape, dtype="float32")


def _two_functions() -> tvm.IRModule:
    """``main`` and ``main2``, each ``add(x, exp(A))``: the exp of each folds."""
    mod = tvm.IRModule()
    for name in ("main", "main2"):
        x = _x()
        mod[name] = relay.Function([x], relay.add(x, relay.exp(relay.const(A))))
    return relay.transform.InferType()(mod)


@pytest.mark.parametrize(
    "entry",
    [
        lambda mod, functions: fgr.fold(mod, functions=functions).mod,
        lambda mod, functions: fgr.FoldConstant(functions=functions)(mod),
    ],
    ids=["fold", "FoldConstant"],
)
def test_functions_given_as_one_string_names_one_function(entry):
    """``functions="main"`` was iterated per character (``'m'`` is not a function). One string
    now names one function, as ``["main"]`` does."""
    mod = _two_functions()
    folded = entry(mod, "main")
    tvm.ir.assert_structural_equal(folded, entry(mod, ["main"]))
    assert not op_calls(folded["main"], "exp") and len(op_calls(folded["main2"], "exp")) == 1


@pytest.mark.parametrize("functions", [3, ["main", 3]], ids=["int", "list-with-int"])
def test_functions_of_the_wrong_type_are_refused(functions):
    with pytest.raises(fold_guard.PreconditionError, match=r"functions must"):
        fgr.fold(_two_functions(), functions=functions)


def test_primitive_functions_are_left_as_stock_leaves_them():
    """Stock never folds inside a global function with the ``Primitive`` attribute; ours did.

    @fused (Primitive=1): add(p, exp(A))   ==> unchanged (stock skips it)
    @main:                 add(x, exp(A))   ==> add(x, <const>)
    """
    p = _x("p")
    fused = relay.Function([p], relay.add(p, relay.exp(relay.const(A)))).with_attr(
        "Primitive", tvm.tir.IntImm("int32", 1)
    )
    mod = tvm.IRModule()
    mod["fused"] = fused
    x = _x()
    mod["main"] = relay.Function([x], relay.add(x, relay.exp(relay.const(A))))
    mod = relay.transform.InferType()(mod)
    ours, stock = fgr.fold(mod).mod, relay.transform.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(ours, stock)
    assert len(op_calls(ours["fused"], "exp")) == 1 and not op_calls(ours["main"], "exp")


def _split_module(annotate) -> tvm.IRModule:
    """``main(x) = add(x, TupleGetItem(annotate(split(A, 2, axis=1)), 0))``: a tuple-typed operand."""
    x = _x(shape=(2, 1))
    parts = relay.split(relay.const(A[:, :2]), 2, axis=1).astuple()
    body = relay.add(x, relay.TupleGetItem(annotate(parts), 0))
    return tvm.IRModule.from_expr(relay.Function([x], body))


@pytest.mark.parametrize("annotate", [fgr.fold_barrier, fgr.fold_allow], ids=["barrier", "allow"])
def test_annotation_over_a_tuple_is_refused(annotate):
    """A barrier over ``split(...).astuple()`` passed our pass and then ``relay.build`` failed;
    an allow over it crashed the stock pass. Both are refused now, naming the annotation, and
    the builder refuses a literal ``relay.Tuple``."""
    mod = _split_module(annotate)
    saved = tvm.ir.save_json(mod)
    for entry in (lambda m: fgr.fold(m), lambda m: fgr.plan(m), lambda m: fgr.FoldConstant()(m)):
        with pytest.raises(
            fold_guard.UnsupportedIRError,
            match=r"function main: %\d+ = fold_(barrier|allow) annotates tensors only, but its operand is a TupleType",
        ):
            entry(mod)
    assert tvm.ir.save_json(mod) == saved
    with pytest.raises(
        fold_guard.UnsupportedIRError,
        match=r"annotates tensors only, got a relay.Tuple of 2 fields",
    ):
        annotate(relay.Tuple([relay.const(A), relay.const(A)]))


def test_python_exception_from_a_kernel_is_an_evaluation_failure(monkeypatch):
    """Only ``TVMError`` was caught around evaluation: a Python ``TypeError`` raised while running
    a kernel escaped even with ``strict=False``. Now it keeps the call (evaluation failed) and
    the rest still folds; ``strict=True`` raises FoldNotPossibleError chained to it."""
    real_run = _evaluate._run

    def run(exprs):
        if any(isinstance(e, relay.Call) and e.op.name == "exp" for e in exprs):
            raise TypeError("a kernel's Python callback failed")
        return real_run(exprs)

    monkeypatch.setattr(_evaluate, "_run", run)
    x = _x()
    mod = tvm.IRModule.from_expr(
        relay.Function(
            [x], relay.add(relay.add(x, relay.exp(relay.const(A))), relay.negative(relay.const(A)))
        )
    )
    result = fgr.fold(mod)
    reasons = {d.op: d.reason for d in result.plan.decisions}
    assert reasons["exp"] is Reason.EVAL_FAILED and reasons["negative"] is Reason.FOLDED
    (exp,) = [d for d in result.plan.decisions if d.op == "exp"]
    assert "TypeError: a kernel's Python callback failed" in exp.detail
    assert len(op_calls(result.mod, "exp")) == 1 and not op_calls(result.mod, "negative")
    with pytest.raises(
        fold_guard.FoldNotPossibleError, match=r"evaluating %\d+ = exp failed: TypeError"
    ) as info:
        fgr.fold(mod, strict=True)
    assert isinstance(info.value.__cause__, TypeError)


def _qnn_module(rows: int) -> tvm.IRModule:
    """``dense(x, dequantize(quantize(W)))`` with an allow on the weight, distinct per ``rows``."""
    x = relay.var("x", shape=(2, 4), dtype="float32")
    weight = relay.const(np.linspace(-1, 1, rows * 4, dtype="float32").reshape(rows, 4))
    scale, zero = relay.const(np.float32(0.01)), relay.const(0)
    q = fgr.fold_allow(relay.qnn.op.quantize(weight, scale, zero, out_dtype="int8"))
    w = relay.qnn.op.dequantize(q, scale, zero)
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, relay.exp(w))))


@pytest.mark.slow
def test_eight_threads_fold_like_one():
    """Eight threads at once (four distinct modules, one module shared by four threads) give the
    sequential results, no error, and leave every input as it was (fold_guard/_tvm/serial.py)."""
    distinct = [_qnn_module(rows) for rows in (3, 5, 6, 7)]
    entries = [
        lambda mod: fgr.fold(mod, policy="keep-qdq-weights").mod,
        lambda mod: fgr.FoldConstant("fold-qnn")(mod),
        lambda mod: fgr.annotate(mod, policy="keep-qdq-weights").mod,
    ]
    check_concurrent_like_sequential(entries, distinct + [_qnn_module(9)] * 4)


def test_raising_policy_rule_names_policy_rule_and_call():
    rule = fold_guard.Rule("keep-exp", fold_guard.Action.KEEP, "exp stays", lambda call: 1 / 0)
    policy = fold_guard.FoldPolicy("my-npu", "a backend's policy", (rule,))
    x = _x()
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, relay.exp(relay.const(A)))))
    for entry in (lambda m: fgr.fold(m, policy=policy), lambda m: fgr.plan(m, policy)):
        with pytest.raises(
            fold_guard.PolicyRuleError,
            match=r"policy 'my-npu', rule 'keep-exp', on main: %\d+ = exp: the predicate raised ZeroDivisionError",
        ):
            entry(mod)


@pytest.mark.parametrize("allow", [False, True], ids=["default", "fold_allow"])
def test_multi_gib_fold_is_refused_by_the_budget(allow):
    """``max_fold_bytes`` refuses a 4 GiB ``broadcast_to`` of a scalar from its type (reason
    "over budget"), also inside fold_allow, in well under a second; the small exp still folds."""
    import time

    huge = (1 << 15, 1 << 15)
    x = relay.var("x", shape=huge, dtype="float32")
    big = relay.broadcast_to(relay.const(np.float32(2.0)), huge)
    big = fgr.fold_allow(big) if allow else big
    body = relay.add(relay.add(x, big), relay.sum(relay.exp(relay.const(np.ones(4, "float32")))))
    mod = tvm.IRModule.from_expr(relay.Function([x], body))
    start = time.perf_counter()
    result = fgr.fold(mod, max_fold_bytes=1 << 20)
    assert time.perf_counter() - start < 5.0
    reasons = {d.op: d.reason for d in result.plan.decisions}
    assert reasons["broadcast_to"] is Reason.OVER_BUDGET and reasons["exp"] is Reason.FOLDED
    assert len(op_calls(result.mod, "broadcast_to")) == 1
    folded = fgr.FoldConstant(policy=["default", fold_guard.memory_budget(1 << 20)])(mod)
    assert len(op_calls(folded, "broadcast_to")) == 1
