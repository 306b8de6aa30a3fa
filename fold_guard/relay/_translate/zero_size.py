"""Relay calls whose kernel would compute from memory nobody wrote (a zero-size operand read).

Relay lowers an op through its TE compute; this lowers one call's compute to TIR
(``te_compiler.lower_to_primfunc``, the compute as a block-form PrimFunc) and asks
:mod:`fold_guard._tvm.unwritten` whether a block that runs reads a zero-size buffer: ``resize2d`` or
``take`` from an empty tensor reads outside it, and stock folds whatever lies there. Only calls
with a zero-size tensor operand and a non-empty result are lowered (they are rare), and a call
whose compute does not lower this way is taken as written. A reduction over an empty axis is
not such a call on Relay: TE's schedule lowering writes the reduction's initial value before its
loop (``max`` gives the lowest float), so stock's fold is defined there.
"""

from __future__ import annotations

import math
from typing import List

import tvm
from tvm import relay

from ..._tvm.unwritten import EMPTY_READ_DETAIL, reads_empty_buffer
from .._stock import evaluation_target

__all__ = ["reads_memory_nobody_wrote"]


def _has_zero_dim(ty: object) -> bool:
    if isinstance(ty, relay.TupleType):
        return any(_has_zero_dim(field) for field in ty.fields)
    return isinstance(ty, relay.TensorType) and any(
        isinstance(dim, tvm.tir.IntImm) and int(dim) == 0 for dim in ty.shape
    )


def _is_empty(ty: object) -> bool:
    if isinstance(ty, relay.TupleType):
        return all(_is_empty(field) for field in ty.fields)
    if not isinstance(ty, relay.TensorType):
        return True
    dims = [int(dim) if isinstance(dim, tvm.tir.IntImm) else -1 for dim in ty.shape]
    return math.prod(dims) == 0


def reads_memory_nobody_wrote(call: relay.Call) -> str:
    """Why ``call``'s kernel would read a zero-size operand's (absent) elements, or ""."""
    arg_types = [arg.checked_type for arg in call.args]
    if not any(_has_zero_dim(ty) for ty in arg_types) or _is_empty(call.checked_type):
        return ""
    params: List[relay.Var] = []

    def operand(ty: object) -> relay.Expr:
        if isinstance(ty, relay.TupleType):
            return relay.Tuple([operand(field) for field in ty.fields])
        params.append(relay.var(f"p{len(params)}", ty))
        return params[-1]

    args = [operand(ty) for ty in arg_types]
    body = relay.Call(call.op, args, call.attrs, call.type_args)
    try:
        typed = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))
        primitive = typed["main"].with_attr("Primitive", 1)
        lowering = relay.backend.te_compiler.lower_to_primfunc
        prim_func = lowering(primitive, tvm.target.Target(evaluation_target()))
    except tvm.TVMError:  # no TE compute of its own (an extern, a QNN op): taken as written
        return ""
    return EMPTY_READ_DETAIL if reads_empty_buffer(prim_func) else ""
