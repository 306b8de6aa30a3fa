"""How many bytes of tensor constants a module's Relax functions hold (the report's before / after)."""

from __future__ import annotations

from typing import Dict, Tuple

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprVisitor, visitor

from .._core.graph import dtype_nbytes
from . import _compat

__all__ = ["constant_bytes"]


@visitor
class _ConstantBytes(PyExprVisitor):
    def __init__(self, sizes: Dict[int, int]) -> None:
        super().__init__()
        self.total = 0
        self.sizes = sizes

    def visit_generic_const_(self, const: relax.Expr) -> None:
        # the output shares most constants with the input: each is sized once per fold
        key = _compat.handle(const)
        size = self.sizes.get(key)
        if size is None:
            size = self.sizes[key] = _tensor_nbytes(_compat.constant_array(const))
        self.total += size


def _tensor_nbytes(value: object) -> int:
    # the tensor's own header, not the constant's type: one read for the shape, none per dim
    if not isinstance(value, tvm.runtime.Tensor):
        return 0
    return dtype_nbytes(str(value.dtype), tuple(value.shape)) or 0


def constant_bytes(before: tvm.IRModule, after: tvm.IRModule) -> Tuple[int, int]:
    """The bytes of the tensor constants in each module's Relax functions."""
    sizes: Dict[int, int] = {}  # by constant handle: every module is alive while they count
    totals = []
    for mod in (before, after):
        counter = _ConstantBytes(sizes)
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                counter.visit_expr(func)
        totals.append(counter.total)
    return totals[0], totals[1]
