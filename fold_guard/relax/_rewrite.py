"""Apply a plan: replace folded calls by their constants, the way the stock pass rewrites.

The rewrite mirrors stock ``FoldConstant`` so that, under the ``default`` policy, the result is
structurally equal to it (the rules are listed in :mod:`fold_guard.relax._stock`): a folded
binding becomes ``v = constant``; every use of a variable bound to a constant is replaced by the
constant; operator calls get variables bound to ``ShapeExpr`` substituted into their arguments
where stock does it; finally ``remove_all_unused`` drops dead bindings of every function, whether
or not anything folded in it.
"""

from __future__ import annotations

from typing import Dict, List, Mapping

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _compat
from ._stock import substitutes_shape_arguments

__all__ = ["rewrite_function"]


@mutator
class _FoldRewriter(PyExprMutator):
    """Rewrites one function; ``replacements`` maps binding variables to their folded value."""

    def __init__(self, mod: tvm.IRModule, replacements: Mapping[relax.Var, relax.Expr]):
        super().__init__(mod)
        self.replacements = replacements
        self.current_var = None

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.current_var = binding.var
        super().visit_var_binding_(binding)
        self.current_var = None

    def _constant_for(self, var: relax.Var) -> relax.Expr:
        bound = self.lookup_binding(var)
        return bound if _compat.is_constant(bound) else None

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        constant = self._constant_for(var)
        return constant if constant is not None else super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        constant = self._constant_for(var)
        return constant if constant is not None else super().visit_dataflow_var_(var)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        binding_var = self.current_var
        post = super().visit_call_(call)
        if binding_var is not None and binding_var in self.replacements:
            return self.replacements[binding_var]
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
        return relax.Call(post.op, new_args, post.attrs, post.ty_args, post.span)


def rewrite_function(
    mod: tvm.IRModule, func: relax.Function, replacements: Dict[relax.Var, relax.Expr]
) -> relax.Function:
    """``func`` with ``replacements`` applied, constants propagated and dead bindings removed."""
    rewritten = _FoldRewriter(mod, replacements).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)
