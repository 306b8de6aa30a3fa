"""Reading Relay expressions as stock folding reads them: traversal order, types, function names.

Pure readers with no walk state: :func:`children` and :func:`postorder` visit sub-expressions in
the order stock ``FoldConstant`` does (iteratively: Relay graphs of a few hundred blocks are
deeper than Python's recursion limit); :func:`on_device_body` looks through the one
``on_device`` annotation it looks through; the type readers turn checked types into the core's
:class:`~fold_guard._core.graph.TensorInfo`; :func:`foldable_functions` picks the global
functions a pass visits.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import tvm
from tvm import relay

from .._core.errors import PreconditionError, UnsupportedIRError
from .._core.graph import TensorInfo
from ._stock import ON_DEVICE_OP, is_optimizable, is_primitive

__all__ = [
    "checked_type",
    "children",
    "foldable_functions",
    "function_names",
    "on_device_body",
    "postorder",
    "short",
    "static_shape",
    "tensor_infos",
]


# --- Traversal -----------------------------------------------------------------------------------


def children(expr: relay.Expr) -> Sequence[relay.Expr]:
    """The sub-expressions stock folding visits, in the order it visits them."""
    if isinstance(expr, relay.Call):
        callee = [] if isinstance(expr.op, tvm.ir.Op) else [expr.op]
        return callee + list(expr.args)
    if isinstance(expr, relay.Tuple):
        return list(expr.fields)
    if isinstance(expr, relay.TupleGetItem):
        return [expr.tuple_value]
    if isinstance(expr, relay.Let):
        return [expr.value, expr.body]
    if isinstance(expr, relay.If):
        return [expr.cond, expr.true_branch, expr.false_branch]
    if isinstance(expr, relay.Function):
        return [] if is_primitive(expr) else [expr.body]
    if isinstance(expr, (relay.Var, relay.Constant, relay.GlobalVar, tvm.ir.Op)):
        return []
    raise UnsupportedIRError(
        f"fold_guard.relay cannot fold through a {type(expr).__name__} expression "
        f"({short(expr)}): only dataflow, let, if, tuple and function expressions are supported; "
        "hint: fold the functions without ADTs or references, or use stock FoldConstant for this one"
    )


def postorder(
    root: relay.Expr, kids: Callable[[relay.Expr], Sequence[relay.Expr]] = children
) -> Iterator[relay.Expr]:
    """Every sub-expression of ``root`` once, operands before their users, without recursion."""
    seen = set()
    stack: List[Tuple[relay.Expr, bool]] = [(root, False)]
    while stack:
        expr, expanded = stack.pop()
        if expanded:
            yield expr
            continue
        if expr in seen:
            continue
        seen.add(expr)
        stack.append((expr, True))
        for child in reversed(kids(expr)):
            if child not in seen:
                stack.append((child, False))


def on_device_body(expr: relay.Expr) -> Optional[relay.Expr]:
    """The operand of ``expr`` when it is an ``on_device`` call, else None.

    Stock folding looks through exactly one such annotation (``AsIgnoringOnDevice``):
    ``on_device(on_device(<const>))`` is not a constant to it, and so not to us.
    """
    if (
        isinstance(expr, relay.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == ON_DEVICE_OP
    ):
        return expr.args[0] if len(expr.args) == 1 else None
    return None


def short(expr: relay.Expr, limit: int = 160) -> str:
    text = " ".join(str(expr).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- Type facts ----------------------------------------------------------------------------------


def checked_type(expr: relay.Expr) -> Optional[tvm.ir.Type]:
    try:
        return expr.checked_type
    except ValueError:  # not type-checked
        return None


def static_shape(ty: Optional[tvm.ir.Type]) -> Optional[Tuple[int, ...]]:
    """The shape of a tensor type when every dimension is a known integer, else None."""
    if not isinstance(ty, relay.TensorType):
        return None
    dims = []
    for dim in ty.shape:
        if not isinstance(dim, tvm.tir.IntImm):
            return None
        dims.append(int(dim.value))
    return tuple(dims)


def tensor_infos(ty: Optional[tvm.ir.Type]) -> Tuple[TensorInfo, ...]:
    """One TensorInfo per tensor in ``ty`` (tuples flattened); unknown dims are None."""
    if isinstance(ty, relay.TupleType):
        return tuple(info for field in ty.fields for info in tensor_infos(field))
    if isinstance(ty, relay.TensorType):
        dims = [int(d.value) if isinstance(d, tvm.tir.IntImm) else None for d in ty.shape]
        return (TensorInfo.of(str(ty.dtype), dims),)
    return ()


# --- The walk ------------------------------------------------------------------------------------


def function_names(functions: Optional[Iterable[str]]) -> Optional[Tuple[str, ...]]:
    """``functions`` as a tuple of names; one string is one name (``"main"``, not its letters)."""
    if functions is None:
        return None
    if isinstance(functions, str):
        return (functions,)
    try:
        names = tuple(functions)
    except TypeError:
        raise PreconditionError(
            f"functions must be a function name or an iterable of names, got {type(functions).__name__} {functions!r}"
        ) from None
    for name in names:
        if not isinstance(name, str):
            raise PreconditionError(
                f"functions must name global functions by string, got {type(name).__name__} {name!r} in {names!r}; "
                "hint: use gvar.name_hint for a GlobalVar"
            )
    return names


def foldable_functions(
    mod: tvm.IRModule, names: Optional[Iterable[str]]
) -> List[Tuple[str, relay.Function]]:
    """The global functions to fold: the named ones, or every one stock ``FoldConstant`` visits."""
    names = function_names(names)
    relay_functions = {
        gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, relay.Function)
    }
    if names is None:
        return sorted((name, f) for name, f in relay_functions.items() if is_optimizable(f))
    chosen = []
    for name in names:
        if name not in relay_functions:
            raise PreconditionError(
                f"functions names {name!r}, which is not a Relay function of the module; "
                f"its Relay functions are: {', '.join(sorted(relay_functions)) or 'none'}"
            )
        chosen.append((name, relay_functions[name]))
    return sorted(chosen, key=lambda item: item[0])
