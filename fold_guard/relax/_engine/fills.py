"""Folded calls whose every element has one bit pattern: written without a kernel, or not at all.

ONNX model-zoo weights arrive as ``ConstantOfShape``, which Relax imports as ``broadcast_to`` of a
one-element constant: hundreds of MiB of one value, each from a kernel LLVM compiled at ``-O3``
for seconds. Such a result is known without running anything: a kernel that writes every
element of its outputs once, each from a plain load or an immediate (``movement.Movement.fills``),
writes the bits it loads, and if every tensor it loads holds one bit pattern ``B`` in all its
elements and every immediate it stores is ``B`` too, it writes ``B`` everywhere. Sources that
hold one pattern: a constant of one element, and another fill. So ``permute_dims`` of
``broadcast_to(c, shape)`` is a fill of ``c`` as well, and its ``broadcast_to`` never needs to
exist in memory: a fill that only other fills read, and that nothing else needs (``release``),
stays a :class:`LazyFill` and is dropped unwritten.

Exactness: the result's bytes are ``B`` repeated, written through an unsigned-integer view of
the output, so no float conversion touches them (NaN payloads included). An immediate is
compared with ``B`` after TVM's own conversion (``np.array(value, dtype)``, round to nearest as
LLVM's constant); a NaN immediate never makes a fill. The stock pass compiles a 0-d constant
operand into the kernel as an immediate (``_stock``), which for a kernel that only moves data
stores the same bits for every value but a NaN (its payload passes through a Python float): a
0-d NaN source never makes a fill either, and such a call keeps the ``STOCK`` way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tvm

from ..._core.graph import FoldNode, InputKind
from .. import _compat
from .._sites import CallSite, KernelSpec
from .host import NUMPY_EXACT_DTYPES
from .movement import Movement

__all__ = ["FILL_PARTS_MIN_BYTES", "LazyFill", "fill_parts", "fill_scalar"]

#: A fill at least this large is written in one part per thread: the first write to fresh
#: memory (a page fault per 4 KiB) is most of its cost, and it scales with the cores.
FILL_PARTS_MIN_BYTES = 4 << 20


def _uniform_constant(array: tvm.runtime.Tensor) -> Optional[np.ndarray]:
    """The one element of a one-element tensor, as a 0-d array of its dtype; else None."""
    if str(array.dtype) not in NUMPY_EXACT_DTYPES or int(np.prod(array.shape, dtype=np.int64)) != 1:
        return None
    return np.from_dlpack(array).reshape(()).copy()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def fill_scalar(
    site: CallSite,
    node: FoldNode,
    kernel: KernelSpec,
    movement: Optional[Movement],
    fills: Mapping[int, np.ndarray],
) -> Optional[np.ndarray]:
    """The bits every element of ``node``'s outputs has, if the call is a fill; else None.

    ``movement`` is what its kernel does (None: it computes); ``fills`` the scalars of the nodes
    already known to be fills.
    """
    if movement is None:
        return None
    scalars: List[np.ndarray] = []
    for position in movement.sources:
        arg = kernel.arg_map[position] if position < len(kernel.arg_map) else None
        if isinstance(arg, int):
            scalar = _leaf_scalar(site, node, arg, fills)
        elif isinstance(arg, tvm.runtime.Tensor):
            scalar = _uniform_constant(arg)
        else:
            scalar = None
        if scalar is None:
            return None
        scalars.append(scalar)
    for dtype, value in movement.immediates:
        if dtype not in NUMPY_EXACT_DTYPES:
            return None
        immediate = np.array(value, dtype=dtype)
        if immediate.dtype.kind == "f" and np.isnan(immediate):
            return None
        scalars.append(immediate)
    if not scalars or not all(_same_bits(s, scalars[0]) for s in scalars[1:]):
        return None
    if any(str(out.dtype) != str(scalars[0].dtype) for out in node.outputs):
        return None
    return scalars[0] if movement.fills else None  # the coverage walk last: it costs most


def _leaf_scalar(
    site: CallSite, node: FoldNode, leaf: int, fills: Mapping[int, np.ndarray]
) -> Optional[np.ndarray]:
    constant = site.leaf_constants[leaf] if leaf < len(site.leaf_constants) else None
    if constant is not None:
        array = _compat.constant_array(constant)
        scalar = _uniform_constant(array)
        if scalar is not None and len(array.shape) == 0 and scalar.dtype.kind == "f":
            if np.isnan(scalar):
                return None  # stock compiles a 0-d operand in; a NaN's payload may not survive
        return scalar
    source = node.inputs[leaf]
    if source.kind is InputKind.NODE:
        return fills.get(source.source)
    return None


@dataclass(frozen=True)
class LazyFill:
    """A fill not written yet: the value of a fill only other fills read (see the module docstring)."""

    scalar: np.ndarray
    shape: Tuple[int, ...]

    def materialize(self) -> tvm.runtime.Tensor:
        """The fill written into a new tensor."""
        out = tvm.runtime.empty(self.shape, str(self.scalar.dtype), tvm.cpu(0))
        words, bits = _words(out, self.scalar)
        words.fill(bits)
        return out


def _words(out: tvm.runtime.Tensor, scalar: np.ndarray) -> Tuple[np.ndarray, np.generic]:
    """``out``'s elements as unsigned integers of their width, and ``scalar``'s bits as one."""
    word = np.dtype(f"u{scalar.dtype.itemsize}")
    return np.from_dlpack(out).reshape(-1).view(word), scalar.reshape(1).view(word)[0]


def fill_parts(out: tvm.runtime.Tensor, scalar: np.ndarray, parts: int) -> List[Callable[[], None]]:
    """Functions that together write ``scalar``'s bits into every element of ``out``.

    One per part of ``out``'s elements (at most ``parts``; one below
    :data:`FILL_PARTS_MIN_BYTES`), so that threads may write them at once.

    >>> out = tvm.runtime.empty((2, 3), "float32")
    >>> for part in fill_parts(out, np.array(np.nan, "float32"), 2):
    ...     part()
    >>> out.numpy().view("uint32").tolist() == [[0x7FC00000] * 3] * 2
    True
    """
    words, bits = _words(out, scalar)
    if not words.size:
        return []
    count = max(1, parts) if words.nbytes >= FILL_PARTS_MIN_BYTES else 1
    step = -(-words.size // count)
    pieces: Sequence[np.ndarray] = [words[lo : lo + step] for lo in range(0, words.size, step)]

    def write(piece: np.ndarray) -> Callable[[], None]:
        return lambda: piece.fill(bits)

    return [write(piece) for piece in pieces]
