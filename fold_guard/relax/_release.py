"""Hand a backend's partitioner int8 weights as plain constants: release the barriers, then partition.

``annotate`` keeps a weight as ``dequantize(fold_barrier(<int8 const>))`` through every fold of a
pipeline. A backend's pattern table (``dequantize(is_const(), ...)``) and
``FuseOpsByPattern(bind_constants=True)`` want the constant itself, so right before the
partitioner the barriers go (:func:`ReleaseBarriers`), and from then on nothing may fold
(:func:`partition` runs the partitioner with every ``FoldConstant`` skipped and checks that each
released constant is still in the module, of its own dtype).
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Set, Tuple

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .._tvm.partition import ConstantsView, Partitioned, partition_released
from .._tvm.serial import serialized
from . import _compat
from ._ops import FOLD_BARRIER_OP
from ._stock import LIFT_STOP_OP
from ._translate import check_relax_module

__all__ = ["ReleaseBarriers", "partition", "release_barriers"]

PartitionFn = Callable[[tvm.IRModule], tvm.IRModule]


def _is_barrier(expr: relax.Expr) -> bool:
    return (
        isinstance(expr, relax.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == FOLD_BARRIER_OP
    )


def _is_lift_stop(expr: relax.Expr) -> bool:
    return (
        isinstance(expr, relax.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == LIFT_STOP_OP
    )


@mutator
class _Releaser(PyExprMutator):
    """Drops ``v = fold_barrier(a)`` (and ``stop_lift_params``) and reads ``a`` wherever ``v`` was read.

    A constant operand is put straight into its users (``dequantize(<int8 const>)``: what
    ``is_const()`` matches and ``bind_constants`` binds); a barrier whose variable is visible
    outside its dataflow block becomes ``v = a``.
    """

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.replacement: Dict[relax.Var, relax.Expr] = {}
        self.released: List[relax.Expr] = []

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if _is_lift_stop(binding.value) and isinstance(binding.var, relax.DataflowVar):
            # annotate's stop under a barrier on a weight parameter: its work is done once the
            # weights are lifted, and it would hide the weight from the patterns just as well.
            self.replacement[binding.var] = self.visit_expr(binding.value.args[0])
            return
        if not _is_barrier(binding.value):
            super().visit_var_binding_(binding)
            return
        operand = self.visit_expr(binding.value.args[0])
        self.released.append(operand)
        if isinstance(binding.var, relax.DataflowVar) or _compat.is_constant(operand):
            self.replacement[binding.var] = operand
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, operand))

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.replacement.get(var, var)

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.replacement.get(var, var)


def _release(mod: tvm.IRModule) -> Tuple[tvm.IRModule, List[relax.Expr]]:
    releaser = _Releaser(mod)
    functions = dict(mod.functions)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gvar] = releaser.visit_expr(func)
    released = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    return released, releaser.released


@serialized
def release_barriers(mod: tvm.IRModule) -> tvm.IRModule:
    """Remove every ``fold_barrier``; its operand takes its place. ``mod`` is not changed.

    The step right before a backend's partitioner: ``R.dequantize(R.fold_barrier(<int8 const>),
    s, zp)`` becomes ``R.dequantize(<int8 const>, s, zp)``, which unmodified pattern tables match
    and ``FuseOpsByPattern(bind_constants=True)`` binds into the composite. Where weights are
    parameters, ``annotate``'s ``stop_lift_params`` under a barrier goes too. Nothing may fold
    afterwards (a stock ``FoldConstant`` would now fold the weight to fp32): prefer
    :func:`partition`, which also guards the partitioner.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> w = relax.const(np.ones((4, 4), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         guarded = bb.emit(fgr.fold_barrier(w))
    ...         dq = bb.emit(relax.op.dequantize(guarded, relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> released = fgr.release_barriers(bb.get())
    >>> [b.value.op.name for b in released["main"].body.blocks[0].bindings]
    ['relax.dequantize', 'relax.matmul']
    """
    check_relax_module(mod)
    return _release(mod)[0]


def ReleaseBarriers() -> tvm.transform.Pass:
    """The pass form of :func:`release_barriers`, for the end of a pipeline before a partitioner.

    Notes
    -----
    Run it last before the partitioner: any ``FoldConstant`` after it (stock, fold_guard's, or one
    inside a backend's partition function) folds the released weights. :func:`partition` runs a
    partition function with that guarded.

    Examples
    --------
    >>> import fold_guard.relax as fgr
    >>> fgr.ReleaseBarriers().info.name
    'fold_guard.ReleaseBarriers'
    """

    @tvm.transform.module_pass(opt_level=0, name="fold_guard.ReleaseBarriers")
    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return release_barriers(mod)

    return transform


def partition(mod: tvm.IRModule, partition_fn: PartitionFn) -> Partitioned[tvm.IRModule]:
    """Release the barriers and run ``partition_fn`` on the result with nothing folding.

    ``partition_fn`` is a backend's partitioner as it ships (``relax.backend.contrib.nnapi
    .partition_for_nnapi``, a ``FuseOpsByPattern`` + ``MergeCompositeFunctions`` sequence, CLML's
    ``OpenCLMLOffLoad`` without its codegen step): it sees every weight the annotations kept as a
    plain constant, so unmodified pattern tables match ``dequantize(<int8 const>)`` and
    ``bind_constants=True`` binds the int8 weight into the composite.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module after its last fold (``annotate``, then any pipeline). Not changed.
    partition_fn : Callable[[tvm.IRModule], tvm.IRModule]
        The partitioner. Every pass it runs that is registered as ``FoldConstant`` is skipped
        (and named in ``skipped``): after the release it would fold the int8 weights to fp32.
        What such a fold was for is done already by the pipeline's folds, barriers in place.

    Returns
    -------
    Partitioned
        ``.mod`` the partitioned module; ``.released`` / ``.released_constants`` the barriers
        removed; ``.skipped`` the folding passes skipped.

    Raises
    ------
    PreconditionError
        A released constant is no longer in the result with its own dtype: ``partition_fn``
        folded it, typically in a ``PassContext`` of its own, which the skip does not reach.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from tvm.relax.dpl import is_const, is_op, wildcard
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> w = relax.const(np.ones((4, 4), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         dq = bb.emit(relax.op.dequantize(w, relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> annotated = fgr.annotate(bb.get(), policy="qdq-accelerator").mod
    >>> qmatmul = is_op("relax.matmul")(wildcard(), is_op("relax.dequantize")(is_const(), is_const(), is_const()))
    >>> def partition_for_npu(mod):
    ...     mod = relax.transform.FoldConstant()(mod)  # skipped: it would fold the int8 weight
    ...     return relax.transform.FuseOpsByPattern([("npu.qmatmul", qmatmul)])(mod)
    >>> result = fgr.partition(annotated, partition_for_npu)
    >>> print(result.explain())
    released 1 fold_barrier (1 on constants); folding passes skipped inside the partition function: FoldConstant
    >>> sorted(gv.name_hint for gv in result.mod.get_global_vars())
    ['fused_relax_dequantize_relax_matmul', 'main']
    """
    check_relax_module(mod)
    released, operands = _release(mod)
    return partition_released(released, operands, partition_fn, _CONSTANTS)


def _constant_arrays(mod: tvm.IRModule) -> Set[Hashable]:
    """The arrays every constant of ``mod``'s Relax functions holds (by handle)."""
    present: Set[Hashable] = set()

    def visit(expr: relax.Expr) -> None:
        if _compat.is_constant(expr):
            present.add(_compat.handle(_compat.constant_array(expr)))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return present


#: Arrays, not nodes: a partitioner may copy a constant node into a composite.
_CONSTANTS: ConstantsView[tvm.IRModule, relax.Expr] = ConstantsView(
    is_constant=_compat.is_constant,
    key=lambda c: _compat.handle(_compat.constant_array(c)),
    keys_in=_constant_arrays,
    describe=lambda c: (
        f"{_compat.dtype_of(_compat.type_of(c))}{list(_compat.constant_array(c).shape)}"
    ),
)
