"""Apply an evaluated plan to the module, and count the constant bytes before and after.

:func:`rewrite_module` gives each function its folded values (``_rewrite`` rewrites one function
the way the stock pass does). Which values the engine dropped early is not worked out again
here: the driver decided it once per plan (``_core.driver.releasable``), handed it to the engine,
and hands the same decision here, where a folded call with no value must be one of them.
"""

from __future__ import annotations

from typing import AbstractSet, Dict, Mapping, Sequence, Set, Tuple

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprVisitor, visitor

from .._core.errors import PlanInvariantError
from .._core.graph import dtype_nbytes
from .._core.planner import FoldPlan
from . import _compat
from ._rewrite import rewrite_function
from ._walk import Translation

__all__ = ["constant_bytes", "rewrite_module"]


def rewrite_module(
    mod: tvm.IRModule,
    translation: Translation,
    fold_plan: FoldPlan,
    values: Mapping[int, Sequence[object]],
    released: AbstractSet[int],
) -> tvm.IRModule:
    """``mod`` with every folded call of ``fold_plan`` replaced by its value.

    ``released`` are the folded nodes whose values the engine was allowed to drop (every
    consumer folded and evaluated); a folded node without a value must be one of them.
    """
    # keyed by the variable's handle: a dict of Relax variables compares them with a slow ``==``
    replacements: Dict[str, Dict[int, relax.Expr]] = {name: {} for name in translation.functions}
    dropped: Dict[str, Set[int]] = {name: set() for name in translation.functions}
    for decision in fold_plan.folded:
        site = translation.sites[decision.node]
        if decision.node not in values:
            if decision.node not in released:
                raise PlanInvariantError(
                    f"fold_guard has no value for the folded call {site.var} although the "
                    "rewrite needs it; please report it"
                )
            dropped[site.function].add(_compat.handle(site.var))
            continue
        outputs = [
            v if isinstance(v, relax.ShapeExpr) else _compat.make_constant(v)
            for v in values[decision.node]
        ]
        is_tuple = isinstance(_compat.type_of(site.call), _compat.TupleType)
        replacements[site.function][_compat.handle(site.var)] = (
            relax.Tuple(outputs) if is_tuple else outputs[0]
        )
    functions = dict(mod.functions)
    for name, (gvar, func) in translation.functions.items():
        functions[gvar] = rewrite_function(mod, func, replacements[name], dropped[name])
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


@visitor
class _ConstantBytes(PyExprVisitor):
    def __init__(self, sizes: Dict[int, int]) -> None:
        super().__init__()
        self.total = 0
        self.sizes = sizes
        #: the constants counted in this module: one read in two places is one tensor
        self.counted: Set[int] = set()

    def visit_generic_const_(self, const: relax.Expr) -> None:
        # the output shares most constants with the input: each is sized once per fold
        key = _compat.handle(const)
        if key in self.counted:
            return
        self.counted.add(key)
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
    """The bytes of the tensor constants in each module's Relax functions, each constant once
    however many calls read it (an embedding table read by ``take`` and by ``shape_of``)."""
    sizes: Dict[int, int] = {}  # by constant handle: every module is alive while they count
    totals = []
    for mod in (before, after):
        counter = _ConstantBytes(sizes)
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                counter.visit_expr(func)
        totals.append(counter.total)
    return totals[0], totals[1]
