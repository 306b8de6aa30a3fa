"""Folded calls that only move data, computed by NumPy instead of a compiled kernel.

A reshape, a transpose, an ``expand_dims`` or a gather copies elements and computes nothing: the
TIR kernel the stock pass compiles for one loads each element and stores it unchanged, and
NumPy's copy writes the same bytes (NaN payloads included: nothing is converted). On real models
most distinct kernels are such copies, one per bias shape (MobileNetV2 has 13 bias reshapes of
different sizes among its 19 kernels), and each costs LLVM about as much as a quantize does.

Only the evaluation changes: a call is still legalized like every other (so the decision whether
the stock pass would fold it is taken on the same TIR), its kernel is just never compiled. Where
a copy's result is undefined in TIR (``take`` in ``fast`` mode with an index out of bounds: the
kernel reads outside its buffer), the host function raises instead, so the call is kept and the
report says why, rather than folding whatever memory the kernel would have read.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax

from .. import _compat
from .._sites import CallSite, StaticShapeVar

__all__ = [
    "HOST_OPS",
    "NUMPY_EXACT_DTYPES",
    "HostFunction",
    "UndefinedResultError",
    "host_function",
    "run_host",
]


class UndefinedResultError(IndexError):
    """A copy whose result the stock kernel leaves undefined: the call is kept, not folded."""


#: leaf arrays, result shape -> the result
HostFunction = Callable[[Sequence[np.ndarray], Tuple[int, ...]], np.ndarray]

#: Data types whose every bit pattern NumPy holds and copies unchanged (no bfloat16, float8 or
#: sub-byte types, which NumPy would widen or pack differently).
NUMPY_EXACT_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
)


def _reshaped(leaves: Sequence[np.ndarray], shape: Tuple[int, ...]) -> np.ndarray:
    # Row-major reshape keeps the element order, which is what every one of these ops means.
    return np.reshape(leaves[0], shape)


def _permute(axes: Optional[Tuple[int, ...]]) -> HostFunction:
    def permute(leaves: Sequence[np.ndarray], shape: Tuple[int, ...]) -> np.ndarray:
        return np.transpose(leaves[0], axes)

    return permute


def _take(axis: Optional[int], mode: str) -> HostFunction:
    def take(leaves: Sequence[np.ndarray], shape: Tuple[int, ...]) -> np.ndarray:
        data, indices = leaves
        if mode in ("clip", "wrap"):
            # NumPy's modes are TOPI's: clamp into [0, n - 1]; wrap modulo n, negatives too.
            return np.take(data, indices, axis=axis, mode=mode)  # type: ignore[call-overload]
        extent = data.size if axis is None else data.shape[axis]
        if indices.size and (indices.min() < 0 or indices.max() >= extent):
            raise UndefinedResultError(
                f"take in {mode!r} mode reads index {int(indices.min())}..{int(indices.max())} "
                f"of an axis of {extent}: the kernel's result is undefined there"
            )
        return np.take(data, indices, axis=axis)

    return take


def _shape_values(site: CallSite) -> Optional[Tuple[int, ...]]:
    arg = site.template_args[0] if site.template_args else None
    if isinstance(arg, StaticShapeVar):
        return arg.values
    if isinstance(arg, relax.ShapeExpr):
        return tuple(int(v) for v in arg.values)
    return None


def _shape_to_tensor(site: CallSite) -> Optional[HostFunction]:
    values = _shape_values(site)
    if values is None:
        return None
    return lambda leaves, shape: np.array(values, dtype="int64").reshape(shape)


def _permute_of(site: CallSite) -> HostFunction:
    axes = site.call.attrs.axes
    return _permute(None if axes is None else tuple(int(a) for a in axes))


def _take_of(site: CallSite) -> HostFunction:
    attrs = site.call.attrs
    return _take(None if attrs.axis is None else int(attrs.axis), str(attrs.mode))


#: op -> how to make its host function for one call (None: that call needs its kernel)
_HOST_FUNCTIONS: Dict[str, Callable[[CallSite], Optional[HostFunction]]] = {
    **{
        f"relax.{name}": lambda site: _reshaped
        for name in ("reshape", "expand_dims", "squeeze", "flatten")
    },
    "relax.permute_dims": _permute_of,
    "relax.take": _take_of,
    "relax.shape_to_tensor": _shape_to_tensor,
}
#: The ops :func:`host_function` may answer for.
HOST_OPS = frozenset(_HOST_FUNCTIONS)


def host_function(site: CallSite) -> Optional[HostFunction]:
    """How NumPy computes ``site``'s result exactly, or None if it needs its compiled kernel.

    Every tensor it reads and writes must be of a type NumPy copies bit for bit.

    >>> from fold_guard.relax._sites import CallSite, SiteKind
    >>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    >>> call = relax.BlockBuilder().normalize(relax.op.permute_dims(x))
    >>> site = CallSite(0, "main", call, SiteKind.OP, relax.Var("y"), True, (x,), (None,), (0,))
    >>> host_function(site)([np.arange(6, dtype="float32").reshape(2, 3)], (3, 2)).tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    if site.call.op.name not in HOST_OPS:
        return None
    result_types = _compat.flatten_types(_compat.type_of(site.call))
    dtypes = [_compat.dtype_of(_compat.type_of(leaf)) for leaf in site.leaves]
    dtypes += [_compat.dtype_of(t) for t in result_types]
    if len(result_types) != 1 or not all(str(d) in NUMPY_EXACT_DTYPES for d in dtypes):
        return None
    return _HOST_FUNCTIONS[site.call.op.name](site)


