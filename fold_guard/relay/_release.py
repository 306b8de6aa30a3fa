"""Hand a backend's partitioner int8 weights as plain constants: release the barriers, then partition.

The Relay side of ``fold_guard.relax.partition``: ``annotate`` writes each kept weight as
``qnn.dequantize(fold_barrier(<int8 const>))`` so that ``relay.build``'s QNN lowering and folding
keep it int8; a partitioner's pattern table (``is_constant()`` weights, as in
``tvm.relay.op.contrib``) needs the constant itself, so the barriers go right before it and
nothing folds afterwards (``partition_for_ethosn`` runs ``FoldConstant(fold_qnn=True)`` itself:
:func:`partition` skips it and checks that each released constant survives).
"""

from __future__ import annotations

from typing import Callable, Hashable, List, Set, Tuple

import tvm
from tvm import relay

from .._tvm.partition import ConstantsView, Partitioned, partition_released
from .._tvm.serial import serialized
from ._module import check_relay_module, detached_copy, module_like
from ._ops import FOLD_BARRIER_OP

__all__ = ["ReleaseBarriers", "partition", "release_barriers"]

PartitionFn = Callable[[tvm.IRModule], tvm.IRModule]


class _Releaser(relay.ExprMutator):
    """``fold_barrier(a)`` becomes ``a``; records each released operand."""

    def __init__(self) -> None:
        super().__init__()
        self.released: List[relay.Expr] = []

    def visit_call(self, call: relay.Call) -> relay.Expr:
        if isinstance(call.op, tvm.ir.Op) and call.op.name == FOLD_BARRIER_OP:
            operand = self.visit(call.args[0])
            self.released.append(operand)
            return operand
        return super().visit_call(call)


def _release(mod: tvm.IRModule) -> Tuple[tvm.IRModule, List[relay.Expr]]:
    releaser = _Releaser()
    mod = detached_copy(mod)  # InferType below must not refresh the caller's cached types
    functions = {
        gvar: releaser.visit(func) if isinstance(func, relay.Function) else func
        for gvar, func in mod.functions.items()
    }
    return relay.transform.InferType()(module_like(mod, functions)), releaser.released


@serialized
def release_barriers(mod: tvm.IRModule) -> tvm.IRModule:
    """Remove every ``fold_barrier``; its operand takes its place. ``mod`` is not changed.

    The step right before a backend's partitioner: ``qnn.dequantize(fold_barrier(<int8
    const>), ...)`` becomes ``qnn.dequantize(<int8 const>, ...)``, and ``qnn.conv2d(x,
    fold_barrier(<int8 const>), ...)`` takes its weight as the constant ``is_constant()``
    matches. Nothing may fold afterwards: prefer :func:`partition`, which also guards the
    partitioner. The result is type-checked; its functions are bound to new ``GlobalVar``
    objects of the same names (look them up by name).

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="float32")
    >>> w = fgr.fold_barrier(relay.const(np.ones((4, 4), "int8")))
    >>> dense = relay.nn.dense(x, relay.qnn.op.dequantize(w, relay.const(0.5), relay.const(0)))
    >>> released = fgr.release_barriers(tvm.IRModule.from_expr(relay.Function([x], dense)))
    >>> isinstance(released["main"].body.args[1].args[0], relay.Constant)
    True
    """
    return _release(check_relay_module(mod))[0]


def ReleaseBarriers() -> tvm.transform.Pass:
    """The pass form of :func:`release_barriers`, for the end of a pipeline before a partitioner.

    Notes
    -----
    Run it last before the partitioner: any ``FoldConstant`` after it (stock with
    ``fold_qnn=True``, ``relay.build``'s, or one inside a partition function) folds the released
    weights. :func:`partition` runs a partition function with that guarded.

    Examples
    --------
    >>> import fold_guard.relay as fgr
    >>> fgr.ReleaseBarriers().info.name
    'fold_guard.ReleaseBarriers'
    """

    @tvm.transform.module_pass(opt_level=0, name="fold_guard.ReleaseBarriers")
    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return release_barriers(mod)

    return transform


def partition(mod: tvm.IRModule, partition_fn: PartitionFn) -> Partitioned[tvm.IRModule]:
    """Release the barriers and run ``partition_fn`` on the result with nothing folding.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relay module after its last fold (``annotate``, then any pipeline). Not changed.
    partition_fn : Callable[[tvm.IRModule], tvm.IRModule]
        A backend's partitioner as it ships (``partition_for_arm_compute_lib``, a
        ``MergeComposite`` / ``AnnotateTarget`` / ``PartitionGraph`` sequence). Every pass it runs
        that is registered as ``FoldConstant`` is skipped (and named in ``skipped``): after the
        release it would fold the int8 weights; the pipeline's folds did that work already.

    Returns
    -------
    Partitioned
        ``.mod`` the partitioned module; ``.released`` / ``.released_constants`` the barriers
        removed; ``.skipped`` the folding passes skipped.

    Raises
    ------
    PreconditionError
        A released constant is no longer in the result: ``partition_fn`` folded it, typically in
        a ``PassContext`` of its own, which the skip does not reach.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="float32")
    >>> w = fgr.fold_barrier(relay.const(np.ones((4, 4), "int8")))
    >>> dense = relay.nn.dense(x, relay.qnn.op.dequantize(w, relay.const(0.5), relay.const(0)))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], dense)))
    >>> qdense = is_op("nn.dense")(wildcard(), is_op("qnn.dequantize")(is_constant(), is_constant(), is_constant()))
    >>> def partition_for_npu(mod):
    ...     mod = relay.transform.FoldConstant(fold_qnn=True)(mod)  # skipped: it folds the weight
    ...     return relay.transform.MergeComposite([("npu.qdense", qdense)])(mod)
    >>> result = fgr.partition(mod, partition_for_npu)
    >>> print(result.explain())
    released 1 fold_barrier (1 on constants); folding passes skipped inside the partition function: FoldConstant
    >>> result.mod["main"].body.op.attrs["Composite"]
    'npu.qdense'
    """
    released, operands = _release(check_relay_module(mod))
    return partition_released(released, operands, partition_fn, _CONSTANTS)


def _buffer_address(const: relay.Constant) -> int:
    """The address of the array's data: the same for every node that holds this array."""
    return int(const.data.handle.contents.data or 0)


def _constant_addresses(mod: tvm.IRModule) -> Set[Hashable]:
    """The data addresses of every constant in ``mod``'s Relay functions."""
    present: Set[Hashable] = set()

    def visit(expr: relay.Expr) -> None:
        if isinstance(expr, relay.Constant):
            present.add(_buffer_address(expr))

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    return present


#: Arrays, not nodes: ``MergeComposite`` copies a constant node into the composite.
_CONSTANTS: ConstantsView[tvm.IRModule, relay.Expr] = ConstantsView(
    is_constant=lambda expr: isinstance(expr, relay.Constant),
    key=_buffer_address,
    keys_in=_constant_addresses,
    describe=lambda c: f"{c.data.dtype}{list(c.data.shape)}",
)
