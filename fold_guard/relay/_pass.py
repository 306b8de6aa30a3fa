"""The fold_guard FoldConstant pass for Relay: type-check, walk, plan, evaluate by level, rewrite."""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import tvm
from tvm import relay

from .._core.driver import evaluate_until_stable
from .._core.errors import UnsupportedIRError
from .._core.graph import FoldGraph, dtype_nbytes
from .._core.planner import FoldPlan, plan_folds, raise_if_not_possible
from .._core.policy import FoldPolicy
from .._core.registry import PolicySpec, with_budget
from .._core.report import FoldResult, StepTimer, fold_result
from .._tvm.adapter import fold_constant_pass
from .._tvm.serial import serialized
from ._engine import Values, evaluate_plan, materialize
from ._ledger import attach_ledger
from ._module import infer_types, module_like
from ._read import function_names, postorder
from ._rewrite import rewrite_function
from ._sites import Translation
from ._stock import is_true
from ._translate import analyse

__all__ = ["FoldConstant", "FoldResult", "fold", "fold_function", "plan"]


def _plan_and_evaluate(
    translation: Translation,
    policy: FoldPolicy,
    values_by_call: Dict[relay.Call, relay.Expr],
    failures_by_call: Dict[relay.Call, str],
    strict: bool,
    timer: StepTimer,
) -> Tuple[FoldPlan, Values, int]:
    """Plan ``translation``, evaluate what folds (reusing values of calls already evaluated), re-plan on failures."""
    graph = FoldGraph(translation.nodes)
    node_of = {site.call: site.node_id for site in translation.sites}
    failures = {node_of[call]: text for call, text in failures_by_call.items() if call in node_of}
    fold_plan = plan_folds(graph, policy, eval_failures=failures)
    timer.lap("plan")
    values: Values = {
        node_of[call]: value for call, value in values_by_call.items() if call in node_of
    }
    runs = 0

    def evaluate(current: FoldPlan) -> Dict[int, str]:
        nonlocal runs
        new_failures, more_runs = evaluate_plan(current, translation.sites, values, strict=strict)
        runs += more_runs
        return new_failures

    fold_plan, failures = evaluate_until_stable(fold_plan, policy, evaluate, eval_failures=failures)
    values_by_call.update((translation.sites[node].call, value) for node, value in values.items())
    failures_by_call.update((translation.sites[node].call, text) for node, text in failures.items())
    timer.lap("evaluate")
    return fold_plan, values, runs


@serialized
def plan(
    mod: tvm.IRModule,
    policy: PolicySpec = "default",
    *,
    functions: Optional[Iterable[str]] = None,
    max_fold_bytes: Optional[int] = None,
) -> FoldPlan:
    """Decide what :func:`FoldConstant` would fold in ``mod``, without evaluating or changing anything.

    ``functions`` and ``max_fold_bytes`` are as in :func:`FoldConstant`.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(2,), dtype="float32")
    >>> w = relay.exp(relay.const(np.zeros(2, "float32")))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, fgr.fold_barrier(w))))
    >>> print(fgr.plan(mod).explain())  # doctest: +ELLIPSIS
    fold plan under policy 'default': 1 folded, 1 kept by barrier, 1 not constant
      main: %0 = exp: folded [default]
      main: %1 = fold_barrier: kept by barrier [fold_barrier]: operand is constant; ...
      main: %2 = add: not constant: 'x' is a run-time input
    """
    analysis = analyse(mod, with_budget(policy, max_fold_bytes), functions=functions)
    return plan_folds(analysis.graph, analysis.policy)


