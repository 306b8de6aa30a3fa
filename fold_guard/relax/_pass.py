"""The fold_guard FoldConstant pass for Relax: translate, plan, evaluate, rewrite.

The coordinator of the adapter and its public entry points. Translation (``_translate``) gives
the graph and the kernels; the core plans; an engine (``_engine``, chosen by the options
``_config`` resolves) evaluates; ``_rewrite`` applies the plan the way the stock pass does.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import tvm
import tvm_ffi
from tvm import relax

from .._core.driver import evaluate_until_stable, releasable
from .._core.errors import PlanInvariantError, PreconditionError
from .._core.planner import FoldPlan, plan_folds, raise_if_not_possible
from .._core.registry import PolicySpec, with_budget
from .._core.report import FoldResult, StepTimer, fold_result
from .._tvm.adapter import fold_constant_pass
from .._tvm.pass_context import isolated_pass_context
from .._tvm.serial import serialized
from . import _compat
from ._config import CacheSetting, resolve_options
from ._engine import EngineOptions, Values, make_engine
from ._ledger import attach_ledger
from ._rewrite import constant_bytes, rewrite_module
from ._translate import analyse

__all__ = ["FoldConstant", "FoldResult", "fold", "plan"]

#: Who implements the pass, for users who look: its PassInfo carries the stock pass's name.
IMPLEMENTATION = "fold_guard.relax.FoldConstant"


@serialized
def plan(
    mod: tvm.IRModule, policy: PolicySpec = "default", *, max_fold_bytes: Optional[int] = None
) -> FoldPlan:
    """Decide what :func:`FoldConstant` would fold in ``mod``, without compiling or changing anything.

    ``max_fold_bytes`` is as in :func:`FoldConstant`.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2,), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = bb.emit(relax.op.exp(relax.const(np.zeros(2, "float32"))))
    ...         y = bb.emit_output(relax.op.add(x, w))
    ...     _ = bb.emit_func_output(y)
    >>> print(fgr.plan(bb.get()).explain())
    fold plan under policy 'default': 1 folded, 1 not constant
      main: lv = relax.exp: folded [default]
      main: gv = relax.add: not constant: 'x' is a run-time input
    """
    with isolated_pass_context(), _compat.remembering_types():
        analysis = analyse(mod, with_budget(policy, max_fold_bytes))
    return plan_folds(analysis.graph, analysis.policy)


@serialized
def fold(
    mod: tvm.IRModule,
    *,
    policy: PolicySpec = "default",
    strict: bool = False,
    max_fold_bytes: Optional[int] = None,
    kernel_cache: CacheSetting = None,
    threads: Optional[int] = None,
    reference_engine: Optional[bool] = None,
    engine_options: Optional[EngineOptions] = None,
    ledger: bool = False,
) -> FoldResult:
    """Fold the constant calls of ``mod`` that ``policy`` and the annotations allow.

    ``max_fold_bytes`` is as in :func:`FoldConstant`.

    Returns a :class:`FoldResult`; ``mod`` itself is never changed. With ``strict=True`` a
    ``fold_allow`` that cannot fold, or a call whose evaluation fails, raises
    :class:`~fold_guard.FoldNotPossibleError`, an input that is not well formed raises
    :class:`~fold_guard.PreconditionError`, and the result is checked with
    ``relax.analysis.well_formed``.

    ``kernel_cache``, ``threads`` and ``reference_engine`` are as in :func:`FoldConstant`.
    ``ledger=True`` writes the precision ledger (one row per weight, :func:`fold_guard.relax.ledger`)
    into the result's ``fold_guard.ledger`` module attribute; off by default, so the output stays
    structurally equal to what the stock pass and a hand-written Expected module give.
    ``engine_options`` (an :class:`EngineOptions`) sets every engine switch
    at once, each speed mechanism included, for tests and benchmarks; it excludes the three.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2,), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = bb.emit(relax.op.exp(relax.const(np.zeros(2, "float32"))))
    ...         y = bb.emit_output(relax.op.add(x, fgr.fold_barrier(w)))
    ...     _ = bb.emit_func_output(y)
    >>> result = fgr.fold(bb.get())
    >>> [d.reason.text for d in result.plan.decisions]
    ['folded', 'kept by barrier', 'not constant']
    """
    if engine_options is None:
        engine_options = resolve_options(
            kernel_cache=kernel_cache, threads=threads, reference_engine=reference_engine
        )
    elif (kernel_cache, threads, reference_engine) != (None, None, None):
        raise PreconditionError(
            "engine_options sets the kernel cache, the threads and the engine itself; hint: "
            "pass either engine_options or kernel_cache / threads / reference_engine"
        )
    with isolated_pass_context(), _compat.remembering_types():
        return _fold(mod, policy, strict, max_fold_bytes, engine_options, ledger)


def _fold(
    mod: tvm.IRModule,
    policy: PolicySpec,
    strict: bool,
    max_fold_bytes: Optional[int],
    options: EngineOptions,
    ledger: bool = False,
) -> FoldResult:
    # The fold's steps, numbered alike in fold_guard/relay/_pass.py.
    timer = StepTimer()
    # Step 1. Translate (``_translate``): preconditions (strict: a well-formed input), the graph.
    analysis = analyse(mod, with_budget(policy, max_fold_bytes), timer, strict=strict)
    translation, resolved = analysis.translation, analysis.policy
    # Step 2. Plan with the TVM-free core.
    fold_plan = plan_folds(analysis.graph, resolved)
    timer.lap("plan")
    # Step 3. Evaluate: every kernel the plan needs built once, then the calls in topological
    # order; a failure re-plans (its consumers no longer fold). The values that may be dropped
    # early are decided once per plan, and the rewrite gets the same decision.
    engine = make_engine(options, analysis.mod, analysis.graph, translation.sites, analysis.kernels)
    engine.prepare(fold_plan)
    timer.lap("compile")
    values: Values = {}
    release: Dict[int, Tuple[int, ...]] = {}

    def evaluate(p: FoldPlan) -> Dict[int, str]:
        release.clear()
        release.update(releasable(p, analysis.kept))
        failures = engine.evaluate(p, values, strict=strict, release=release)
        failures.update(analysis.stock_failures(p, values))
        return failures

    fold_plan, _ = evaluate_until_stable(fold_plan, resolved, evaluate)
    timer.lap("evaluate")
    # Step 4. Strict: a fold_allow that cannot fold, or a failed evaluation, raises.
    if strict:
        raise_if_not_possible(fold_plan)
    # Step 5. Rewrite each function the way the stock pass does (strict: checked well formed).
    new_mod = rewrite_module(analysis.mod, translation, fold_plan, values, frozenset(release))
    timer.lap("rewrite")
    if strict and not relax.analysis.check_well_formed(new_mod):
        raise PlanInvariantError(
            "fold_guard produced a module that is not well formed; please report it"
        )
    modified = not tvm_ffi.structural_equal(new_mod, mod)
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
        constant_bytes=functools.partial(constant_bytes, mod, new_mod),
        kernels_compiled=engine.stats.compiled,
        kernels_cached=engine.stats.cached,
        fallbacks=tuple(engine.stats.fallbacks),
    )


#: Stock ``relax.transform.FoldConstant`` is a function pass at opt_level 0.
STOCK_OPT_LEVEL = 0


def FoldConstant(
    policy: PolicySpec = "default",
    *,
    strict: bool = False,
    max_fold_bytes: Optional[int] = None,
    kernel_cache: CacheSetting = None,
    threads: Optional[int] = None,
    reference_engine: Optional[bool] = None,
) -> tvm.transform.Pass:
    """fold_guard's drop-in for ``relax.transform.FoldConstant``.

    Parameters
    ----------
    policy : str, FoldPolicy, or a list of them
        A registered policy name (``"default"``, ``"keep-qdq-weights"``, ``"size-guard"``, or one a
        backend registered), a :class:`~fold_guard.FoldPolicy`, or a list composed in order.
        ``"default"`` folds exactly what the stock pass folds, so the pass can replace it
        unchanged; annotations then add control where the IR needs it.
    strict : bool
        Raise :class:`~fold_guard.FoldNotPossibleError` when a ``fold_allow`` cannot fold or an
        evaluation fails, instead of keeping the call and reporting why. Off by default, like the
        stock pass, which silently skips what it cannot evaluate.
    max_fold_bytes : int, optional
        An absolute memory budget: a call whose results would take more bytes is kept (reason
        "over budget", rule ``max_fold_bytes``), decided from its type before anything is
        allocated or compiled. It outranks ``fold_allow`` (only a barrier ranks higher). ``None``
        (the default) is no budget, as in the stock pass; a policy can carry one too
        (:func:`fold_guard.memory_budget`), and the tighter budget applies.
    kernel_cache : None, bool, or a path
        The persistent cache of compiled kernels: ``None`` (the default) takes
        ``$FOLD_GUARD_CACHE_DIR`` (``off`` disables it), else ``~/.cache/fold_guard``; ``False``
        disables it, a path relocates it. On by default, so a second fold of the same or a
        similarly built model compiles nothing (``report.kernels_cached``); it holds compiled
        code only, never a decision. Its libraries are bounded by
        ``$FOLD_GUARD_CACHE_MAX_BYTES`` (1 GiB), least recently used deleted first.
    threads : int, optional
        Threads for kernel builds and a level's large calls, all joined before the pass
        returns. ``None`` takes ``$FOLD_GUARD_THREADS``, else every CPU the process may use;
        ``1`` uses none.
    reference_engine : bool, optional
        Evaluate with the reference engine: each call legalized, built and run on its own, as
        the stock pass does, with none of the fast engine's mechanisms. Slower, and the switch
        to flip if a TVM or LLVM upgrade breaks one of them. ``None`` takes
        ``$FOLD_GUARD_REFERENCE_ENGINE``, else off. (TVM 0.27 accepts ``PassContext`` config
        keys only from C++, so these settings are arguments and environment variables.)

    Returns
    -------
    tvm.transform.Pass
        A module pass registered as ``FoldConstant`` at opt_level 0, like the stock pass, so
        ``PassContext(disabled_pass=["FoldConstant"])`` and ``opt_level`` gating treat both alike.
        ``.implementation`` says ``"fold_guard.relax.FoldConstant"`` and ``.policy`` names the
        policy. Its internal ``LegalizeOps`` and kernel builds run out of sight of pass
        instruments, as the stock pass's internal work does.

    Raises
    ------
    UnknownPolicyError
        When a policy name is not registered (raised here, before any module is seen).

    Notes
    -----
    Like the stock pass, operators fold only inside dataflow blocks (run
    ``relax.transform.ConvertToDataflow()`` first to fold more), and every call is evaluated on the
    CPU through its legalized TIR kernel. All kernels of one module are compiled in one batch.

    Run it before ``LegalizeOps``: a policy that decides by op name (every built-in but
    ``default`` and ``size-guard``) cannot see what a ``call_tir`` computes, so on a module that is
    already legalized it raises :class:`~fold_guard.PreconditionError` instead of silently acting
    like ``default``. To carry a policy through a pipeline you do not control, ``annotate`` the
    module right after import; the annotations survive every TVM pipeline.

    Examples
    --------
    A QDQ weight under ``keep-qdq-weights`` (stock would fold both calls into one fp32 constant)::

        # Before
        with R.dataflow():
            w_q = R.quantize(W, scale, zp, axis=0, out_dtype="int8")       # folds: quantize(const)
            w = R.dequantize(w_q, scale, zp, axis=0, out_dtype="float32")  # kept: dequantize(int8 const)
            y = R.matmul(x, R.permute_dims(w))                             # not constant: x
        # After
        with R.dataflow():
            w = R.dequantize(W_int8, scale, zp, axis=0, out_dtype="float32")
            y = R.matmul(x, R.permute_dims(w))

    >>> import fold_guard.relax as fgr
    >>> folding = fgr.FoldConstant("keep-qdq-weights")
    >>> folding.info.name, folding.implementation, folding.policy.name
    ('FoldConstant', 'fold_guard.relax.FoldConstant', 'keep-qdq-weights')
    """
    return fold_constant_pass(
        fold,
        opt_level=STOCK_OPT_LEVEL,
        implementation=IMPLEMENTATION,
        policy=with_budget(policy, max_fold_bytes),
        strict=bool(strict),
        kernel_cache=kernel_cache,
        threads=threads,
        reference_engine=reference_engine,
    )
