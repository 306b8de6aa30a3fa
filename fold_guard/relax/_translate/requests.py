"""The functions ``LegalizeOps`` sees: one call of a group over placeholder parameters.

A :class:`Request` is a representative call of an op-signature group (:mod:`.legalize`) wrapped in
a private function: each tensor operand a parameter whose dims are sizes where every member
agrees and shared symbolic variables where they differ, and, for a request that decides what
stock would do, each 0-d operand the constant stock would show the legalizer.
:func:`legalize_requests` runs one ``LegalizeOps`` over many of them, and isolates a legalizer
that raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from .. import _compat
from .._sites import CallSite, StaticShapeVar

__all__ = [
    "Request",
    "leaf_shapes",
    "leaf_type",
    "legalize_requests",
    "make_request",
]


def leaf_type(site: CallSite, index: int) -> relax.TensorType:
    return _compat.type_of(site.leaves[index])


def leaf_shapes(site: CallSite) -> Tuple:
    return tuple(_compat.static_shape(leaf_type(site, i)) for i in range(len(site.leaves)))


@dataclass
class Request:
    """One function to legalize: a representative call over placeholder parameters."""

    name: str
    members: List[CallSite]
    params: List[Optional[relax.Var]]
    symbolic: bool
    for_decision: bool = False
    #: each symbolic dim var, with its value for every member (in member order)
    dim_values: Dict[tvm.tirx.Var, Tuple[int, ...]] = field(default_factory=dict)


def _dims_for(
    members: List[CallSite], symbolic: bool, every_dim: bool = False
) -> Tuple[List[List[object]], Dict[tvm.tirx.Var, Tuple[int, ...]]]:
    """Per leaf, its dims: an int where every member agrees, else a shared symbolic var.

    Two positions whose values agree across all members get the same var, so constraints such
    as "scale has as many elements as the quantized axis" still type-check. ``every_dim``
    makes every dim larger than 1 a var, agreeing or not (:mod:`.reads`' probe).
    """
    per_member = [leaf_shapes(site) for site in members]
    first = per_member[0]
    shared: Dict[Tuple, tvm.tirx.Var] = {}
    dims: List[List[object]] = []
    for i, shape in enumerate(first):
        leaf_dims: List[object] = []
        for k in range(len(shape or ())):
            column = tuple(shapes[i][k] for shapes in per_member)
            agree = len(set(column)) == 1
            if not symbolic or (agree and (not every_dim or column[0] in (0, 1, None))):
                leaf_dims.append(column[0])
            else:
                if column not in shared:
                    shared[column] = tvm.tirx.Var(f"n{len(shared)}", "int64")
                leaf_dims.append(shared[column])
        dims.append(leaf_dims)
    return dims, {var: column for column, var in shared.items()}


def make_request(
    name: str,
    members: List[CallSite],
    *,
    symbolic: bool,
    scalars_as_constants: bool,
    scalars: Optional[Mapping[int, np.ndarray]] = None,
    every_dim: bool = False,
) -> Tuple[relax.Function, Request]:
    site = members[0]
    params: List[Optional[relax.Var]] = []
    leaf_exprs: List[relax.Expr] = []
    dims, dim_values = _dims_for(members, symbolic, every_dim)
    for i, leaf_dims in enumerate(dims):
        dtype = _compat.dtype_of(leaf_type(site, i))
        if scalars_as_constants and not leaf_dims:
            leaf_exprs.append(_scalar_constant(site, i, dtype, scalars or {}))
            params.append(None)
            continue
        var = relax.Var(f"p{i}", relax.TensorType(leaf_dims, dtype))
        params.append(var)
        leaf_exprs.append(var)

    # Shape variables known from their type become parameters too, but not operands: a kernel
    # that reads one at run time cannot be used (it is rejected when read back).
    shape_params: List[relax.Var] = []

    def rebuild(arg: object) -> relax.Expr:
        if isinstance(arg, int):
            return leaf_exprs[arg]
        if isinstance(arg, tuple):
            return relax.Tuple([rebuild(a) for a in arg])
        if isinstance(arg, StaticShapeVar):
            shape_params.append(relax.Var(f"s{len(shape_params)}", _compat.type_of(arg.var)))
            return shape_params[-1]
        return arg  # type: ignore[return-value]

    call = _compat.make_call(
        site.call.op, [rebuild(a) for a in site.template_args], site.call.attrs, site.call.ty_args
    )
    bb = relax.BlockBuilder()
    with bb.function(name, [p for p in params if p is not None] + shape_params, private=True):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    request = Request(name, members, params, symbolic, scalars_as_constants, dim_values)
    return bb.get()[name], request


def _scalar_constant(
    site: CallSite, index: int, dtype: str, scalars: Mapping[int, np.ndarray]
) -> relax.Expr:
    """The constant a 0-d leaf is shown to the legalizer as, the way the stock pass shows it.

    A literal constant is itself; a value folded earlier in this pass (``scalars``) is that
    value. A scalar still pending (folded in this pass, not yet evaluated) stands in as one:
    legalizers look at the value only to reject it (a division's simplifier raises "Divide by
    zero" on a zero divisor), and one is a value none rejects. Such a call's decision is made
    again on its real value once that is known (``Legalization.pending_scalars``,
    :func:`stock_legalization_error`).
    """
    if index in scalars:
        return relax.const(scalars[index], dtype)
    constant = site.leaf_constants[index]
    if constant is not None:
        return constant
    return relax.const(np.ones((), dtype), dtype)


def legalize_requests(
    functions: Dict[str, relax.Function],
) -> Tuple[Dict[str, tvm.IRModule], Dict[str, str]]:
    """LegalizeOps over all request functions at once; on failure, one by one to isolate it.

    Returns, per request name, the legalized module that holds it (the batch, or the request's
    own module), and per failed request why. The modules of the one-by-one fallback stay apart:
    each names its PrimFuncs on its own (two may both define ``tir_exp``), and its ``call_tir``
    refers to its own ``GlobalVar`` objects, which a merged module would not define.
    """
    errors: Dict[str, str] = {}
    try:
        batch = relax.transform.LegalizeOps()(tvm.IRModule(functions))
        return dict.fromkeys(functions, batch), errors
    except Exception:  # noqa: BLE001 - a legalizer raising anything: isolate it below
        pass
    modules: Dict[str, tvm.IRModule] = {}
    for name, func in functions.items():
        try:
            modules[name] = relax.transform.LegalizeOps()(tvm.IRModule({name: func}))
        except Exception as err:  # noqa: BLE001 - recorded per request as "cannot evaluate"
            errors[name] = f"LegalizeOps failed: {err}".splitlines()[0]
    return modules, errors
