"""Apply a plan to Relay functions, rebuilding them the way stock ``FoldConstant`` does.

Folded calls become their values. Independently of the plan, and exactly as stock does, a
let-binding whose value became a constant is inlined and dropped, ``TupleGetItem`` of a literal
tuple becomes the field, and an ``If`` on a constant condition becomes the chosen branch. Each
of these looks through one ``on_device`` and keeps it: a let-bound ``on_device(<const>)`` is
inlined whole, ``on_device((a, b)).0`` becomes ``on_device(a)`` (stock's ``MaybeOnDevice``).
Primitive functions are left alone. The walk is iterative (deep graphs exceed Python's recursion
limit) and never mutates its input.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import tvm
from tvm import relay

from .._core.planner import FoldPlan
from ._ops import FOLD_ALLOW_OP
from ._read import children as expr_children
from ._read import on_device_body, postorder
from ._stock import is_true

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
        # None inside the bound value itself: a recursive function calls its own variable
        bound = new.get(let_value[expr]) if expr in let_value else None
        if bound is not None and _is_simple_constant(bound):
            return bound  # stock inlines a let-bound constant, with its on_device
        return expr
    if isinstance(expr, relay.Call):
        node = node_of_call.get(expr)
        if node is not None and plan.folds(node):
            is_allow = isinstance(expr.op, tvm.ir.Op) and expr.op.name == FOLD_ALLOW_OP
            operand = new[expr.args[0]] if is_allow else None
            if (
                operand is not None
                and on_device_body(operand) is not None
                and _is_simple_constant(operand)
            ):
                return (
                    operand  # fold_allow(on_device(<const>)): the allow goes, the device hint stays
                )
            return values[node]
    elif isinstance(expr, relay.TupleGetItem):
        tup = new[expr.tuple_value]
        fields = _ignoring_on_device(tup, relay.Tuple)
        if fields is not None:
            field = fields.fields[expr.index]
            return field if isinstance(tup, relay.Tuple) else _maybe_on_device(field, tup)
    elif isinstance(expr, relay.Let):
        if _is_simple_constant(new[expr.value]):
            return new[expr.body]  # the binding was inlined at every use
    elif isinstance(expr, relay.If):
        cond = _ignoring_on_device(new[expr.cond], relay.Constant)
        if cond is not None:
            return new[expr.true_branch] if is_true(cond) else new[expr.false_branch]
    return _rebuild_plain(expr, new)


def _is_fully_unconstrained(device: Any) -> bool:
    """No device, target or memory scope: what ``on_device`` holds when it constrains nothing.

    ``device`` is a ``tvm.target.VirtualDevice`` (typed Any: TVM builds without Relay lack it).
    """
    return (
        int(device.device_type_int) < 0
        and int(device.virtual_device_id) < 0
        and device.target is None
        and not str(device.memory_scope)
    )


def _ignoring_on_device(expr: relay.Expr, kind: type) -> Optional[relay.Expr]:
    """``expr``, or the operand of ``on_device(expr)``, when it is a ``kind`` (stock's ``AsIgnoringOnDevice``)."""
    if isinstance(expr, kind):
        return expr
    body = on_device_body(expr)
    return body if isinstance(body, kind) else None


def _is_simple_constant(expr: relay.Expr) -> bool:
    return _ignoring_on_device(expr, relay.Constant) is not None


def _maybe_on_device(body: relay.Expr, annotation: relay.Call) -> relay.Expr:
    """``body`` under the device constraint of ``annotation``, as stock's ``MaybeOnDevice`` puts it.

    No annotation where the device is unconstrained or recoverable from elsewhere (variables,
    functions, ops); two nested annotations merge into one.
    """
    attrs = annotation.attrs
    device, constrain_result, constrain_body = (
        attrs.virtual_device,
        bool(attrs.constrain_result),
        bool(attrs.constrain_body),
    )
    if _is_fully_unconstrained(device) or isinstance(
        body, (tvm.ir.Op, relay.GlobalVar, relay.Var, relay.Function)
    ):
        return body
    inner_body = on_device_body(body)
    if inner_body is not None:
        inner = body.attrs
        constrain_inner = bool(inner.constrain_body)
        device = device if (constrain_inner or constrain_result) else inner.virtual_device
        return relay.op.annotation.on_device(inner_body, device, constrain_result, constrain_inner)
    return relay.op.annotation.on_device(body, device, constrain_result, constrain_body)


def substitute_calls(
    func: relay.Function, wrap: Mapping[relay.Call, Callable[[relay.Expr], relay.Expr]]
) -> relay.Function:
    """``func`` with each call in ``wrap`` replaced by ``wrap[call](call)`` (operands rebuilt first).

    Nothing else changes: no folding and none of stock's let / tuple / if simplifications.
    """
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        rebuilt = _rebuild_plain(expr, new)
        new[expr] = (
            wrap[expr](rebuilt) if isinstance(expr, relay.Call) and expr in wrap else rebuilt
        )
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
    return relay.Function(
        list(func.params), body, func.ret_type, func.type_params, func.attrs, func.span
    )


def _with_body(func: relay.Function, body: relay.Expr) -> relay.Function:
    return func if body.same_as(func.body) else _new_function(func, body)


def remap_global_vars(
    func: relay.Function, mapping: Mapping[relay.GlobalVar, relay.GlobalVar]
) -> relay.Function:
    """A new ``func`` (always a new object) whose references to global functions go through ``mapping``."""
    new: Dict[relay.Expr, relay.Expr] = {}
    for expr in postorder(func.body):
        new[expr] = (
            mapping.get(expr, expr)
            if isinstance(expr, relay.GlobalVar)
            else _rebuild_plain(expr, new)
        )
    return _new_function(
        func, new[func.body]
    )  # always a new object: no GlobalVar may reach ``func``
