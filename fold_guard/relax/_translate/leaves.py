"""What a variable is bound to as the walk sees it, and a call's tensor arguments as node inputs.

The walk keeps, per variable in scope, what it is bound to (:class:`Env`: a constant, a call
binding's result, a ``ShapeExpr``, or something opaque such as a parameter), and turns each
argument of a call into leaves (:func:`add_leaf`): the node's typed inputs, the constants they
hold, and the call's arguments as a template with each tensor replaced by its leaf index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from ..._core.graph import InputKind, NodeInput, TensorInfo
from .. import _compat
from .._sites import StaticShapeVar
from .read import tensor_info

__all__ = ["OPAQUE", "WEIGHT", "Bound", "Env", "Leaves", "Scope", "add_leaf", "bound_item"]


@dataclass
class Leaves:
    """The tensor arguments of one call as the walk collects them (see ``add_leaf``)."""

    inputs: List[NodeInput] = field(default_factory=list)
    leaves: List[relax.Expr] = field(default_factory=list)
    constants: List[Optional[relax.Expr]] = field(default_factory=list)
    zero_size: List[int] = field(default_factory=list)
    #: nodes read here other than as a tensor operand (a tuple-typed variable)
    escaping: List[int] = field(default_factory=list)


def static_shape_values(arg: relax.Expr) -> Optional[Tuple[int, ...]]:
    """The values of a shape variable whose type gives them all (``s: R.Shape([3, 4])``), or None."""
    ty = _compat.type_of(arg)
    values = getattr(ty, "values", None) if isinstance(ty, _compat.ShapeType) else None
    if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return tuple(int(v.value) for v in values)


class Bound(Enum):
    """What a variable is bound to, as far as folding is concerned."""

    CONSTANT = "constant"
    NODE = "node"  # the result of a call binding
    SHAPE = "shape"  # a ShapeExpr
    WEIGHT = "weight"  # a parameter stock LiftTransformParams lifts from (``num_input`` on)
    ITEM = "item"  # one item of a call binding's tuple result (``q = encoded[0]``)
    OPAQUE = "opaque"


@dataclass(frozen=True)
class Env:
    kind: Bound
    value: object = None
    node: Optional[int] = None


OPAQUE = Env(Bound.OPAQUE)  # run-time parameters, match casts, tuples, anything else
WEIGHT = Env(Bound.WEIGHT)
#: What each variable in scope is bound to, keyed by the variable's handle (``_compat.handle``;
#: the module being walked keeps every variable alive)
Scope = Dict[int, Env]


def bound_item(value: relax.Expr, env: Scope) -> Env:
    """What a binding of ``value`` is bound to when ``value`` is not a call, constant, variable
    or shape: ``encoded[i]`` of a call binding's tuple result is that call's item; anything else
    (a tuple, a branch, a closure) is opaque."""
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        bound = env.get(_compat.handle(value.tuple_value), OPAQUE)
        if bound.kind is Bound.NODE:
            return Env(Bound.ITEM, node=bound.node)
    return OPAQUE


def add_leaf(arg: relax.Expr, env: Scope, out: Leaves) -> object:
    """Record ``arg``'s tensors as node inputs; return its template form.

    The template form is a leaf index for a tensor, a tuple of template forms for an inline
    tuple, a StaticShapeVar for a shape variable whose type gives its values, and the expression
    itself for a static argument (a ShapeExpr, also one substituted for a variable bound to it as
    the stock pass does, a PrimValue, a StringImm, a DataTypeImm).
    """
    if isinstance(arg, relax.Tuple):
        return tuple(add_leaf(field_, env, out) for field_ in arg.fields[:])
    bound = env.get(_compat.handle(arg), OPAQUE) if isinstance(arg, relax.Var) else None
    if bound is not None and bound.kind is Bound.SHAPE:
        return bound.value
    ty = _compat.type_of(arg)
    is_tensor = isinstance(ty, _compat.TensorType)
    shape_values = static_shape_values(arg) if bound is not None and not is_tensor else None
    if shape_values is not None:
        return StaticShapeVar(arg, shape_values)
    if bound is None and not is_tensor:
        return arg
    index = len(out.leaves)
    out.leaves.append(arg)
    tensor = tensor_info(ty) if is_tensor else None
    constant = None
    if _compat.is_constant(arg):
        constant = arg
        out.inputs.append(NodeInput(InputKind.CONSTANT, "const", tensor))
    elif bound is None:
        out.inputs.append(NodeInput(InputKind.RUNTIME, type(arg).__name__, tensor))  # not in ANF
    elif bound.kind is Bound.CONSTANT and is_tensor:
        constant = bound.value
        out.inputs.append(NodeInput(InputKind.CONSTANT, _compat.var_name(arg), tensor))
    elif bound.kind is Bound.NODE and is_tensor:
        out.inputs.append(NodeInput(InputKind.NODE, _compat.var_name(arg), tensor, bound.node))
        constant = _zero_size_constant(tensor, index, out)
    elif bound.kind is Bound.ITEM and is_tensor:
        # never constant to the stock pass; lifted with its call (see InputKind.TUPLE_ITEM)
        out.inputs.append(
            NodeInput(InputKind.TUPLE_ITEM, _compat.var_name(arg), tensor, bound.node)
        )
        constant = _zero_size_constant(tensor, index, out)
    elif bound.kind is Bound.WEIGHT and is_tensor and not _is_zero_size(tensor):
        out.inputs.append(NodeInput(InputKind.PARAMETER, _compat.var_name(arg), tensor))
    else:
        if bound.node is not None:  # a tuple-typed call result, read whole
            out.escaping.append(bound.node)
        # parameters, and (as in the stock pass) variables bound to tuples or shapes
        out.inputs.append(NodeInput(InputKind.RUNTIME, _compat.var_name(arg), tensor))
        constant = _zero_size_constant(tensor, index, out)
    out.constants.append(constant)
    return index


def _is_zero_size(tensor: Optional[TensorInfo]) -> bool:
    shape = tensor.shape if tensor is not None else None
    return shape is not None and None not in shape and 0 in shape


def _zero_size_constant(
    tensor: Optional[TensorInfo], index: int, out: Leaves
) -> Optional[relax.Expr]:
    """The one value of a tensor leaf of a static zero-size shape (None for any other leaf).

    A zero-size tensor has one possible value, the empty one, whether a parameter or a call
    computes it. Stock folds a call on it when the call's legalized kernel does not read it
    (``sum`` over a zero-size axis legalizes to ``full(0)``); legalization tells
    (``PlanningFacts.unread_zero_size``).
    """
    if tensor is None or tensor.shape is None or not _is_zero_size(tensor):
        return None
    out.zero_size.append(index)
    shape = tuple(int(d or 0) for d in tensor.shape)
    # the dtype given twice: TVM types an empty NumPy array of float64 as float32 otherwise
    return relax.const(np.zeros(shape, tensor.dtype), tensor.dtype)
