"""``on_device`` annotations: fold_guard looks through them exactly where stock ``FoldConstant`` does.

``on_device(e)`` (what PlanDevices reads and writes) is identity at run time. Stock folding
(``fold_constant.cc``, ``AsIgnoringOnDevice``) treats ``on_device(<const>)`` as a constant and
``on_device(<tuple>)`` as a tuple, one level deep, and keeps the annotation where the value
goes: a let-bound ``on_device(<const>)`` is inlined whole at every use, and
``on_device((a, b)).0`` becomes ``on_device(a)``. A call that folds takes the annotations on its
operands with it; an annotation around a folded call stays around its constant. The corpus
(``corpus.py``, section "Device annotations") compares ours with stock on more forms; here are
golden modules written out by hand, and how on_device meets the annotations of fold_guard.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from corpus import on_cpu
from test_annotations import STOCK, check_before_after
from tvm import relay

import fold_guard.relay as fgr
from fold_guard import Reason

ONE = np.ones((1,), dtype="float32")
C = np.array([0.5, -1.0, 2.0, 4.0], dtype="float32")
D = np.array([2.0, 0.25, -3.0, 1.0], dtype="float32")


def _module(params: list[relay.Var], body: relay.Expr) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))


def _both_fold_to(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    """Ours and stock give ``expected``; neither output is the input (something did fold)."""
    assert not tvm.ir.structural_equal(before, expected, map_free_vars=True)
    check_before_after(before, expected, fgr.FoldConstant(strict=True))
    check_before_after(before, expected, STOCK)


# ------------------------------------------------------------------ let-bound, as PlanDevices leaves it


def let_chain(x: relay.Var) -> tvm.IRModule:
    sb = relay.ScopeBuilder()
    one = sb.let("one", on_cpu(relay.const(ONE)))  # a constant under on_device: inlined with it
    two = sb.let("two", on_cpu(relay.add(one, one)))  # folds (its operands are constants)
    y = sb.let("y", on_cpu(relay.add(two, x)))  # stays: x is a run-time input
    sb.ret(y)
    return _module([x], sb.get())


def test_let_bound_add_under_on_device_folds_as_stock() -> None:
    """
    let one = on_device(1f); let two = on_device(one + one); let y = on_device(two + x); y
        ==>  let y = on_device(on_device(2f) + x); y
    """
    x = relay.var("x", shape=(1,), dtype="float32")
    sb = relay.ScopeBuilder()
    y = sb.let("y", on_cpu(relay.add(on_cpu(relay.const(ONE + ONE)), x)))
    sb.ret(y)
    _both_fold_to(let_chain(x), _module([x], sb.get()))


def test_let_chain_decisions_name_the_bindings() -> None:
    """on_device is no call to decide: the plan has the two adds, named by the let that binds them."""
    plan = fgr.plan(let_chain(relay.var("x", shape=(1,), dtype="float32")))
    assert [(d.op, d.label, d.reason) for d in plan.decisions] == [
        ("add", "%two", Reason.FOLDED),
        ("add", "%y", Reason.NOT_CONSTANT),
    ]


# ------------------------------------------------------------------------------ graph form

CONSTRAINTS = [
    {"constrain_result": True, "constrain_body": True},
    {"constrain_result": True, "constrain_body": False},
    {"constrain_result": False, "constrain_body": True},
]


@pytest.mark.parametrize(
    "flags",
    CONSTRAINTS,
    ids=[f"result={f['constrain_result']},body={f['constrain_body']}" for f in CONSTRAINTS],
)
def test_graph_form_folds_through_on_device(flags) -> None:
    """
    x + on_device(on_device(C) * D)  ==>  x + on_device(<C * D>)     (the outer one stays)
    """
    x = relay.var("x", shape=(4,), dtype="float32")
    before = _module(
        [x],
        relay.add(
            x, on_cpu(relay.multiply(on_cpu(relay.const(C), **flags), relay.const(D)), **flags)
        ),
    )
    expected = _module([x], relay.add(x, on_cpu(relay.const(C * D), **flags)))
    _both_fold_to(before, expected)


def test_tuple_under_on_device_gives_annotated_fields() -> None:
    """
    t = on_device((C, C * D, x)); t.1 - t.0 + t.2  ==>  <C*D - C> + x
    (t.1 is on_device(<C*D>), t.0 is on_device(C): both constants, so the subtract folds; t.2 is x)
    """
    x = relay.var("x", shape=(4,), dtype="float32")
    tup = on_cpu(relay.Tuple([relay.const(C), relay.multiply(relay.const(C), relay.const(D)), x]))
    body = relay.add(
        relay.subtract(relay.TupleGetItem(tup, 1), relay.TupleGetItem(tup, 0)),
        relay.TupleGetItem(tup, 2),
    )
    _both_fold_to(_module([x], body), _module([x], relay.add(relay.const(C * D - C), x)))


def test_nested_on_device_is_not_a_constant() -> None:
    """Stock sees through one on_device only: x * (on_device(on_device(C)) + D) stays as it is."""
    x = relay.var("x", shape=(4,), dtype="float32")
    nested = on_cpu(on_cpu(relay.const(C)), constrain_result=False)
    before = _module([x], relay.multiply(x, relay.add(nested, relay.const(D))))
    check_before_after(before, before, fgr.FoldConstant(strict=True))
    check_before_after(before, before, STOCK)


# ------------------------------------------------------------- with fold_barrier / fold_allow


def test_barrier_under_on_device_still_holds() -> None:
    """
    x + on_device(fold_barrier(C * D)) - D  ==>  x + on_device(fold_barrier(<C*D>)) - D
    (the on_device is no way around the barrier: the subtract does not fold; a later stock pass agrees)
    """
    x = relay.var("x", shape=(4,), dtype="float32")

    def module(weight: relay.Expr) -> tvm.IRModule:
        return _module(
            [x], relay.add(x, relay.subtract(on_cpu(fgr.fold_barrier(weight)), relay.const(D)))
        )

    expected = module(relay.const(C * D))
    after = check_before_after(
        module(relay.multiply(relay.const(C), relay.const(D))),
        expected,
        fgr.FoldConstant(strict=True),
    )
    check_before_after(after, expected, STOCK)


def test_on_device_under_barrier_folds_its_operand() -> None:
    """fold_barrier(on_device(C * D)) * x  ==>  fold_barrier(on_device(<C*D>)) * x"""
    x = relay.var("x", shape=(4,), dtype="float32")
    before = _module(
        [x],
        relay.multiply(fgr.fold_barrier(on_cpu(relay.multiply(relay.const(C), relay.const(D)))), x),
    )
    expected = _module([x], relay.multiply(fgr.fold_barrier(on_cpu(relay.const(C * D))), x))
    check_before_after(before, expected, fgr.FoldConstant(strict=True))


def test_allow_around_on_device_keeps_the_device_hint() -> None:
    """
    qnn.dense(x, fold_allow(on_device(qnn.quantize(W))))  ==>  qnn.dense(x, on_device(<int8 W>))
    (the allow goes once its operand is a constant; the device hint on that operand stays)
    """
    weight = np.array([[1.0, -0.5, 2.0, 0.0], [-1.5, 0.5, 1.0, -2.0]], dtype="float32")
    x = relay.var("x", shape=(2, 4), dtype="int8")
    scale, zero = relay.const(0.5), relay.const(0)

    def module(w: relay.Expr) -> tvm.IRModule:
        return _module([x], relay.qnn.op.dense(x, w, zero, zero, scale, scale, units=2))

    quantized = relay.qnn.op.quantize(relay.const(weight), scale, zero, out_dtype="int8")
    expected = module(on_cpu(relay.const((weight / 0.5).astype("int8"))))
    check_before_after(
        module(fgr.fold_allow(on_cpu(quantized))), expected, fgr.FoldConstant(strict=True)
    )
