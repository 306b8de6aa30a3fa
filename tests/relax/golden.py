"""Before / Expected checks for Relax golden-IR tests (tvm.testing.CompareBeforeAfter is not in 0.27)."""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import tvm
from tvm import relax


def calls_module(make_calls: Callable[[], List[relax.Expr]]) -> tvm.IRModule:
    """``main(x)`` returning ``x`` and each call ``make_calls()`` builds, bound in one dataflow block.

    The run-time input keeps the tuple from being a constant itself.
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(call) for call in make_calls()]
            gv = bb.emit_output(relax.Tuple([x, *outs]))
        bb.emit_func_output(gv)
    return bb.get()


def op_calls(mod: tvm.IRModule, op_name: str) -> List[relax.Call]:
    """Every call of the operator ``op_name`` in the module's Relax functions, in post order."""
    found: List[relax.Call] = []

    def visit(node: relax.Expr) -> None:
        if (
            isinstance(node, relax.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name == op_name
        ):
            found.append(node)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


#: The Relax constant node class: ``tvm.ir.GenericConst`` on 0.27, ``relax.Constant`` before.
CONSTANT_TYPE = getattr(tvm.ir, "GenericConst", None) or relax.Constant


def constant_operands(mod: tvm.IRModule, op_name: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """(dtype, shape) of the constant first argument of every call to ``op_name``."""
    arrays = [
        call.args[0].value.numpy()
        for call in op_calls(mod, op_name)
        if isinstance(call.args[0], CONSTANT_TYPE)
    ]
    return [(str(array.dtype), tuple(array.shape)) for array in arrays]


def binding_names(mod: tvm.IRModule) -> Dict[str, List[str]]:
    """function name -> binding variable names, in order (structural equality ignores names)."""
    return {
        gvar.name_hint: [b.var.name for block in func.body.blocks for b in block.bindings]
        for gvar, func in mod.functions.items()
        if isinstance(func, relax.Function)
    }


def check_before_after(
    before: tvm.IRModule, expected: tvm.IRModule, transform: Callable[[tvm.IRModule], tvm.IRModule]
) -> tvm.IRModule:
    """Structure and binding names equal ``expected``; ``before`` itself left untouched."""
    saved = tvm.ir.save_json(before)
    after = transform(before)
    tvm.ir.assert_structural_equal(after, expected)
    assert binding_names(after) == binding_names(expected)
    assert tvm.ir.save_json(before) == saved, "the pass mutated its input"
    return after