@serialized
def fold(
    mod: tvm.IRModule,
    *,
    policy: PolicySpec = "default",
    strict: bool = False,
    functions: Optional[Iterable[str]] = None,
    max_fold_bytes: Optional[int] = None,
    ledger: bool = False,
) -> FoldResult:
    """Fold the constant calls of ``mod`` that ``policy`` and the annotations allow.

    ``max_fold_bytes`` is as in :func:`FoldConstant`. ``ledger=True`` writes the precision ledger
    (:func:`fold_guard.relay.ledger`) into the result's ``fold_guard.ledger`` attribute.

    Returns a :class:`FoldResult`; ``mod`` itself is never changed. ``functions`` names the
    global functions to fold; by default every Relay function the stock pass folds (all but
    those with a ``Compiler``, ``Extern`` or ``SkipOptimization`` attribute). With
    ``strict=True`` a ``fold_allow`` that cannot fold, or a call whose evaluation fails, raises
    :class:`~fold_guard.FoldNotPossibleError`.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> w = relay.qnn.op.quantize(relay.const(np.ones((2, 2), "float32")), relay.const(0.5), relay.const(0))
    >>> x = relay.var("x", shape=(2, 2), dtype="int8")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, fgr.fold_allow(w))))
    >>> result = fgr.fold(mod)
    >>> [d.reason.text for d in result.plan.decisions]
    ['folded', 'folded', 'not constant']
    >>> print(result.mod["main"].body.args[1].data.numpy())
    [[2 2]
     [2 2]]
    """
    # The fold's steps, numbered alike in fold_guard/relax/_pass.py.
    timer = StepTimer()
    # Step 1. Translate (``_translate``): preconditions, the graph.
    analysis = analyse(mod, with_budget(policy, max_fold_bytes), timer, functions=functions)
    typed, translation = analysis.mod, analysis.translation
    values_by_call: Dict[relay.Call, relay.Expr] = {}
    failures_by_call: Dict[relay.Call, str] = {}
    known_conditions: Dict[relay.If, bool] = {}
    runs = 0
    while True:
        # Step 2. Plan with the TVM-free core; Step 3. evaluate level by level (a failure
        # re-plans). Relay only: an If whose condition folded is translated again (below).
        fold_plan, values, more_runs = _plan_and_evaluate(
            translation, analysis.policy, values_by_call, failures_by_call, strict, timer
        )
        runs += more_runs
        # An If whose condition just became a constant is its branch from now on, as in stock
        # folding, so what reads it may fold too: walk again with the condition known.
        resolved_now = {
            expr: is_true(materialize(cond, values))
            for expr, cond in translation.conditions.items()
            if cond.node in values and expr not in known_conditions
        }
        if not resolved_now:
            break
        known_conditions.update(resolved_now)
        translation = analysis.walk_again(known_conditions)
        timer.lap("walk")
    # Step 4. Strict: a fold_allow that cannot fold, or a failed evaluation, raises.
    if strict:
        raise_if_not_possible(fold_plan)
    # Step 5. Rewrite each function the way the stock pass does, then re-type like its FunctionPass.
    new_mod = _rewrite_module(typed, translation, fold_plan, values)
    new_mod = infer_types(new_mod, "fold_guard's output (please report this)", visible=True)
    timer.lap("rewrite")
    modified = not tvm.ir.structural_equal(new_mod, mod, map_free_vars=True)
    # Step 6. The precision ledger, when asked for.
    if ledger:
        new_mod = attach_ledger(new_mod, fold_plan, translation.sites)
    # Step 7. The result and its report.
    return fold_result(
        new_mod,
        fold_plan,
        modified=modified,
        implementation=IMPLEMENTATION,
        timer=timer,
        constant_bytes=lambda: (_constant_bytes(typed), _constant_bytes(new_mod)),
        evaluation_runs=runs,
    )


def fold_function(
    func: relay.Function, *, policy: PolicySpec = "default", strict: bool = False
) -> relay.Function:
    """Fold one Relay function, such as the partitioned function a ``relay.ext.<codegen>`` hook receives.

    Unlike the module pass, a function with a ``Compiler`` attribute is folded: being handed the
    function is the request. Only that function changes; its attributes are kept.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(2,), dtype="float32")
    >>> func = relay.Function([x], relay.add(x, relay.exp(relay.const(np.zeros(2, "float32")))))
    >>> func = func.with_attr("Compiler", "my_npu")
    >>> folded = fgr.fold_function(func)
    >>> folded.attrs["Compiler"], type(folded.body.args[1]).__name__
    ('my_npu', 'Constant')
    """
    if not isinstance(func, relay.Function):
        raise UnsupportedIRError(
            f"fold_function expects a relay.Function, got {type(func).__name__}; "
            "hint: fold a whole module with fold_guard.relay.fold(mod)"
        )
    mod = tvm.IRModule({relay.GlobalVar("fold_guard_function"): func})
    return fold(mod, policy=policy, strict=strict, functions=["fold_guard_function"]).mod[
        "fold_guard_function"
    ]


def _rewrite_module(
    mod: tvm.IRModule, translation: Translation, fold_plan: FoldPlan, values: Values
) -> tvm.IRModule:
    node_of_call = {site.call: site.node_id for site in translation.sites}
    return module_like(
        mod,
        {
            gvar: rewrite_function(func, node_of_call, fold_plan, values)
            if gvar.name_hint in translation.functions
            else func
            for gvar, func in mod.functions.items()
        },
    )


def _constant_bytes(mod: tvm.IRModule) -> int:
    """The bytes of the module's constants, each once however many calls or functions read it."""
    total = 0
    counted = set()
    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            for expr in postorder(func.body):
                if isinstance(expr, relay.Constant) and expr not in counted:
                    counted.add(expr)
                    total += (
                        dtype_nbytes(str(expr.data.dtype), tuple(int(d) for d in expr.data.shape))
                        or 0
                    )
    return total


