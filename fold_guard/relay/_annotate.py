"""Annotation helpers for Relay: place ``fold_allow`` where a flow needs constant QNN folded."""

from __future__ import annotations

import tvm
from tvm import relay

from .._core.annotate import allow_roots
from .._core.graph import FoldGraph
from .._core.planner import plan_folds
from .._core.policy import DEFAULT_POLICY, FOLD_QNN_POLICY
from .._core.report import StepTimer
from ._ops import fold_allow
from ._pass import analyse, module_like
from ._rewrite import substitute_calls

__all__ = ["allow_constant_qnn"]


def allow_constant_qnn(mod: tvm.IRModule) -> tvm.IRModule:
    """Wrap every constant subgraph that holds a QNN op in ``fold_allow``; return the new module.

    ``FakeQuantizationToInteger`` turns a QDQ graph into QNN ops but leaves the weights'
    ``qnn.quantize(<fp32 constant>)`` (and any other all-constant QNN chain) for a later fold, and
    stock ``FoldConstant()`` keeps them while ``FoldConstant(fold_qnn=True)`` folds every such
    chain at once. After this helper one ``fold_guard.relay.FoldConstant()`` folds exactly these
    subgraphs into integer constants, and what it marks is visible in the module. A subgraph is
    wrapped at its root (the call whose result leaves the constant part of the graph); barriers are
    respected, and ``mod`` itself is not changed.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> w = relay.qnn.op.quantize(relay.const(np.ones((2, 2), "float32")), relay.const(0.5), relay.const(0))
    >>> x = relay.var("x", shape=(2, 2), dtype="int8")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, w)))
    >>> print(fgr.allow_constant_qnn(mod)["main"].body.args[1].op.name)
    fold_allow
    """
    analysis = analyse(mod, DEFAULT_POLICY, None, StepTimer())
    graph = FoldGraph(analysis.lowered.nodes)
    roots = allow_roots(plan_folds(graph, FOLD_QNN_POLICY), plan_folds(graph, DEFAULT_POLICY))
    if not roots:
        return analysis.typed
    wrap = {analysis.lowered.sites[node_id].call: fold_allow for node_id in roots}
    annotated = module_like(analysis.typed, {
        gvar: substitute_calls(func, wrap) if gvar.name_hint in analysis.lowered.functions else func
        for gvar, func in analysis.typed.functions.items()
    })
    return relay.transform.InferType()(annotated)
