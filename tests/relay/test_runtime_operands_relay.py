"""Relay has no counterpart of Relax's fold on run-time operands (RFC.md, guarantee 1).

Relax's stock pass legalizes first and folds a kernel whose arguments are all constants, so
``zeros_like(x)`` of a run-time ``x`` folds there. Relay's stock ``FoldConstant`` (0.16) decides
constness on the graph: a call folds only when every argument is a constant (and ``shape_of`` /
``ndarray_size`` of a static type, which fold_guard mirrors). So the same calls stay::

    %1 = zeros_like(exp(%x))                 stays (its argument is not a constant)
    %2 = ones_like(%x); full_like(%x, 1.5f)  stay
    %3 = collapse_sum_like(<const>, %y)      stays
    shape_of(%x)                             folds (static type)
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relay

import fold_guard.relay as fgr


def _module() -> tvm.IRModule:
    x = relay.var("x", shape=(4, 4), dtype="float32")
    y = relay.var("y", shape=(1, 4), dtype="float32")
    c = relay.const(np.arange(8, dtype="float32").reshape(2, 4))
    body = relay.Tuple(
        [
            relay.add(x, relay.zeros_like(relay.exp(x))),
            relay.add(x, relay.ones_like(x)),
            relay.add(x, relay.full_like(x, relay.const(1.5))),
            relay.add(y, relay.collapse_sum_like(c, y)),
            relay.shape_of(x),
        ]
    )
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], body)))


def _ops(mod: tvm.IRModule) -> set:
    found = set()
    relay.analysis.post_order_visit(
        mod["main"],
        lambda node: (
            found.add(node.op.name)
            if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)
            else None
        ),
    )
    return found


def test_calls_on_run_time_operands_stay_as_in_stock():
    mod = _module()
    stock = relay.transform.FoldConstant()(mod)
    like = {"zeros_like", "ones_like", "full_like", "collapse_sum_like"}
    assert like <= _ops(stock) and "shape_of" not in _ops(stock)  # Relay's stock behaviour
    result = fgr.fold(mod)
    assert tvm.ir.structural_equal(result.mod, stock)
    kept = {d.op for d in result.plan.decisions if d.reason.text == "not constant"}
    assert like <= kept, result.plan.explain()
