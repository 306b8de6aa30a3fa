"""Extend a backend's pattern table so its composites take a quantized weight with its dequantize.

TVM's in-tree Relax tables (example_npu, nnapi, cuBLAS, CLML) match a conv2d / matmul weight with
``wildcard()``. Matching stops there, so a weight that stays ``dequantize(<int8 const>)`` (under a
QDQ policy) reaches the composite as a run-time fp32 tensor computed outside it.
:func:`absorb_weight_dequantize` rewrites each such weight operand into::

    dequantize(is_const(), is_const(), is_const())                  the weight, its scale and zero point
  | permute_dims(dequantize(is_const(), is_const(), is_const()))   a Gemm / MatMul weight
  | <the table's own operand pattern>                               everything it matched before

so the composite holds the dequantize and ``FuseOpsByPattern(bind_constants=True)`` binds the int8
weight, its scale and zero point into it. The alternatives come first, so a dequantized constant
is always absorbed; anything else matches as before. Annotations that named the operand name the
new alternative (its root is the dequantize, or the permute_dims, an fp32 tensor as before).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

from tvm.relax.dpl import pattern as P
from tvm.relax.transform import FusionPattern

from .. import _compat

__all__ = ["WEIGHT_OPS", "absorb_weight_dequantize", "dequantized_constant"]

#: The ops whose weight operand (argument 1) is extended by default.
WEIGHT_OPS = ("relax.nn.conv2d", "relax.nn.conv1d", "relax.nn.conv2d_transpose", "relax.matmul")

PatternEntry = Union[FusionPattern, Tuple]


def dequantized_constant() -> P.DFPattern:
    """``dequantize(<const>, <const>, <const>)``, optionally under ``permute_dims``.

    >>> from fold_guard.relax import dequantized_constant
    >>> type(dequantized_constant()).__name__
    'OrPattern'
    """
    dq = P.is_op("relax.dequantize")(P.is_const(), P.is_const(), P.is_const())
    return dq | P.is_op("relax.permute_dims")(dq)


def absorb_weight_dequantize(
    patterns: Sequence[PatternEntry], *, ops: Sequence[str] = WEIGHT_OPS, operand: int = 1
) -> List[FusionPattern]:
    """``patterns`` with the weight operand of every ``ops`` call also matching a dequantized constant.

    Parameters
    ----------
    patterns : Sequence[FusionPattern | tuple]
        A backend's table as ``FuseOpsByPattern`` takes it (``get_patterns_with_prefix("nnapi")``,
        ``clml_pattern_table()``, tuples of name, pattern, annotations, check). Not changed.
    ops : Sequence[str]
        The ops whose argument number ``operand`` is the weight.
    operand : int
        Which argument is the weight (1: ``conv2d(data, weight)``, ``matmul(x, weight)``).

    Returns
    -------
    list of FusionPattern
        The same names, checks and attribute getters; every pattern of ``ops`` whose weight
        operand was any pattern now also takes :func:`dequantized_constant` there, first.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from tvm.relax.dpl import is_op, wildcard
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = relax.const(np.ones((4, 4), "int8"))
    ...         dq = bb.emit(relax.op.dequantize(w, relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> table = [("npu.matmul", is_op("relax.matmul")(wildcard(), wildcard()))]
    >>> fused = relax.transform.FuseOpsByPattern(fgr.absorb_weight_dequantize(table))(bb.get())
    >>> composite = fused["fused_relax_dequantize_relax_matmul"]
    >>> [b.value.op.name for b in composite.body.blocks[0].bindings]  # the weight's dequantize inside
    ['relax.dequantize', 'relax.matmul']
    """
    rewriter = _OperandRewriter(tuple(ops), operand)
    extended: List[FusionPattern] = []
    for entry in patterns:
        entry = entry if isinstance(entry, FusionPattern) else FusionPattern(*entry)
        root = rewriter.rewrite(entry.pattern)  # first: annotations name its new sub-patterns
        annotations = {
            str(key): rewriter.replacement(value)
            for key, value in dict(entry.annotation_patterns or {}).items()
        }
        extended.append(
            FusionPattern(
                str(entry.name),
                root,
                annotations,
                entry.check,
                entry.attrs_getter,
            )
        )
    return extended


class _OperandRewriter:
    """Rebuilds a pattern with each weight operand of ``ops`` extended; shared sub-patterns stay
    shared (an annotation that named the old operand names its replacement)."""

    def __init__(self, ops: Tuple[str, ...], operand: int) -> None:
        self.ops = ops
        self.operand = operand
        self.done: Dict[int, P.DFPattern] = {}
        self.extended: Dict[int, P.DFPattern] = {}

    def replacement(self, pattern: P.DFPattern) -> P.DFPattern:
        """What an annotation naming ``pattern`` names now."""
        key = _compat.handle(pattern)
        if key in self.extended:
            return self.extended[key]
        return self.done.get(key, self.rewrite(pattern))

    def rewrite(self, pattern: P.DFPattern) -> P.DFPattern:
        key = _compat.handle(pattern)
        if key not in self.done:
            self.done[key] = self._rebuild(pattern)
        return self.done[key]

    def _rebuild(self, pattern: P.DFPattern) -> P.DFPattern:
        if isinstance(pattern, P.CallPattern):
            args = [self.rewrite(arg) for arg in pattern.args]
            if self._is_weight_op(pattern.op) and len(args) > self.operand:
                weight = pattern.args[self.operand]
                extended = dequantized_constant() | args[self.operand]
                self.extended[_compat.handle(weight)] = extended
                args[self.operand] = extended
            return P.CallPattern(pattern.op, args, add_constraint=False)
        if isinstance(pattern, P.OrPattern):
            return P.OrPattern(self.rewrite(pattern.left), self.rewrite(pattern.right))
        if isinstance(pattern, P.AndPattern):
            return P.AndPattern(self.rewrite(pattern.left), self.rewrite(pattern.right))
        if isinstance(pattern, P.TupleGetItemPattern):
            return P.TupleGetItemPattern(self.rewrite(pattern.tuple), int(pattern.index))
        if isinstance(pattern, P.TuplePattern):
            return P.TuplePattern([self.rewrite(field) for field in pattern.fields])
        if isinstance(pattern, P.AttrPattern):
            return P.AttrPattern(self.rewrite(pattern.pattern), pattern.attrs)
        if isinstance(pattern, P.DataTypePattern):
            return P.DataTypePattern(self.rewrite(pattern.pattern), str(pattern.dtype))
        return pattern

    def _is_weight_op(self, op: P.DFPattern) -> bool:
        return isinstance(op, P.ExprPattern) and getattr(op.expr, "name", None) in self.ops
