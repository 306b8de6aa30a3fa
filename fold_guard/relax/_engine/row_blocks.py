"""A large quantize or dequantize, computed in blocks of rows on several threads at once.

A quantize or dequantize computes each element of its result from the element at the same place
in its data and from the scale and zero point of that element's channel, and from nothing else.
So rows ``[lo, hi)`` of the result are what the same kernel computes from rows ``[lo, hi)`` of
the data (and of a scale and zero point that run along axis 0, the others whole), and the blocks
can run side by side, each writing its own rows of the one output tensor. Every element is still
computed by the same compiled code, so no bit changes.

A call is split only where that kernel takes fewer rows than the whole: its leading result dim
is symbolic and no other dim shares it (a shape-generic kernel, see ``_translate.shape_generic``), and only at
rows where every tensor a block reads or writes starts on a 64-byte boundary, as TVM requires of
a tensor's data. BERT-tiny's 30522 x 128 word embedding is the case this is for: one call, alone
in its dependency level, that would otherwise keep one thread busy while the other waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tvm

from ..._core.graph import FoldNode, dtype_nbytes
from .. import _compat
from .._sites import CallSite
from .host import NUMPY_EXACT_DTYPES

__all__ = ["ROW_BLOCKS_MIN_BYTES", "ROW_BLOCK_OPS", "RowBlocks", "row_blocks"]

ROW_BLOCK_OPS = frozenset({"relax.quantize", "relax.dequantize"})
#: A call whose result and data are both smaller runs whole: a block would take less time than
#: handing it over.
ROW_BLOCKS_MIN_BYTES = 4 << 20
#: The alignment TVM checks of a tensor's data pointer (``FromDLPack``), and so of each block.
_ALIGNMENT = 64


@dataclass(frozen=True)
class RowBlocks:
    """Where a call splits: the row ranges of its result, and the operands each block slices."""

    bounds: Tuple[Tuple[int, int], ...]
    #: leaf indices whose rows a block reads (the others every block reads whole)
    sliced_leaves: Tuple[int, ...]

    def arguments(
        self,
        arg_map: Sequence[object],
        args: Sequence[Any],
        outputs: Sequence[tvm.runtime.Tensor],
    ) -> List[Tuple[List[Any], List[tvm.runtime.Tensor]]]:
        """Per block, the kernel's arguments and outputs: views of rows ``[lo, hi)`` where sliced.

        ``args`` are the whole call's arguments, ``arg_map[i]`` the leaf index of ``args[i]`` (an
        int) or not (a constant the kernel takes whole).
        """
        sliced = [isinstance(a, int) and a in self.sliced_leaves for a in arg_map]
        arrays = [np.from_dlpack(arg) if cut else None for arg, cut in zip(args, sliced)]
        out_arrays = [np.from_dlpack(out) for out in outputs]
        blocks = []
        for lo, hi in self.bounds:
            block_args = [
                tvm.runtime.from_dlpack(array[lo:hi]) if array is not None else arg
                for arg, array in zip(args, arrays)
            ]
            block_outputs = [tvm.runtime.from_dlpack(array[lo:hi]) for array in out_arrays]
            blocks.append((block_args, block_outputs))
        return blocks


def row_blocks(
    site: CallSite, node: FoldNode, kernel_result: object, blocks: int
) -> Optional[RowBlocks]:
    """How ``node`` (a folded call at ``site``) splits into at most ``blocks`` row blocks, or None.

    ``kernel_result`` is the result type its kernel was legalized for (``Kernel.out_ty``).

    >>> from fold_guard._core.graph import FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard.relax._sites import CallSite, SiteKind
    >>> from tvm import relax
    >>> n = tvm.tirx.Var("n0", "int64")
    >>> data = relax.Var("w", relax.TensorType((30522, 128), "int8"))
    >>> one = relax.const(np.float32(0.5)), relax.const(np.int8(0))
    >>> call = relax.BlockBuilder().normalize(relax.op.dequantize(data, *one, axis=1))
    >>> site = CallSite(0, "main", call, SiteKind.OP, relax.Var("y"), True, (data, *one))
    >>> infos = TensorInfo.of("int8", (30522, 128)), TensorInfo.of("float32", ())
    >>> node = FoldNode(0, "relax.dequantize", "y", "main",
    ...     tuple(NodeInput(InputKind.CONSTANT, "c", i) for i in (infos[0], infos[1], infos[1])),
    ...     (TensorInfo.of("float32", (30522, 128)),))
    >>> row_blocks(site, node, relax.TensorType((n, 128), "float32"), 2).bounds
    ((0, 15261), (15261, 30522))
    """
    if blocks < 2 or site.call.op.name not in ROW_BLOCK_OPS or len(node.outputs) != 1:
        return None
    result = node.outputs[0]
    shape = result.shape
    infos = [inp.tensor for inp in node.inputs]
    if not shape or None in shape or not infos or infos[0] is None or infos[0].shape != shape:
        return None
    # the work is per element: a quantize reads four bytes for each one it writes
    if max(result.nbytes or 0, infos[0].nbytes or 0) < ROW_BLOCKS_MIN_BYTES:
        return None
    rows = int(shape[0])  # type: ignore[arg-type]
    if rows < 2 or not _generic_in_rows(kernel_result, len(shape)):
        return None
    axis = int(site.call.attrs.axis)
    along_rows = (axis % len(shape)) == 0
    sliced = [0]
    for index, info in enumerate(infos[1:], start=1):
        if info is None or info.shape is None:
            return None
        if len(info.shape) == 0 or (len(info.shape) == 1 and not along_rows):
            continue  # one value, or one per channel of another axis: every block reads it whole
        if len(info.shape) == 1 and info.shape[0] == rows:
            sliced.append(index)
            continue
        return None
    cut = [(result.dtype, shape), *((infos[i].dtype, infos[i].shape) for i in sliced)]  # type: ignore[union-attr]
    if not all(str(dtype) in NUMPY_EXACT_DTYPES for dtype, _ in cut):
        return None
    step = 1
    for dtype, dims in cut:
        step = math.lcm(step, _aligned_rows(str(dtype), [int(d or 0) for d in dims or ()]))
    per_block = -(-rows // blocks)
    per_block = -(-per_block // step) * step
    bounds = tuple((lo, min(lo + per_block, rows)) for lo in range(0, rows, per_block))
    if len(bounds) < 2:
        return None
    return RowBlocks(bounds, tuple(sliced))


def _generic_in_rows(kernel_result: object, ndim: int) -> bool:
    """Whether the kernel's result type has a leading symbolic dim that no other dim shares."""
    if not isinstance(kernel_result, _compat.TensorType):
        return False
    dims = getattr(kernel_result.shape, "values", None)
    if dims is None or len(dims) != ndim or not isinstance(dims[0], tvm.tirx.Var):
        return False
    leading = _compat.handle(dims[0])
    return all(
        not (isinstance(dim, tvm.tirx.Var) and _compat.handle(dim) == leading) for dim in dims[1:]
    )


def _aligned_rows(dtype: str, shape: Sequence[int]) -> int:
    """The fewest rows of a ``dtype`` tensor of ``shape`` whose bytes are a multiple of the alignment."""
    row_bytes = dtype_nbytes(dtype, shape[1:]) or 0
    return _ALIGNMENT // math.gcd(row_bytes, _ALIGNMENT) if row_bytes else 1
