"""What the stock pass normalizes in passing: a match cast whose value is a call.

Relax's ONNX importer emits ``lv = R.match_cast(R.nonzero(c), R.Tensor((2, n)))``, the call
nested in the match cast. Stock ``FoldConstant`` (an ``ExprMutator``) rebuilds every call it
visits, and re-emitting a match cast whose value changed normalizes that value into a binding
of its own::

    lv = R.match_cast(R.nonzero(c), ...)   ==>   lv1 = R.nonzero(c)
                                                 lv = R.match_cast(lv1, ...)

fold_guard does the same before it reads the module (:func:`hoist_match_cast_values`), so its
output has stock's form, and the nested call is a call binding the plan decides like any other
(stock would fold it where it can). A module without such a match cast is returned as it is.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .. import _compat

__all__ = ["hoist_match_cast_values"]


def hoist_match_cast_values(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each match cast's call value in a binding of its own; ``mod`` if none has one.

    ``mod`` itself is not changed.
    """
    if not any(
        isinstance(func, relax.Function) and _has_nested_call(func.body)
        for func in mod.functions.values()
    ):
        return mod
    hoister = _Hoister(mod)
    functions = {
        gvar: hoister.visit_expr(func) if isinstance(func, relax.Function) else func
        for gvar, func in mod.functions.items()
    }
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _has_nested_call(body: relax.Expr) -> bool:
    if not isinstance(body, relax.SeqExpr):
        return False
    for block in body.blocks[:]:
        for binding in block.bindings[:]:
            value = binding.value
            if _is_nested_call(binding):
                return True
            if isinstance(value, relax.If) and (
                _has_nested_call(value.true_branch) or _has_nested_call(value.false_branch)
            ):
                return True
            if isinstance(value, relax.Function) and _has_nested_call(value.body):
                return True
    return False


def _is_nested_call(binding: relax.Binding) -> bool:
    """A match cast of a typed call (an untyped one is left alone: normalizing it would write
    types into the caller's nodes; the walk refuses such a module)."""
    return (
        isinstance(binding, relax.MatchCast)
        and isinstance(binding.value, relax.Call)
        and _compat.has_type(binding.value)
    )


@mutator
class _Hoister(PyExprMutator):
    """Emits a match cast's call value as its own binding, as the stock pass's mutator does."""

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        if not _is_nested_call(binding):
            super().visit_match_cast_(binding)
            return
        value = self.builder_.emit(self.visit_expr(binding.value))
        var = self.visit_var_def(binding.var)
        self.builder_.emit_normalized(relax.MatchCast(var, value, binding.ty))
