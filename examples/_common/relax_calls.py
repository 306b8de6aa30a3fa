"""Finding operator calls in a Relax module: what the examples count in their tables.

One visitor for every example that asks "how many ``relax.quantize`` are left on a constant" or
"which weights are still ``dequantize(<int8 constant>)``".
"""

from __future__ import annotations

from typing import List, Optional

import tvm
from tvm import relax


def calls_of(
    mod: tvm.IRModule,
    op_name: str,
    *,
    on_constant: bool = False,
    dtype: Optional[str] = None,
) -> List[relax.Call]:
    """The calls of ``op_name`` in every Relax function of ``mod``, in post order.

    With ``on_constant``, only calls whose first argument is a constant; with ``dtype``, only
    calls whose first argument is a constant of that dtype.

    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = bb.emit(relax.op.dequantize(relax.const(np.ones((4, 4), "int8")),
    ...                                         relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, w))
    ...     _ = bb.emit_func_output(y)
    >>> mod = bb.get()
    >>> len(calls_of(mod, "relax.dequantize", dtype="int8")), len(calls_of(mod, "relax.matmul"))
    (1, 1)
    >>> len(calls_of(mod, "relax.matmul", on_constant=True))
    0
    """
    found: List[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if not (
            isinstance(expr, relax.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == op_name
        ):
            return
        operand = expr.args[0] if expr.args else None
        if on_constant or dtype is not None:
            if not isinstance(operand, tvm.ir.GenericConst):
                return
            if dtype is not None and str(operand.ty.dtype) != dtype:
                return
        found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found
