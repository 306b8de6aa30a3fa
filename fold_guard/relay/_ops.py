"""The Relay annotation ops ``fold_barrier`` and ``fold_allow``.

Both are identity at run time: an ``Identity`` type relation, an identity compute
(``topi.identity``) and the injective pattern, so ``relay.build`` fuses them into their
neighbours and an annotated module runs as if the annotations were not there.

``fold_barrier`` is also marked ``TOpIsStateful``. Stock ``relay.transform.FoldConstant`` never
evaluates a stateful op (with or without ``fold_qnn``), so a barrier survives any later stock
pass; ``EliminateCommonSubexpr`` does not merge two barriers either. ``TNonComputational``, the
other attribute stock folding respects, would not do: ``FuseOps`` leaves non-computational ops
out of every fused function, and ``relay.build`` then fails on a barrier nothing fuses into.
Without either mark stock ``FoldConstant`` folds straight through an identity op (a test shows
it), which is why fold_guard's planner honours barriers itself rather than relying on the op's
attributes. ``fold_allow`` is deliberately neither: folding through it is what it asks for.
"""

from __future__ import annotations

from typing import Any, List

import tvm
from tvm import relay, topi
from tvm.relay.op import op as _relay_op

from .._core.errors import UnsupportedIRError

__all__ = ["FOLD_ALLOW_OP", "FOLD_BARRIER_OP", "fold_allow", "fold_barrier", "register_ops"]

FOLD_BARRIER_OP = "fold_barrier"
FOLD_ALLOW_OP = "fold_allow"

_DESCRIPTIONS = {
    FOLD_BARRIER_OP: "Identity. fold_guard never folds across it: its output is not a constant.",
    FOLD_ALLOW_OP: "Identity. fold_guard lowers and evaluates the constant subgraph producing its operand.",
}
# The last attribute register_ops sets; finding it means a previous import did the work. (A custom
# attribute name would not do: reading an attribute no op ever set raises.)
_REGISTERED_MARKER = "TOpPattern"


def _identity_compute(_attrs: Any, inputs: List[Any], _out_type: Any) -> List[Any]:
    return [topi.identity(inputs[0])]


def _is_registered(name: str) -> bool:
    return name in tvm.ir.Op.list_op_names()


def register_ops() -> None:
    """Register both ops with their type relation, compute, schedule and pattern. Safe to call again."""
    for name, description in _DESCRIPTIONS.items():
        if not _is_registered(name):
            _relay_op.register(name, description)
        op = relay.op.get(name)
        if op.get_attr(_REGISTERED_MARKER) is not None:
            continue
        op.set_num_inputs(1)
        op.add_argument("data", "Tensor", "The annotated value.")
        op.add_type_rel("Identity")
        op.set_support_level(10)
        if name == FOLD_BARRIER_OP:
            op.set_attr("TOpIsStateful", True)
        _relay_op.register_compute(name, _identity_compute)
        _relay_op.register_injective_schedule(name)
        _relay_op.register_pattern(name, _relay_op.OpPattern.INJECTIVE)


def _annotate(op_name: str, expr: relay.Expr) -> relay.Call:
    if not isinstance(expr, relay.Expr):
        raise UnsupportedIRError(
            f"{op_name} expects a Relay expression, got {type(expr).__name__} ({expr!r}); "
            "wrap NumPy data with relay.const(...) first"
        )
    if isinstance(expr, relay.Tuple):
        # The passes check every operand's type too (a call returning a tuple is only known
        # to be one after type inference).
        raise UnsupportedIRError(
            f"{op_name} annotates tensors only, got a relay.Tuple of {len(expr.fields)} fields; "
            "hint: annotate each field, relay.Tuple([fold_barrier(a), fold_barrier(b)])"
        )
    return relay.Call(relay.op.get(op_name), [expr])


def fold_barrier(expr: relay.Expr) -> relay.Call:
    """Mark ``expr`` as a fold barrier: nothing that consumes it is folded.

    The operand itself may still fold (a constant subgraph above the barrier collapses into one
    constant that stays under the barrier). The barrier survives fold_guard's pass and any later
    stock ``relay.transform.FoldConstant``, and is an identity when the module is built.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relay
    >>> from fold_guard.relay import fold_barrier
    >>> print(fold_barrier(relay.const(np.zeros(2, "float32"))).op.name)
    fold_barrier
    """
    return _annotate(FOLD_BARRIER_OP, expr)


def fold_allow(expr: relay.Expr) -> relay.Call:
    """Ask that the constant subgraph producing ``expr`` be evaluated, QNN ops included.

    Precedence is barrier > allow > policy > the IR default: a barrier inside the subgraph still
    wins. QNN ops in the subgraph are lowered (QNN Legalize / CanonicalizeOps) for the evaluation
    only; QNN ops elsewhere stay intact. Once ``expr`` has become a constant the annotation
    disappears; if it cannot, the annotation stays and the report says why (``strict=True``
    raises instead).

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relay
    >>> from fold_guard.relay import fold_allow
    >>> print(fold_allow(relay.const(np.zeros(2, "float32"))).op.name)
    fold_allow
    """
    return _annotate(FOLD_ALLOW_OP, expr)
