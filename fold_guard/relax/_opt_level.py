"""At which LLVM optimization level a kernel is built: a speed choice that leaves every bit as it is.

TVM builds ``llvm`` kernels for the generic x86-64 CPU (no FMA, so there is nothing to contract)
and without fast-math flags, so LLVM at any optimization level computes the same value for every
operation whose result its IR defines. What the IR leaves open (poison) may come out differently:
a float-to-integer conversion out of range, a signed overflow of an ``nsw`` addition, a division
by zero, and, because TVM tells the backend to assume there are no NaNs (``NoNaNsFPMath``), a
comparison, min or max that meets a NaN. (A symbolic ``astype(300.0, "int8")`` kernel gave 44
where stock's gives 127.) A kernel that can meet none of these computes at ``-O0`` the bits
stock's ``-O3`` kernel computes.

``-O0`` compiles about 3x faster (BERT-tiny's 13 kernels: 0.11 s instead of 0.34 s) and its
code runs about 2x slower, so it is chosen only where compiling is the larger cost: a kernel
whose calls write at most :data:`QUICK_BUILD_MAX_BYTES` together. The ops that qualify are the
ones quantized models fold, each under the condition that keeps it clear of poison:

- ``dequantize`` to float32 of 8- or 16-bit integers (widen, subtract in int32: cannot
  overflow, convert, multiply), or of int32 with zero points the module holds as zeros;
- ``quantize`` of float32 to 8- or 16-bit integers, when every operand is a constant of the
  module with no NaN in the data and only finite, non-zero scales: ``x / scale`` is then never
  NaN, and the clip to bounds float32 holds exactly leaves the conversion in range;
- integer comparisons, and ``where`` (a select: values pass through, nothing is compared);
- integer ``add`` / ``subtract`` of module constants whose exact results fit their dtype (the
  index arithmetic ONNX ``Gather`` imports with).

Every value a kernel loads is concrete (poison never crosses a buffer), so each kernel is judged
on its own operations.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from . import _compat
from ._lower import CallSite

__all__ = ["OPTIMIZED_TARGET", "QUICK_BUILD_MAX_BYTES", "QUICK_TARGET", "build_target"]

#: The target stock ``FoldConstant`` builds for (LLVM's default, ``-O3``).
OPTIMIZED_TARGET = "llvm"
#: The same target at LLVM ``-O0`` (TVM takes targets with options as JSON).
QUICK_TARGET = json.dumps({"kind": "llvm", "opt-level": 0})
#: Above this many output bytes over all its calls, a kernel's run time outweighs its build.
QUICK_BUILD_MAX_BYTES = 16 << 20

_NARROW_INTEGERS = frozenset({"int8", "uint8", "int16", "uint16"})


def _dtype(expr: object) -> str:
    return str(_compat.dtype_of(_compat.type_of(expr)))


def _quick_dequantize(site: CallSite) -> bool:
    data, _, zero_point = site.leaves[:3]
    if _dtype(site.call) != "float32":
        return False
    if _dtype(data) in _NARROW_INTEGERS and _dtype(zero_point) in _NARROW_INTEGERS:
        return True
    constant = site.leaf_constants[2]
    return (
        _dtype(data) == "int32"
        and constant is not None
        and not _compat.constant_array(constant).numpy().any()
    )


def _quick_quantize(site: CallSite) -> bool:
    if _dtype(site.call) not in _NARROW_INTEGERS or _dtype(site.leaves[0]) != "float32":
        return False
    if any(constant is None for constant in site.leaf_constants[:3]):
        return False  # computed by another fold: its values are not known before building
    data, scale = (_compat.constant_array(c).numpy() for c in site.leaf_constants[:2])
    return not np.isnan(data).any() and bool(np.isfinite(scale).all() and (scale != 0).all())


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def _quick_compare(site: CallSite) -> bool:
    return all(_is_integer(_dtype(leaf)) for leaf in site.leaves)


def _quick_where(site: CallSite) -> bool:
    return all(_dtype(leaf) in _SELECTABLE for leaf in site.leaves)


def _quick_integer_arithmetic(site: CallSite) -> bool:
    dtype = _dtype(site.call)
    if not _is_integer(dtype) or dtype == "bool" or any(c is None for c in site.leaf_constants):
        return False
    left, right = (
        _compat.constant_array(c).numpy().astype(object) for c in site.leaf_constants[:2]
    )
    exact = left + right if site.call.op.name == "relax.add" else left - right
    bounds = np.iinfo(dtype)
    return all(bounds.min <= int(v) <= bounds.max for v in np.asarray(exact).reshape(-1))


_SELECTABLE = frozenset(_NARROW_INTEGERS | {"bool", "int32", "int64", "uint32", "uint64"})
_QUICK_OPS = {
    "relax.dequantize": _quick_dequantize,
    "relax.quantize": _quick_quantize,
    "relax.where": _quick_where,
    "relax.add": _quick_integer_arithmetic,
    "relax.subtract": _quick_integer_arithmetic,
    **{
        f"relax.{name}": _quick_compare
        for name in ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
    },
}


def _output_bytes(site: CallSite) -> int:
    ty = _compat.type_of(site.call)
    shape = _compat.static_shape(ty)
    dims = [dim for dim in shape or () if dim is not None]
    if shape is None or len(dims) != len(shape):
        return QUICK_BUILD_MAX_BYTES + 1  # not static: never built quickly
    return int(np.prod(dims, dtype=np.int64)) * np.dtype(_dtype(site.call)).itemsize


def build_target(members: Sequence[CallSite]) -> str:
    """The target the kernel serving ``members`` (calls of one op signature) is built for.

    Returns :data:`QUICK_TARGET` where ``-O0`` is both exact and cheaper, else
    :data:`OPTIMIZED_TARGET`.
    """
    rule = _QUICK_OPS.get(members[0].call.op.name)
    if rule is None or sum(_output_bytes(site) for site in members) > QUICK_BUILD_MAX_BYTES:
        return OPTIMIZED_TARGET
    return QUICK_TARGET if all(rule(site) for site in members) else OPTIMIZED_TARGET
