"""Which ops one kernel over symbolic dims may serve, for calls of several shapes.

A symbolic kernel is a different TIR function from the static one stock compiles for each
shape, so it may serve calls of several shapes only where it computes the same bits for every
shape and every value: :func:`is_shape_generic` says where.
"""

from __future__ import annotations

from .. import _compat
from .._sites import CallSite

__all__ = ["SHAPE_GENERIC_OPS", "is_shape_generic"]

_ELEMENTWISE = (
    "abs acos acosh asin asinh astype atan atanh bitwise_not ceil clip cos cosh erf exp floor "
    "isfinite isinf isnan log logical_not negative nn.relu nn.silu nn.gelu nn.gelu_tanh round "
    "rsqrt sigmoid sign sin sinh sqrt square tan tanh trunc "
    "add atan2 bitwise_and bitwise_or bitwise_xor divide equal floor_divide floor_mod greater "
    "greater_equal left_shift less less_equal log_add_exp logical_and logical_or logical_xor "
    "maximum minimum mod multiply not_equal power right_shift subtract where"
)
#: Ops whose kernel computes the same values whatever the static sizes of its dims (apart from
#: the 0/1 dim classes that are part of the signature), so one kernel over symbolic dims may
#: serve calls of different shapes. Others get one static kernel per distinct shape, as the stock
#: pass builds them: some TOPI computes decide their loop structure, and so their float
#: summation order, from static sizes (``adaptive_avg_pool2d`` does when a window divides evenly).
SHAPE_GENERIC_OPS = frozenset(
    [f"relax.{name}" for name in _ELEMENTWISE.split()]
    + [
        "relax.quantize",
        "relax.dequantize",
        "relax.broadcast_to",
        "relax.permute_dims",
        "relax.expand_dims",
    ]
)
#: Ops of SHAPE_GENERIC_OPS whose result C and LLVM leave undefined for some integer operands
#: (division by zero, ``INT_MIN / -1``, a shift by at least the bit width). What such a kernel
#: returns there depends on the generated code, which differs between a symbolic kernel and the
#: static one stock compiles, so on integers they get static kernels. (``quantize`` clips before
#: it converts, so its conversion is always in range.)
_UNDEFINED_ON_INTEGERS = frozenset(
    f"relax.{name}"
    for name in ("divide", "floor_divide", "floor_mod", "mod", "left_shift", "right_shift")
)
_ASTYPE_OP = "relax.astype"


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def is_shape_generic(site: CallSite) -> bool:
    """Whether one symbolic kernel computes, for every shape, the bits stock's static kernel does.

    Only where the result is defined for every input value: a float-to-integer ``astype`` of an
    out-of-range value or NaN is undefined behaviour, and a symbolic kernel gave ``44`` where
    stock's static one gives ``127`` for ``astype(300.0, "int8")``. The dtypes are part of the
    op signature, so the first member answers for the whole group.
    """
    op = site.call.op.name
    if op not in SHAPE_GENERIC_OPS:
        return False
    in_dtypes = [_compat.dtype_of(_compat.type_of(site.leaves[i])) for i in range(len(site.leaves))]
    if op in _UNDEFINED_ON_INTEGERS:
        return not any(_is_integer(dtype) for dtype in in_dtypes)
    if op == _ASTYPE_OP:
        out_dtype = _compat.dtype_of(_compat.type_of(site.call))
        return not (
            _is_integer(out_dtype) and any(not _is_integer(d) and d != "bool" for d in in_dtypes)
        )
    return True