#: Who implements the pass, for users who look: its PassInfo carries the stock pass's name.
IMPLEMENTATION = "fold_guard.relay.FoldConstant"

#: Stock Relay ``FoldConstant`` is a function pass at opt_level 2: a Sequential under a
#: PassContext with a lower opt_level skips both alike.
STOCK_OPT_LEVEL = 2


def FoldConstant(
    policy: PolicySpec = "default",
    *,
    strict: bool = False,
    functions: Optional[Iterable[str]] = None,
    max_fold_bytes: Optional[int] = None,
) -> tvm.transform.Pass:
    """fold_guard's drop-in for ``relay.transform.FoldConstant``.

    Parameters
    ----------
    policy : str, FoldPolicy, or a list of them
        A registered policy name (``"default"``, ``"fold-qnn"``, ``"keep-qdq-weights"``,
        ``"size-guard"``, or one a backend registered), a :class:`~fold_guard.FoldPolicy`, or a
        list composed in order. ``"default"`` folds exactly what ``FoldConstant()`` folds and
        ``"fold-qnn"`` exactly what ``FoldConstant(fold_qnn=True)`` folds, so the pass can replace
        either unchanged; annotations then add control where the graph needs it.
    strict : bool
        Raise :class:`~fold_guard.FoldNotPossibleError` when a ``fold_allow`` cannot fold or an
        evaluation fails, instead of keeping the call and reporting why. Off by default, like the
        stock pass, which silently skips what it cannot evaluate.
    functions : str or iterable of str, optional
        The global functions to fold (one string names one function). By default every
        function the stock pass folds: all but those with a ``Compiler``, ``Extern`` or
        ``SkipOptimization`` attribute. Naming a
        partitioned external function folds it and leaves every other function unchanged.
    max_fold_bytes : int, optional
        An absolute memory budget: a call whose results would take more bytes is kept (reason
        "over budget"), decided from its type before anything is evaluated. It outranks
        ``fold_allow``; ``None`` (the default) is no budget, as in the stock pass.

    Returns
    -------
    tvm.transform.Pass
        A module pass registered like the stock one, as ``FoldConstant`` at opt_level 2, so
        ``PassContext(disabled_pass=["FoldConstant"])``, ``required_pass`` and ``opt_level``
        gating treat both alike. ``.implementation`` says ``"fold_guard.relay.FoldConstant"``
        (the INFO log line starts with it) and ``.policy`` names the policy. A pass instrument
        sees what stock shows: ``FoldConstant`` with one ``InferType`` nested in it (the
        re-typing of the result); the typing of the input copy and the evaluation's own passes
        run out of its sight, as stock's evaluation does.

    Raises
    ------
    UnknownPolicyError
        When a policy name is not registered (raised here, before any module is seen).

    Notes
    -----
    The module is type-checked first (``InferType``), as the stock pass needs too (``shape_of`` of
    a static shape folds from the type). Folded calls are evaluated on the CPU with the ``llvm``
    target through Relay's interpreter, as the stock pass does, but level by level with kernels
    shared instead of one compilation per call: elementwise calls of one signature (QNN
    quantize / dequantize, casts, arithmetic) are evaluated as one call on their flattened
    operands whatever their shapes, repeated calls of one signature through one prepared
    function, the rest in one interpreter run per level; every result is bit-identical to
    stock's. QNN ops are lowered (QNN Legalize and CanonicalizeOps) only inside that evaluation,
    so QNN ops that are not folded stay intact.

    The input module is not changed, not even the types Relay caches on it: the pass works on a
    copy whose functions are bound to new ``GlobalVar`` objects of the same names (type inference
    would otherwise refresh the input's cached types through the shared ones). Look functions of
    the result up by name (``mod["main"]``), not with the input's ``GlobalVar`` objects.

    Examples
    --------
    A constant QNN weight folded into int8 while the activation's QNN ops stay::

        # Before (default policy; stock FoldConstant() keeps qnn.quantize of a constant)
        %w = fold_allow(qnn.quantize(W_fp32, 0.05f, 0))   # folds: inside fold_allow
        %y = qnn.dense(%x, %w, ...)                        # kept: %x is an activation
        # After
        %y = qnn.dense(%x, W_int8, ...)

    >>> import fold_guard.relay as fgr
    >>> folding = fgr.FoldConstant("fold-qnn")
    >>> folding.info.name, folding.info.opt_level, folding.implementation, folding.policy.name
    ('FoldConstant', 2, 'fold_guard.relay.FoldConstant', 'fold-qnn')
    """
    return fold_constant_pass(
        fold,
        opt_level=STOCK_OPT_LEVEL,
        implementation=IMPLEMENTATION,
        policy=with_budget(policy, max_fold_bytes),
        strict=bool(strict),
        functions=function_names(functions),
    )
