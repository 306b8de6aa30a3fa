"""Apply a plan to Relay functions, rebuilding them the way stock ``FoldConstant`` does.

Folded calls become their values. Independently of the plan, and exactly as stock does, a
let-binding whose value became a constant is inlined and dropped, ``TupleGetItem`` of a literal
tuple becomes the field, and an ``If`` on a constant condition becomes the chosen branch.
Primitive functions are left alone. The walk is iterative (deep graphs exceed Python's recursion
limit) and never mutates its input.
"""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Sequence

import tvm
from tvm import relay

from .._core.planner import FoldPlan
from ._lower import children as expr_children
from ._lower import is_true, postorder

__all__ = ["rewrite_function"]


def rewrite_function(
    func: relay.Function,
    node_of_call: Mapping[relay.Call, int],
    plan: FoldPlan,
    values: Mapping[int, relay.Expr],
) -> relay.Function:
    """``func`` with every folded call replaced by its value (a new function; ``func`` is unchanged)."""
    let_value: Dict[relay.Var, relay.Expr] = {}
    new: Dict[relay.Expr, relay.Expr] = {}

    def children(expr: relay.Expr) -> Sequence[relay.Expr]:
        if isinstance(expr, relay.Let):
            let_value[expr.var] = expr.value
        return expr_children(expr)

    for expr in postorder(func.body, children):
        new[expr] = _rebuild(expr, new, let_value, node_of_call, plan, values)
    return _with_body(func, new[func.body])


def _rebuild(
    expr: relay.Expr,
    new: Mapping[relay.Expr, relay.Expr],
    let_value: Mapping[relay.Var, relay.Expr],
    node_of_call: Mapping[relay.Call, int],
    plan: FoldPlan,
    values: Mapping[int, relay.Expr],
) -> relay.Expr:
    """Stock's rewrites of ``expr`` (operands already rebuilt in ``new``), else a plain rebuild."""
    if isinstance(expr, relay.Var):
        bound = let_value.get(expr)
        if bound is not None and isinstance(new[bound], relay.Constant):
            return new[bound]  # stock inlines a let-bound constant
        return expr
    if isinstance(expr, relay.Call):
        node = node_of_call.get(expr)
        if node is not None and plan.folds(node):
            return values[node]
    elif isinstance(expr, relay.TupleGetItem):
        tup = new[expr.tuple_value]
        if isinstance(tup, relay.Tuple):
            return tup.fields[expr.index]
    elif isinstance(expr, relay.Let):
        if isinstance(new[expr.value], relay.Constant):
            return new[expr.body]  # the binding was inlined at every use
    elif isinstance(expr, relay.If):
        cond = new[expr.cond]
        if isinstance(cond, relay.Constant):
            return new[expr.true_branch] if is_true(cond) else new[expr.false_branch]
    return _rebuild_plain(expr, new)


def substitute_calls(func: relay.Function, wrap: Mapping[relay.Call, Callable[[relay.Expr], relay.Expr]]) -> relay.Function:
    """``func`` with each call in ``wrap`` replaced by ``wrap[call](call)`` (operands rebuilt first).

    Nothing else changes: no folding and none of stock's let / tuple / if simplifications.
    """
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        rebuilt = _rebuild_plain(expr, new)
        new[expr] = wrap[expr](rebuilt) if isinstance(expr, relay.Call) and expr in wrap else rebuilt
    return _with_body(func, new[func.body])


def _rebuild_plain(expr: relay.Expr, new: Mapping[relay.Expr, relay.Expr]) -> relay.Expr:
    parts = expr_children(expr)
    rebuilt = [new[part] for part in parts]
    if all(a.same_as(b) for a, b in zip(rebuilt, parts)):
        return expr
    if isinstance(expr, relay.Call):
        op = expr.op if isinstance(expr.op, tvm.ir.Op) else rebuilt.pop(0)
        return relay.Call(op, rebuilt, expr.attrs, expr.type_args, expr.span)
    if isinstance(expr, relay.Tuple):
        return relay.Tuple(rebuilt, expr.span)
    if isinstance(expr, relay.TupleGetItem):
        return relay.TupleGetItem(rebuilt[0], expr.index)
    if isinstance(expr, relay.Let):
        return relay.Let(expr.var, rebuilt[0], rebuilt[1])
    if isinstance(expr, relay.If):
        return relay.If(*rebuilt)
    if isinstance(expr, relay.Function):
        return _new_function(expr, rebuilt[0])
    return expr


def _new_function(func: relay.Function, body: relay.Expr) -> relay.Function:
    return relay.Function(list(func.params), body, func.ret_type, func.type_params, func.attrs, func.span)


def _with_body(func: relay.Function, body: relay.Expr) -> relay.Function:
    return func if body.same_as(func.body) else _new_function(func, body)


def remap_global_vars(func: relay.Function, mapping: Mapping[relay.GlobalVar, relay.GlobalVar]) -> relay.Function:
    """A new ``func`` (always a new object) whose references to global functions go through ``mapping``."""
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        new[expr] = mapping.get(expr, expr) if isinstance(expr, relay.GlobalVar) else _rebuild_plain(expr, new)
    return _new_function(func, new[func.body])  # always a new object: no GlobalVar may reach ``func``
