"""Messages name calls the way the module does: let-bound calls by their variable.

    let %w_q = exp(W);            ==>  "%w_q = exp: folded"
    let %y = add(%x, %w_q);       ==>  "%y = add: not constant: 'x' is a run-time input"
    add(%2, ...)  (graph form)    ==>  "%<node id>"

ToANormalForm names every binding ``x``; repeated names fall back to node ids so that no two
decisions share a label.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relay

import fold_guard.relay as fgr

W = relay.const(np.ones(2, "float32"))


def test_let_bound_calls_are_named_by_their_variable() -> None:
    x, w_q, y = relay.var("x", shape=(2,)), relay.var("w_q"), relay.var("y")
    func = relay.Function([x], relay.Let(w_q, relay.exp(W), relay.Let(y, relay.add(x, w_q), y)))
    plan = fgr.plan(tvm.IRModule.from_expr(func))
    assert [str(d) for d in plan.decisions] == [
        "%w_q = exp: folded [default]",
        "%y = add: not constant: 'x' is a run-time input",
    ]


def test_repeated_names_fall_back_to_node_ids() -> None:
    x = relay.var("x", shape=(2,))
    graph_form = relay.Function([x], relay.add(relay.multiply(x, relay.exp(W)), relay.negative(W)))
    mod = relay.transform.ToANormalForm()(tvm.IRModule.from_expr(graph_form))
    labels = [d.label for d in fgr.plan(mod).decisions]
    assert len(labels) == 4 and len(set(labels)) == 4, labels
    assert all(label.startswith("%") for label in labels)
