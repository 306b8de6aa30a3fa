"""At which LLVM optimization level a kernel is built: a speed choice that leaves every bit as it is.

TVM builds ``llvm`` kernels for the generic x86-64 CPU (no FMA, so there is nothing to contract)
and without fast-math flags, so LLVM at any optimization level computes the same value for every
operation whose result its IR defines. What the IR leaves open (poison) may come out differently:
a float-to-integer conversion out of range, a signed overflow of an ``nsw`` addition, a division
by zero, and, because TVM tells the backend to assume there are no NaNs (``NoNaNsFPMath``), a
comparison, min or max that meets a NaN. (A symbolic ``astype(300.0, "int8")`` kernel gave 44
where stock's gives 127.) A kernel that can meet none of these computes at ``-O0`` the bits
stock's ``-O3`` kernel computes.

A kernel that only moves data (loads, stores, integer selects, exact casts: ``movement``)
computes nothing a level could change, and runs at memory speed at either level: it is built at
``-O0`` whatever its op and size. For arithmetic, ``-O0`` compiles several times faster and its
code runs slower (``bench/README.md`` has the figures), so it is chosen only where compiling is
the larger cost: a kernel whose calls read and write at most :data:`QUICK_BUILD_MAX_BYTES`
together. A warm fold, which compiles nothing,
pays only the slower run, which this bound keeps small. The ops that qualify are the
ones quantized models fold, each under the condition that keeps it clear of poison:

- ``dequantize`` to float32 of 8- or 16-bit integers (widen, subtract in int32: cannot
  overflow, convert, multiply), or of int32 with zero points that are all zero;
- ``quantize`` of float32 to 8- or 16-bit integers, when the data holds no NaN and every
  scale is finite and non-zero: ``x / scale`` is then never NaN, and the clip to bounds
  float32 holds exactly leaves the conversion in range;
- integer comparisons, and ``where`` (a select: values pass through, nothing is compared);
- integer ``add`` / ``subtract`` whose exact results fit their dtype (the index arithmetic
  ONNX ``Gather`` imports with).

Every value a kernel loads is concrete (poison never crosses a buffer), so each kernel is judged
on its own operations. Conditions on values are checked when the kernel is chosen where every
operand is a constant of the module; where one is computed by an earlier fold, the kernel is
built at ``-O0`` with the condition as a guard, checked on the operands just before the call:
a call that fails it runs an ``-O3`` build of the same kernel, compiled then.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..._core.graph import dtype_nbytes
from .. import _compat
from .._sites import CallSite
from .host import NUMPY_EXACT_DTYPES

__all__ = [
    "OPTIMIZED_TARGET",
    "QUICK_BUILD_MAX_BYTES",
    "QUICK_TARGET",
    "ValueGuard",
    "build_target",
]

#: The target stock ``FoldConstant`` builds for (LLVM's default, ``-O3``).
OPTIMIZED_TARGET = "llvm"
#: The same target at LLVM ``-O0`` (TVM takes targets with options as JSON).
QUICK_TARGET = json.dumps({"kind": "llvm", "opt-level": 0})
#: Above this many bytes read and written over all its calls, a kernel's run time outweighs its
#: build time.
QUICK_BUILD_MAX_BYTES = 32 << 20

_NARROW_INTEGERS = frozenset({"int8", "uint8", "int16", "uint16"})


def _dtype(expr: object) -> str:
    return str(_compat.dtype_of(_compat.type_of(expr)))


#: A check on a call's operand values (in leaf order) that the -O0 kernel is exact for them.
ValueGuard = Callable[[CallSite, Sequence[np.ndarray]], bool]


def _quick_dequantize(site: CallSite) -> bool:
    data, _, zero_point = site.leaves[:3]
    if _dtype(site.call) != "float32":
        return False
    narrow = _dtype(data) in _NARROW_INTEGERS and _dtype(zero_point) in _NARROW_INTEGERS
    return narrow or _dtype(data) == "int32"


def _zero_points_are_zero(site: CallSite, values: Sequence[np.ndarray]) -> bool:
    if _dtype(site.leaves[0]) in _NARROW_INTEGERS:
        return True
    return not np.asarray(values[2]).any()  # int32 - 0 cannot overflow


def _quick_quantize(site: CallSite) -> bool:
    return _dtype(site.call) in _NARROW_INTEGERS and _dtype(site.leaves[0]) == "float32"


def _no_nan_quotient(site: CallSite, values: Sequence[np.ndarray]) -> bool:
    data, scale = values[:2]
    # the minimum is NaN exactly when an element is (NumPy propagates NaN): one pass, no mask
    no_nan = not data.size or not np.isnan(np.min(data))
    return no_nan and bool(np.isfinite(scale).all() and (scale != 0).all())


#: Integer types NumPy holds too (the guards read values with NumPy; no sub-byte types).
_INTEGERS = frozenset(d for d in NUMPY_EXACT_DTYPES if d.startswith(("int", "uint")))


def _is_integer(dtype: str) -> bool:
    return dtype in _INTEGERS or dtype == "bool"


def _quick_compare(site: CallSite) -> bool:
    return all(_is_integer(_dtype(leaf)) for leaf in site.leaves)


def _quick_where(site: CallSite) -> bool:
    return all(_dtype(leaf) in _SELECTABLE for leaf in site.leaves)


def _quick_integer_arithmetic(site: CallSite) -> bool:
    dtype = _dtype(site.call)
    return _is_integer(dtype) and dtype != "bool"


def _exact_result_fits(site: CallSite, values: Sequence[np.ndarray]) -> bool:
    dtype = np.dtype(_dtype(site.call))
    left, right = (np.asarray(v, dtype) for v in values[:2])
    adding = site.call.op.name == "relax.add"
    if dtype.itemsize < 8:  # exact in int64, then compared with the bounds
        wide = left.astype(np.int64) + (1 if adding else -1) * right.astype(np.int64)
        bounds = np.iinfo(dtype)
        return bool(((wide >= bounds.min) & (wide <= bounds.max)).all())
    # 64 bits: NumPy wraps; the wrapped result tells whether the exact one overflowed
    wrapped = np.add(left, right) if adding else np.subtract(left, right)
    if dtype.kind == "u":
        return not (wrapped < left).any() if adding else not (left < right).any()
    if adding:  # overflow: both operands have the sign the result lacks
        return not (((left ^ wrapped) & (right ^ wrapped)) < 0).any()
    return not (((left ^ right) & (left ^ wrapped)) < 0).any()


_SELECTABLE = frozenset(_INTEGERS | {"bool"})
#: op -> (what its types must be, what its operand values must be, or None)
_QUICK_OPS: Dict[str, Tuple[Callable[[CallSite], bool], Optional[ValueGuard]]] = {
    "relax.dequantize": (_quick_dequantize, _zero_points_are_zero),
    "relax.quantize": (_quick_quantize, _no_nan_quotient),
    "relax.where": (_quick_where, None),
    "relax.add": (_quick_integer_arithmetic, _exact_result_fits),
    "relax.subtract": (_quick_integer_arithmetic, _exact_result_fits),
    **{
        f"relax.{name}": (_quick_compare, None)
        for name in ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
    },
}


def _known_values(site: CallSite) -> Optional[List[np.ndarray]]:
    if any(constant is None for constant in site.leaf_constants):
        return None  # computed by another fold: known only when it is evaluated
    return [np.from_dlpack(_compat.constant_array(c)) for c in site.leaf_constants]


def _bytes_touched(site: CallSite) -> int:
    """What the call reads (its tensor operands) and writes (its result), in bytes."""
    total = 0
    for expr in (*site.leaves, site.call):
        nbytes = dtype_nbytes(_dtype(expr), _compat.static_shape(_compat.type_of(expr)))
        if nbytes is None:
            return QUICK_BUILD_MAX_BYTES + 1  # not static: never quick
        total += nbytes
    return total


def build_target(
    members: Sequence[CallSite], *, moves_data: bool = False
) -> Tuple[str, Optional[ValueGuard]]:
    """The target the kernel serving ``members`` (calls of one op signature) is built for.

    Returns :data:`QUICK_TARGET` where ``-O0`` is both exact and cheaper, else
    :data:`OPTIMIZED_TARGET`; and, where exactness depends on operand values some member only
    has once an earlier fold is evaluated, the guard to check on them before running the
    ``-O0`` kernel (a call that fails it runs an ``-O3`` build of the same kernel instead).
    ``moves_data``: the kernel only moves data (``movement.moves_data``), which is exact at
    ``-O0`` for every value and every size; ``members`` may then be empty (a module's own
    ``call_tir``).
    """
    if moves_data:
        return QUICK_TARGET, None
    if not members:
        return OPTIMIZED_TARGET, None
    rule = _QUICK_OPS.get(members[0].call.op.name)
    if rule is None or sum(_bytes_touched(site) for site in members) > QUICK_BUILD_MAX_BYTES:
        return OPTIMIZED_TARGET, None
    types_allow, guard = rule
    if not all(types_allow(site) for site in members):
        return OPTIMIZED_TARGET, None
    if guard is None:
        return QUICK_TARGET, None
    unknown = False
    for site in members:
        values = _known_values(site)
        if values is None:
            unknown = True
        elif not guard(site, values):
            return OPTIMIZED_TARGET, None
    return QUICK_TARGET, guard if unknown else None
