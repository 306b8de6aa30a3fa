"""Walking Relay IR in tests: the op calls of a module or an expression, in post order."""

from __future__ import annotations

from typing import List, Optional, Union

import tvm
from tvm import relay


def op_calls(
    where: Union[tvm.IRModule, relay.Expr], op_name: Optional[str] = None
) -> List[relay.Call]:
    """Calls of primitive ops (``op_name`` only, if given) in ``where``, nested functions included.

    ``where`` is an expression (a function, say ``mod["main"]``), or a module: then every Relay
    function of it, in the module's order.
    """
    found: List[relay.Call] = []

    def visit(node: object) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            if op_name is None or node.op.name == op_name:
                found.append(node)

    if isinstance(where, tvm.IRModule):
        for func in where.functions.values():
            if isinstance(func, relay.Function):
                relay.analysis.post_order_visit(func, visit)
    else:
        relay.analysis.post_order_visit(where, visit)
    return found
