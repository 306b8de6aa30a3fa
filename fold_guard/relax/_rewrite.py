"""The rewrite: the module with every folded call replaced by its value, the way the stock pass
rewrites, and the constant bytes counted before and after.

:func:`rewrite_module` gives each function its folded values. The rewrite mirrors stock
``FoldConstant`` so that, under the ``default`` policy, the result is structurally equal to it (the
rules are listed in :mod:`fold_guard.relax._stock`): a folded binding becomes ``v = constant``;
every use of a variable bound to a constant is replaced by the constant; operator calls get
variables bound to ``ShapeExpr`` substituted into their arguments where stock does it; finally
``remove_all_unused`` drops dead bindings of every function, whether or not anything folded in it.

Which values the engine dropped early is not worked out again here: the coordinator decided it
once per plan (``_core.driver.releasable``), handed it to the engine, and hands the same decision
here, where a folded call with no value must be one of them.

Operator calls are rebuilt here, not by TVM's ``ExprMutator``: that one rebuilds a call whose
arguments changed with no result type, so the normalizer infers it again, which for a
``conv2d`` is slow (layout conversions): most of a CNN's rewrite. Type
inference reads only the argument types (never a constant's values), so when every replaced
argument has the type of the variable it replaces, the inferred type is the call's own type,
and the rebuilt call keeps it.
"""

from __future__ import annotations

from typing import AbstractSet, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor

from .._core.errors import PlanInvariantError
from .._core.graph import dtype_nbytes
from .._core.planner import FoldPlan
from . import _compat
from ._sites import Translation
from ._stock import substitutes_shape_arguments

__all__ = ["constant_bytes", "rewrite_module"]


