"""Annotate a Relax module so that it carries a policy's decisions as fold_barrier / fold_allow."""

from __future__ import annotations

from typing import Dict, List, Sequence

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .._core.annotate import Annotated, Placement, placements
from .._core.builtin_policies import DEFAULT_POLICY
from .._core.graph import Annotation
from .._core.planner import plan_folds
from .._core.registry import PolicySpec
from .._tvm.serial import serialized
from . import _compat
from ._ledger import attach_ledger
from ._ops import fold_allow, fold_barrier
from ._sites import CallSite
from ._translate import analyse

__all__ = ["annotate"]


@serialized
def annotate(
    mod: tvm.IRModule, *, policy: PolicySpec = "qdq-accelerator", ledger: bool = False
) -> Annotated:
    """Place the annotations that make any later fold follow ``policy``; return them with the module.

    Meant for a module fresh from a frontend (``relax.frontend.onnx.from_onnx(model,
    keep_params_in_input=False)`` of a QDQ model, say): the module then carries the policy's
    decisions itself, so they hold through every later pass, including the stock
    ``relax.transform.FoldConstant`` of a pipeline you do not control.

    - ``fold_barrier`` on the first operand of each call ``policy`` keeps (by a rule of its own)
      although the default would fold it: ``R.dequantize(R.fold_barrier(w_int8), ...)`` stays a
      dequantize of an int8 constant through any ``FoldConstant``.
    - ``fold_allow`` around the root of each constant subgraph ``policy`` folds and the default
      would not (a policy that folds more than the stock pass).

    - Where weights are parameters of a function with ``num_input`` (``from_onnx(...,
      keep_params_in_input=True)``), a call the policy keeps on a weight gets
      ``fold_barrier(stop_lift_params(x))``, and so does every barrier already over a weight:
      ``relax.transform.LiftTransformParams`` then keeps the barrier and what reads it in
      ``main`` and lifts only what the policy folds (``quantize(w)``), removing the stop.

    ``ledger=True`` also writes the precision ledger of the policy's plan (one row per weight:
    folded, kept or lifted, and by which rule) as the ``fold_guard.ledger`` module attribute,
    read back by :func:`fold_guard.relax.ledger`.

    ``fold_guard.relax.FoldConstant()`` with the default policy on the result then folds exactly
    what ``FoldConstant(policy)`` folds on ``mod`` (plus the annotations it keeps). ``mod`` is not
    changed. A backend's pattern table sees ``R.dequantize(R.fold_barrier(<constant>), ...)``:
    run its partitioner through :func:`partition` (after the last fold), which releases the
    barriers so unmodified tables match the constant and bind it into their composites.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    >>> w = relax.const(np.ones((4, 4), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         dq = bb.emit(relax.op.dequantize(w, relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> annotated = fgr.annotate(bb.get())
    >>> print(annotated.explain())
    placed 1 annotation for policy 'qdq-accelerator': 0 fold_allow, 1 fold_barrier
      main: fold_barrier on const: int8[4, 4] (input 0 of lv = relax.dequantize) [keep-dequantize-of-integer-constant]
    >>> folded = relax.transform.FoldConstant()(annotated.mod)  # the stock pass keeps it too
    >>> [b.value.op.name for b in folded["main"].body.blocks[0].bindings]
    ['relax.fold_barrier', 'relax.dequantize', 'relax.matmul']
    """
    analysis = analyse(mod, policy)
    translation, graph, resolved = analysis.translation, analysis.graph, analysis.policy
    policy_plan = plan_folds(graph, resolved)
    placed = placements(policy_plan, plan_folds(graph, DEFAULT_POLICY))
    by_function: Dict[str, Dict[relax.Var, List[Placement]]] = {}
    for placement in placed:
        site = translation.sites[placement.node]
        by_function.setdefault(site.function, {}).setdefault(site.var, []).append(placement)
    functions = dict(mod.functions)
    uncarried: List[Placement] = []
    for name, (gvar, func) in translation.functions.items():
        if name in by_function:
            annotator = _Annotator(analysis.mod, by_function[name], translation.sites)
            functions[gvar] = annotator.visit_expr(func)
            uncarried += annotator.uncarried
    annotated = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    if ledger:  # the rows of the plan the annotations carry (what a later fold or lift does)
        annotated = attach_ledger(annotated, policy_plan, translation.sites)
    return Annotated(annotated, placed, resolved.name, tuple(uncarried))


#: Creation ops with no tensor operand that have an equivalent with one: ``full(shape, fill)``.
_FILL_VALUE = {"relax.zeros": 0, "relax.ones": 1}


@mutator
class _Annotator(PyExprMutator):
    """Re-emits the placed bindings: ``v = f(fold_barrier(a), ...)``, ``v = fold_allow(f(...))``."""

    def __init__(
        self, mod: tvm.IRModule, placed: Dict[relax.Var, List[Placement]], sites: Sequence[CallSite]
    ) -> None:
        super().__init__(mod)
        self.placed = placed
        self.sites = sites
        self.uncarried: List[Placement] = []

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.placed:
            super().visit_var_binding_(binding)
            return
        value = self.visit_expr(binding.value)
        for placement in self.placed[binding.var]:
            if placement.annotation is not Annotation.BARRIER:
                continue
            if placement.operand is None:
                value = self._guard_creation(binding.var, value, placement)
                continue
            operand = self.sites[placement.node].leaves[placement.operand]
            guarded = self.visit_expr(operand)
            if placement.stops_lift:
                guarded = self.builder_.emit(
                    relax.op.builtin.stop_lift_params(guarded), f"{binding.var.name}_weight"
                )
            if not placement.existing_barrier:
                guarded = self.builder_.emit(fold_barrier(guarded), f"{binding.var.name}_operand")
            value = _replace_argument(value, operand, guarded)
        if any(p.annotation is Annotation.ALLOW for p in self.placed[binding.var]):
            value = fold_allow(self.builder_.emit(value, f"{binding.var.name}_value"))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _guard_creation(self, var: relax.Var, call: relax.Call, placement: Placement) -> relax.Expr:
        """``zeros(shape)`` as ``full(shape, fold_barrier(0))``: the same values, and a scalar
        operand to guard, so neither fold_guard's default nor stock ``FoldConstant`` folds it."""
        op_name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
        if op_name not in _FILL_VALUE:
            self.uncarried.append(placement)
            return call
        dtype = str(call.attrs.dtype)
        fill = self.builder_.emit(
            fold_barrier(relax.const(_FILL_VALUE[op_name], dtype)), f"{var.name}_fill"
        )
        return relax.op.full(call.args[0], fill, dtype=dtype)


def _replace_argument(call: relax.Call, old: relax.Expr, new: relax.Expr) -> relax.Call:
    """``call`` with the first argument (or tuple field) that is ``old`` replaced by ``new``."""
    done = False

    def swap(arg: relax.Expr) -> relax.Expr:
        nonlocal done
        if done:
            return arg
        if arg.same_as(old):
            done = True
            return new
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([swap(field) for field in arg.fields])
        return arg

    args = [swap(arg) for arg in call.args]
    return _compat.rebuild_call(call, args)