def run_host(
    function: HostFunction,
    leaves: Sequence[tvm.runtime.Tensor],
    out: tvm.runtime.Tensor,
    *,
    striped: bool = True,
) -> tvm.runtime.Tensor:
    """Run ``function`` on tensors into ``out`` (a new tensor of the result's type), and return ``out``.

    The operands are read and the result written in place through DLPack, so a reshape or a
    transpose copies its elements once, as its kernel would. ``striped`` lets a large 2-D
    transpose be copied in stripes (:func:`_copy`).
    """
    target = np.from_dlpack(out)
    # np.asarray: np.take of a 0-d index gives a NumPy scalar
    result = np.asarray(function([np.from_dlpack(leaf) for leaf in leaves], target.shape))
    if result.shape != target.shape or result.dtype != target.dtype:
        raise ValueError(
            f"host copy gave {result.dtype}{list(result.shape)}, "
            f"expected {target.dtype}{list(target.shape)}"
        )
    if striped:
        _copy(target, result)
    else:
        np.copyto(target, result)
    return out


#: Source rows (target columns) per stripe of a transpose copied in stripes (:func:`_copy`):
#: each target row gets that many consecutive elements per visit, and that many source rows
#: are read side by side. Measured best here for float32 and int8 weights of 384 to 3072 columns.
_STRIPE = 16
#: A source row stride that is a multiple of this sends every element a transpose reads to one
#: group of cache sets (a 2048-column float32 matrix: 8 KiB apart), so each load misses.
_ALIASING_STRIDE = 2048
#: Below this many bytes a copy costs less than the Python loop over its stripes.
_STRIPED_MIN_BYTES = 1 << 20


def _copy(target: np.ndarray, source: np.ndarray) -> None:
    """``np.copyto(target, source)``: the same bytes, the 2-D transposes that alias in stripes.

    NumPy copies in the target's order, so a transposed ``source`` is read down its columns; at
    a power-of-two row stride those reads all compete for a few cache sets and a 1000 x 2048
    float32 transpose is slow. Copied 16 source rows at a time, each stripe reads those rows
    front to back and writes 16 consecutive elements of every target row (``bench/README.md``
    has what that buys).
    """
    if (
        source.ndim != 2
        or source.nbytes < _STRIPED_MIN_BYTES
        or source.strides[0] != source.itemsize
        or source.strides[1] % _ALIASING_STRIDE
    ):
        np.copyto(target, source)
        return
    for start in range(0, source.shape[1], _STRIPE):
        stripe = slice(start, start + _STRIPE)
        np.copyto(target[:, stripe], source[:, stripe])