@mutator
class _FoldRewriter(PyExprMutator):
    """Rewrites one function; ``replacements`` maps binding variables (by handle) to their folded value."""

    def __init__(
        self,
        mod: tvm.IRModule,
        replacements: Mapping[int, relax.Expr],
        released: AbstractSet[int] = frozenset(),
    ):
        super().__init__(mod)
        self.replacements = replacements
        self.released = released
        self.current_var = None
        #: folded bindings left out of the output, by variable handle: their constant
        self.dropped: Dict[int, relax.Expr] = {}
        #: per op name: whether the normalizer rewrites its calls (FNormalize); those take
        #: TVM's own path
        self._normalizes: Dict[str, bool] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        key = _compat.handle(var)
        if key in self.released:
            return  # folded, and read only by folded calls: no use of it survives
        value = self.replacements.get(key)
        if value is not None and self._is_dead_once_propagated(var, value):
            # ``v = constant`` would be emitted and then removed by ``remove_all_unused``, and
            # that removal costs time in the number of bindings it removes times the number it
            # keeps; uses of ``v`` get the constant from ``dropped``.
            self.dropped[key] = value
            return
        self.current_var = var
        super().visit_var_binding_(binding)
        self.current_var = None

    @staticmethod
    def _is_dead_once_propagated(var: relax.Var, value: relax.Expr) -> bool:
        """Whether no use of ``var`` survives: each one becomes the constant.

        So it is when the binding would be re-emitted under the same variable, i.e. the
        constant has the variable's type (otherwise the mutator renames the variable, and the
        stock rewrite leaves uses of the new one).
        """
        return _compat.is_constant(value) and bool(
            tvm_ffi.structural_equal(_compat.type_of(value), _compat.type_of(var))
        )

    def _bound_value(self, var: relax.Var) -> Optional[relax.Expr]:
        dropped = self.dropped.get(_compat.handle(var))
        return dropped if dropped is not None else self.lookup_binding(var)

    def _constant_for(self, var: relax.Var) -> relax.Expr:
        bound = self._bound_value(var)
        return bound if _compat.is_constant(bound) else None

    def _check_not_released(self, var: relax.Var) -> None:
        if _compat.handle(var) in self.released:
            raise PlanInvariantError(
                f"the folded call bound to {_compat.var_name(var)} is still used after its value "
                "was dropped; please report it"
            )

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        self._check_not_released(var)
        constant = self._constant_for(var)
        return constant if constant is not None else super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        self._check_not_released(var)
        constant = self._constant_for(var)
        return constant if constant is not None else super().visit_dataflow_var_(var)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        binding_var = self.current_var
        if binding_var is not None:
            # a folded call's arguments are constants or variables: visiting them first, as
            # stock does, changes nothing that survives
            replacement = self.replacements.get(_compat.handle(binding_var))
            if replacement is not None:
                return replacement
        rebuilt = self._rebuild_operator_call(call)
        if rebuilt is not None:
            return rebuilt
        post = super().visit_call_(call)
        if not isinstance(post, relax.Call) or not substitutes_shape_arguments(post):
            return post
        new_args: List[relax.Expr] = []
        changed = False
        for arg in post.args:
            if isinstance(arg, relax.Var):
                bound = self.lookup_binding(arg)
                if isinstance(bound, relax.ShapeExpr):
                    new_args.append(bound)
                    changed = True
                    continue
            new_args.append(arg)
        if not changed:
            return post
        return _compat.rebuild_call(post, new_args)

    def _rebuild_operator_call(self, call: relax.Call) -> Optional[relax.Expr]:
        """``call`` with its arguments rewritten, as TVM's path gives it; None to take that path.

        Taken for operator calls without type arguments whose op has no FNormalize, when no
        argument variable was renamed by the mutator (a re-emitted binding whose type changed).
        """
        op = call.op
        if not isinstance(op, tvm.ir.Op) or len(call.ty_args) or self._op_normalizes(op):
            return None
        args = call.args[:]
        new_args: List[relax.Expr] = []
        same_types = True
        changed = False
        for arg in args:
            new = self._visit_argument(arg, call)
            if new is None:
                return None
            if not new.same_as(arg):
                changed = True
                same_types = same_types and bool(
                    tvm_ffi.structural_equal(_compat.type_of(new), _compat.type_of(arg))
                )
            new_args.append(new)
        if not changed:
            return call
        return _compat.rebuild_call(
            call, new_args, ty=_compat.type_of(call) if same_types else None
        )

    def _visit_argument(self, arg: relax.Expr, call: relax.Call) -> Optional[relax.Expr]:
        if not isinstance(arg, relax.Var):
            return self.visit_expr(arg)
        bound = self._bound_value(arg)
        if _compat.is_constant(bound):
            return bound
        visited = (
            super().visit_dataflow_var_(arg)
            if isinstance(arg, relax.DataflowVar)
            else super().visit_var_(arg)
        )
        if not visited.same_as(arg):
            return None  # renamed: TVM's path looks the new variable up
        # asked only here: the rule reads the call's type and arguments, and few arguments are
        # variables bound to shapes
        if isinstance(bound, relax.ShapeExpr) and substitutes_shape_arguments(call):
            return bound
        return visited

    def _op_normalizes(self, op: tvm.ir.Op) -> bool:
        name = op.name
        normalizes = self._normalizes.get(name)
        if normalizes is None:
            normalizes = self._normalizes[name] = op.get_attr("FNormalize") is not None
        return normalizes


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
        functions[gvar] = _rewrite_function(mod, func, replacements[name], dropped[name])
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _rewrite_function(
    mod: tvm.IRModule,
    func: relax.Function,
    replacements: Mapping[int, relax.Expr],
    released: AbstractSet[int] = frozenset(),
) -> relax.Function:
    """``func`` with ``replacements`` applied, constants propagated and dead bindings removed.

    ``replacements`` maps the handle (``_compat.handle``) of each folded binding's variable to
    its folded value. ``released`` holds the handles of folded bindings whose values were
    dropped because only folded calls read them: they are left out, as ``remove_all_unused``
    would remove them; a use of one that survives is a PlanInvariantError.
    """
    rewritten = _FoldRewriter(mod, replacements, released).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


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
