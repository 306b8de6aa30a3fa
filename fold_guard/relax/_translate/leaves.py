"""What the walk reads of one call: its operands as node inputs, its results, callee and attributes.

The walk keeps, per variable in scope, what it is bound to (:class:`Env`: a constant, a call
binding's result, a ``ShapeExpr``, or something opaque such as a parameter), and turns each
argument of a call into leaves (:func:`add_leaf`): the node's typed inputs, the constants they
hold, and the call's arguments as a template with each tensor replaced by its leaf index. A
type's :class:`~fold_guard._core.graph.TensorInfo` (:func:`tensor_info`, remembered per type
object, see ``_compat.remembering_types``) serves the operands and the results alike; the kernel
a kernel call calls (:func:`callee_of`) and a call's attributes (:func:`attrs_of`, read on first
use) complete the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from ..._core.graph import InputKind, NodeInput, TensorInfo
from .. import _compat
from .._sites import StaticShapeVar

__all__ = [
    "KERNEL_CALL_OPS",
    "OPAQUE",
    "WEIGHT",
    "Bound",
    "CallAttrs",
    "Env",
    "Leaves",
    "Scope",
    "add_leaf",
    "attrs_of",
    "bound_item",
    "callee_name",
    "callee_of",
    "output_infos",
    "tensor_info",
]


#: Ops whose first argument is the thing called (a PrimFunc's GlobalVar or an extern), with the
#: tensor operands in a tuple after it: calls into a kernel rather than an operator.
KERNEL_CALL_OPS = frozenset(
    {
        "relax.call_tir",
        "relax.call_tir_inplace",
        "relax.call_tir_with_grad",
        "relax.call_dps_packed",
        "relax.call_pure_packed",
        "relax.call_inplace_packed",
    }
)


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


def tensor_info(ty) -> TensorInfo:
    # a call's result type is also the type of its variable, read again by every consumer
    return _compat.remembered(ty, "tensor_info", _read_tensor_info)


def _read_tensor_info(ty) -> TensorInfo:
    return TensorInfo.of(_compat.dtype_of(ty), _compat.static_shape(ty))


def output_infos(ty) -> Tuple[TensorInfo, ...]:
    return tuple(
        tensor_info(leaf)
        if isinstance(leaf, _compat.TensorType)
        else TensorInfo(
            "shape" if isinstance(leaf, _compat.ShapeType) else type(leaf).__name__, None, 0
        )
        for leaf in _compat.flatten_types(ty)
    )


def callee_name(callee: relax.Expr) -> str:
    """What a call of something other than an operator is named by in the graph (its op)."""
    if isinstance(callee, tvm.ir.GlobalVar):
        return callee.name_hint
    if isinstance(callee, relax.Var):
        return _compat.var_name(callee)
    return type(callee).__name__


class CallAttrs(Mapping[str, object]):
    """A call's attributes as plain Python values (``FoldNode.attrs``), read on first use.

    Reading them is reflection over the attrs object, an FFI read per field (tens of
    microseconds a call), and only a policy that looks at attributes needs them: none of the
    built-in ones does. Attrs objects are immutable, so reading late gives what reading early
    would have.
    """

    __slots__ = ("_attrs", "_values")

    def __init__(self, attrs: tvm.ir.Attrs):
        self._attrs: Optional[tvm.ir.Attrs] = attrs
        self._values: Optional[Dict[str, object]] = None

    def _read(self) -> Dict[str, object]:
        if self._values is None:
            self._values = _compat.read_attrs(self._attrs)
            self._attrs = None
        return self._values

    def __getitem__(self, key: str) -> object:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())

    def __reduce__(self):
        return (dict, (self._read(),))


def callee_of(mod: tvm.IRModule, call: relax.Call) -> Tuple[str, Optional[int]]:
    """The kernel a kernel call calls, and its ``op_pattern`` where ``AnnotateTIROpPattern`` set one.

    The name is the PrimFunc's ``global_symbol`` (what TVM's fusions read as ``name_hint`` is the
    GlobalVar's; a module keeps the two equal), else the GlobalVar's name, or an extern's name.
    """
    callee = call.args[0] if call.args else None
    if isinstance(callee, relax.ExternFunc):
        return str(callee.global_symbol), None
    if not isinstance(callee, tvm.ir.GlobalVar):
        return "", None
    func = mod.functions.get(callee) if callee in mod.functions else None
    attrs = getattr(func, "attrs", None)
    symbol = attrs.get("global_symbol") if attrs is not None else None
    pattern = attrs.get("op_pattern") if attrs is not None else None
    name = str(symbol) if symbol is not None else callee.name_hint
    return name, None if pattern is None else int(pattern)


def attrs_of(call: relax.Call) -> Mapping[str, object]:
    """A call's attributes, read on first use (:class:`CallAttrs`)."""
    attrs = call.attrs
    return {} if attrs is None else CallAttrs(attrs)
