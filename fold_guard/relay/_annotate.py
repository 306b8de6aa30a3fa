"""Annotation helpers for Relay: make a module carry a policy's decisions as fold_barrier / fold_allow."""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional

import numpy as np
import tvm
from tvm import relay

from .._core.annotate import Annotated, placements
from .._core.errors import PreconditionError
from .._core.graph import Annotation
from .._core.planner import plan_folds
from .._core.policy import DEFAULT_POLICY, PolicySpec
from .._core.report import StepTimer
from .._serial import serialized
from ._ops import fold_allow, fold_barrier
from ._pass import analyse, module_like
from ._rewrite import substitute_calls

__all__ = ["allow_constant_qnn", "annotate"]


@serialized
def annotate(
    mod: tvm.IRModule,
    *,
    policy: PolicySpec = "qdq-accelerator",
    params: Optional[Mapping[str, object]] = None,
) -> Annotated:
    """Place the annotations that make any later fold follow ``policy``; return them with the module.

    Meant for a module fresh from a frontend: ``relay.frontend.from_onnx`` of a QDQ model,
    ``from_tflite`` of a quantized one, or the output of ``FakeQuantizationToInteger``. ``params``
    (what the frontend returned beside the module) are bound into ``main`` as constants first,
    since weights passed as parameters are not constants and nothing about them could fold.

    - ``fold_allow`` around the root of each constant subgraph ``policy`` folds and the default
      keeps (``qnn.quantize(<fp32 weight>)`` under ``qdq-accelerator``): one plain
      ``fold_guard.relay.FoldConstant()`` later folds it into an int8 constant.
    - ``fold_barrier`` on the first operand of each call ``policy`` keeps by a rule of its own
      although stock would fold it (under ``weights-only``, a constant computation that is not a
      weight): it then survives every ``FoldConstant``, stock ones included.

    ``mod`` is not changed. The result is type-checked.

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
    >>> print(annotated.explain())
    annotated for policy 'qdq-accelerator': 1 fold_allow, 0 fold_barrier
      main: fold_allow around %0 = qnn.quantize [fold-quantize-of-constant]
    """
    if params:
        mod = _bind_params(mod, params)
    analysis = analyse(mod, policy, None, StepTimer())
    graph = analysis.graph
    placed = placements(plan_folds(graph, analysis.policy), plan_folds(graph, DEFAULT_POLICY))
    if not placed:
        return Annotated(analysis.mod, placed, analysis.policy.name)
    wrap: Dict[relay.Call, Callable[[relay.Expr], relay.Expr]] = {}
    for placement in placed:
        call = analysis.lowered.sites[placement.node].call
        wrap[call] = (
            fold_allow if placement.annotation is Annotation.ALLOW else _guard_first_operand
        )
    annotated = module_like(
        analysis.mod,
        {
            gvar: substitute_calls(func, wrap)
            if gvar.name_hint in analysis.lowered.functions
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
    respected, and ``mod`` itself is not changed. Same as ``annotate(mod, policy="fold-qnn").mod``.

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
    return annotate(mod, policy="fold-qnn").mod


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
