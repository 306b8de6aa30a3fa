"""Annotation helpers for Relay: make a module carry a policy's decisions through stock Relay flows."""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import tvm
from tvm import relay

from .._core.annotate import Annotated, Placement, placements
from .._core.builtin_policies import DEFAULT_POLICY, FOLD_QNN_POLICY
from .._core.errors import PreconditionError
from .._core.graph import Annotation
from .._core.planner import plan_folds
from .._core.registry import PolicySpec
from .._tvm.serial import serialized
from ._module import module_like
from ._ops import fold_allow, fold_barrier
from ._pass import fold
from ._rewrite import substitute_calls
from ._translate import Analysis, analyse

__all__ = ["allow_constant_qnn", "annotate"]


@serialized
def annotate(
    mod: tvm.IRModule,
    *,
    policy: PolicySpec = "qdq-accelerator",
    params: Optional[Mapping[str, object]] = None,
    ledger: bool = False,
) -> Annotated:
    """Make ``mod`` carry ``policy`` through any stock Relay flow; return it with what was placed.

    Meant for a module fresh from a frontend: ``relay.frontend.from_onnx`` of a QDQ model,
    ``from_tflite`` of a quantized one, or the output of ``FakeQuantizationToInteger``. ``params``
    (what the frontend returned beside the module) are bound into ``main`` as constants first,
    since weights passed as parameters are not constants and nothing about them could fold.

    No stock Relay pass knows ``fold_allow``, and ``relay.build`` / ``relay.vm.compile`` lower
    every QNN op and then fold, so the result is written for them:

    - what ``policy`` folds is evaluated now (``qnn.quantize(<fp32 weight>)`` becomes an int8
      constant under ``qdq-accelerator``): a stock ``FoldConstant()`` and a backend's partitioner
      then see what ``fold(mod, policy=policy)`` gives them;
    - a ``fold_barrier`` goes on the first operand of each call ``policy`` keeps by a rule of its
      own that a fold after QNN lowering would evaluate (``qnn.dequantize(<int8 weight>)``), so it
      survives every ``FoldConstant``, ``relay.build`` and ``relay.vm.compile``: the built module
      holds the int8 weight and computes the same output. Release the barriers right before a
      backend's partitioner with :func:`partition`.

    ``ledger=True`` also writes the precision ledger of the policy's plan (one row per weight,
    :func:`fold_guard.relay.ledger`). ``mod`` is not changed. The result is type-checked.
    :func:`allow_constant_qnn` marks what a policy folds with ``fold_allow`` instead, for
    ``fold_guard.relay.FoldConstant`` to fold later.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="float32")
    >>> w = relay.var("w", shape=(4, 4), dtype="float32")
    >>> w_q = relay.qnn.op.quantize(w, relay.const(0.05), relay.const(0), out_dtype="int8")
    >>> w_dq = relay.qnn.op.dequantize(w_q, relay.const(0.05), relay.const(0))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.dense(x, w_dq)))
    >>> annotated = fgr.annotate(mod, params={"w": np.ones((4, 4), "float32")})
    >>> print(annotated.explain())  # doctest: +NORMALIZE_WHITESPACE
    placed 1 annotation for policy 'qdq-accelerator': 0 fold_allow, 1 fold_barrier
      main: fold_barrier on qnn.dequantize argument 0: int8[4, 4]
      (input 0 of %0 = qnn.dequantize) [keep-dequantize-of-integer-constant]
    >>> print(annotated.mod["main"].body.args[1].args[0].op.name)  # on the int8 weight
    fold_barrier
    """
    if params:
        mod = _bind_params(mod, params)
    # Step 1. Evaluate what the policy folds; what is left is what it keeps.
    folded = fold(mod, policy=policy, ledger=ledger).mod
    # Step 2. Barriers where a fold after QNN lowering (fold-qnn) would undo a keep.
    analysis = analyse(folded, policy)
    graph = analysis.graph
    placed = placements(
        plan_folds(graph, analysis.policy),
        plan_folds(graph, DEFAULT_POLICY),
        later=plan_folds(graph, FOLD_QNN_POLICY),
    )
    return _place(analysis, placed)


def _place(analysis: Analysis, placed: Tuple[Placement, ...]) -> Annotated:
    """``analysis.mod`` with ``placed`` written in, type-checked."""
    if not placed:
        return Annotated(analysis.mod, placed, analysis.policy.name)
    wrap: Dict[relay.Call, Callable[[relay.Expr], relay.Expr]] = {}
    for placement in placed:
        call = analysis.translation.sites[placement.node].call
        wrap[call] = (
            fold_allow if placement.annotation is Annotation.ALLOW else _guard_first_operand
        )
    annotated = module_like(
        analysis.mod,
        {
            gvar: substitute_calls(func, wrap)
            if gvar.name_hint in analysis.translation.functions
            else func
            for gvar, func in analysis.mod.functions.items()
        },
    )
    return Annotated(relay.transform.InferType()(annotated), placed, analysis.policy.name)


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
    analysis = analyse(mod, FOLD_QNN_POLICY)
    graph = analysis.graph
    placed = placements(plan_folds(graph, FOLD_QNN_POLICY), plan_folds(graph, DEFAULT_POLICY))
    return _place(analysis, placed).mod


def _guard_first_operand(call: relay.Call) -> relay.Call:
    args = list(call.args)
    first = args[0]
    if isinstance(first, relay.Tuple):  # the node's first input is the tuple's first field
        args[0] = relay.Tuple([fold_barrier(first.fields[0])] + list(first.fields[1:]), first.span)
    else:
        args[0] = fold_barrier(first)
    return relay.Call(call.op, args, call.attrs, call.type_args, call.span)


def _bind_params(mod: tvm.IRModule, params: Mapping[str, object]) -> tvm.IRModule:
    if "main" not in [gvar.name_hint for gvar in mod.get_global_vars()]:
        raise PreconditionError(
            "annotate(mod, params=...) binds params into 'main', but the module has no 'main'"
        )
    names = {param.name_hint for param in mod["main"].params}
    unknown = sorted(set(params) - names)
    if unknown:
        raise PreconditionError(
            f"params {unknown} are not parameters of main (it has {sorted(names)}); "
            "hint: pass the params the frontend returned with this module"
        )
    types = {param.name_hint: param.type_annotation for param in mod["main"].params}
    bound = {name: _as_array(name, value, types[name]) for name, value in params.items()}
    functions = dict(mod.functions)
    main = mod.get_global_var("main")
    functions[main] = relay.build_module.bind_params_by_name(mod["main"], bound)
    return module_like(mod, functions)


def _as_array(name: str, value: object, declared: object) -> tvm.nd.NDArray:
    """``value`` as an NDArray whose dtype and shape are those ``main`` declares for ``name``."""
    try:
        array = value if isinstance(value, tvm.nd.NDArray) else tvm.nd.array(np.asarray(value))
    except (TypeError, ValueError) as err:
        raise PreconditionError(
            f"param {name!r} is a {type(value).__name__}, not an array: {err}"
        ) from None
    if isinstance(declared, relay.TensorType):
        shape = tuple(
            int(dim) if isinstance(dim, tvm.tir.IntImm) else None for dim in declared.shape
        )
        fits = len(shape) == len(array.shape) and all(
            d is None or d == a for d, a in zip(shape, array.shape)
        )
        if str(declared.dtype) != str(array.dtype) or not fits:
            raise PreconditionError(
                f"param {name!r} is {array.dtype}{list(array.shape)}, but main declares {name} as "
                f"{declared.dtype}{list(shape)}; hint: pass the params the frontend returned with this module"
            )
    return array
