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
from ._lower import is_primitive, is_true, postorder

__all__ = ["rewrite_function"]


def _is_simple_constant(expr: relay.Expr) -> bool:
    return isinstance(expr, relay.Constant)


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
    body = new[func.body]
    if body.same_as(func.body):
        return func
    return relay.Function(list(func.params), body, func.ret_type, func.type_params, func.attrs, func.span)


def _rebuild(
    expr: relay.Expr,
    new: Mapping[relay.Expr, relay.Expr],
    let_value: Mapping[relay.Var, relay.Expr],
    node_of_call: Mapping[relay.Call, int],
    plan: FoldPlan,
    values: Mapping[int, relay.Expr],
) -> relay.Expr:
    if isinstance(expr, relay.Var):
        bound = let_value.get(expr)
        if bound is not None and _is_simple_constant(new[bound]):
            return new[bound]
        return expr
    if isinstance(expr, relay.Call):
        node = node_of_call.get(expr)
        if node is not None and plan.folds(node):
            return values[node]
        op = expr.op if isinstance(expr.op, tvm.ir.Op) else new[expr.op]
        args = [new[arg] for arg in expr.args]
        if op.same_as(expr.op) and all(a.same_as(b) for a, b in zip(args, expr.args)):
            return expr
        return relay.Call(op, args, expr.attrs, expr.type_args, expr.span)
    if isinstance(expr, relay.Tuple):
        fields = [new[field] for field in expr.fields]
        if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
            return expr
        return relay.Tuple(fields, expr.span)
    if isinstance(expr, relay.TupleGetItem):
        tup = new[expr.tuple_value]
        if isinstance(tup, relay.Tuple):
            return tup.fields[expr.index]
        return expr if tup.same_as(expr.tuple_value) else relay.TupleGetItem(tup, expr.index)
    if isinstance(expr, relay.Let):
        value = new[expr.value]
        body = new[expr.body]
        if _is_simple_constant(value):
            return body
        if value.same_as(expr.value) and body.same_as(expr.body):
            return expr
        return relay.Let(expr.var, value, body)
    if isinstance(expr, relay.If):
        cond = new[expr.cond]
        if isinstance(cond, relay.Constant):
            return new[expr.true_branch] if is_true(cond) else new[expr.false_branch]
        parts = (cond, new[expr.true_branch], new[expr.false_branch])
        if all(a.same_as(b) for a, b in zip(parts, (expr.cond, expr.true_branch, expr.false_branch))):
            return expr
        return relay.If(*parts)
    if isinstance(expr, relay.Function):
        if is_primitive(expr):  # stock folds nothing inside
            return expr
        body = new[expr.body]
        if body.same_as(expr.body):
            return expr
        return relay.Function(list(expr.params), body, expr.ret_type, expr.type_params, expr.attrs, expr.span)
    return expr


def substitute_calls(func: relay.Function, wrap: Mapping[relay.Call, Callable[[relay.Expr], relay.Expr]]) -> relay.Function:
    """``func`` with each call in ``wrap`` replaced by ``wrap[call](call)`` (operands rebuilt first).

    Nothing else changes: no folding and none of stock's let / tuple / if simplifications.
    """
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        rebuilt = _rebuild_plain(expr, new)
        new[expr] = wrap[expr](rebuilt) if isinstance(expr, relay.Call) and expr in wrap else rebuilt
    body = new[func.body]
    if body.same_as(func.body):
        return func
    return relay.Function(list(func.params), body, func.ret_type, func.type_params, func.attrs, func.span)


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
        return relay.Function(list(expr.params), rebuilt[0], expr.ret_type, expr.type_params, expr.attrs, expr.span)
    return expr


def remap_global_vars(func: relay.Function, mapping: Mapping[relay.GlobalVar, relay.GlobalVar]) -> relay.Function:
    """A new ``func`` (always a new object) whose references to global functions go through ``mapping``."""
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        new[expr] = mapping.get(expr, expr) if isinstance(expr, relay.GlobalVar) else _rebuild_plain(expr, new)
    return relay.Function(list(func.params), new[func.body], func.ret_type, func.type_params, func.attrs, func.span)
