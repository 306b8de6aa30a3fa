"""``backend_policy`` and ``explain_offload`` for Relax: a backend's own table decides the fold.

The decision rules are the core's (:mod:`fold_guard._core.offload`,
:mod:`fold_guard._core.offload_explain`); this module reads the table
(:mod:`.table`), describes the module's calls' arguments, and *tries* decisions: folds a
tagged copy of the module (or, with weights as parameters, annotates, folds and lifts it) and
runs the table on it with ``FuseOpsByPattern``. No device is needed: partitioning is matching.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import tvm
from tvm import relax

from ..._core.builtin_policies import DEFAULT_POLICY
from ..._core.offload import table_policy
from ..._core.offload_report import OffloadReport
from ..._core.pattern_match import Arg, LeafArg, StaticArg, TupleArg
from ..._core.policy import FoldPolicy
from ..._core.registry import PolicySpec
from ..._tvm.offload import OffloadAdapter, OffloadSession, TableBinder
from ..._tvm.serial import serialized
from .. import _compat
from .._annotate import annotate
from .._pass import fold
from .._release import release_barriers
from .._sites import SiteKind, Translation
from .._translate import Analysis, analyse
from .table import (
    TableLike,
    composites_of,
    resolve_table,
    tag_calls,
)

__all__ = ["ADAPTER", "backend_policy", "call_arguments", "decided_module", "explain_offload"]


def _argument(template: object) -> Arg:
    if isinstance(template, int):
        return LeafArg(template)
    if isinstance(template, tuple):
        return TupleArg(tuple(_argument(item) for item in template))
    return StaticArg(str(template))


def call_arguments(translation: Translation) -> Dict[int, Tuple[Arg, ...]]:
    """Each call's arguments as patterns see them: a kernel call's are its ``GlobalVar`` and the
    tuple of its tensors; an operator's its tensors and static arguments, in order."""
    arguments: Dict[int, Tuple[Arg, ...]] = {}
    for site, node in zip(translation.sites, translation.nodes):
        if site.kind is SiteKind.CALL_TIR:
            fields = tuple(_argument(t) for t in site.template_args)
            arguments[site.node_id] = (StaticArg(node.callee), TupleArg(fields))
        elif site.template_args:
            arguments[site.node_id] = tuple(_argument(t) for t in site.template_args)
    return arguments


def _with_weight_parameters(mod: tvm.IRModule) -> bool:
    return any(
        isinstance(func, relax.Function) and func.attrs is not None and "num_input" in func.attrs
        for func in mod.functions.values()
    )


def decided_module(tagged: tvm.IRModule, policy: FoldPolicy) -> tvm.IRModule:
    """``tagged`` as the backend's partitioner would see it under ``policy``: folded; with
    weights as parameters, annotated, folded, lifted (``LiftTransformParams``) and released."""
    if not _with_weight_parameters(tagged):
        return fold(tagged, policy=policy).mod
    annotated = annotate(tagged, policy=policy).mod
    lifted = relax.transform.LiftTransformParams()(fold(annotated, policy=DEFAULT_POLICY).mod)
    return release_barriers(lifted)


def stock_flow(mod: tvm.IRModule) -> tvm.IRModule:
    """Stock ``FoldConstant``; with weights as parameters, then ``LiftTransformParams``."""
    folded = relax.transform.FoldConstant()(mod)
    if _with_weight_parameters(folded):
        return relax.transform.LiftTransformParams()(folded)
    return folded


def _tagged(analysis: Analysis) -> tvm.IRModule:
    variables = {_compat.handle(site.var): site.node_id for site in analysis.translation.sites}
    return tag_calls(analysis.mod, variables)


#: The Relax steps of trying a table (``fold_guard._tvm.offload``).
ADAPTER = OffloadAdapter(
    analysis_type=Analysis,
    analyse=lambda mod: analyse(mod, DEFAULT_POLICY),
    tag=_tagged,
    arguments=lambda analysis: call_arguments(analysis.translation),
    decided=decided_module,
    composites=composites_of,
    stock=stock_flow,
)


def backend_policy(patterns: TableLike, *, name: Optional[str] = None) -> FoldPolicy:
    """The fold policy a backend's own pattern table asks for.

    For each pattern, in the table's priority order, and each call it could take: fold what the
    pattern wants as a constant (an ``is_const()`` operand, with every call it is computed
    from), keep what it matches as a call on constants (a weight's ``dequantize``, a ``decode``
    kernel); everywhere else fold as the IR's default does, and fold every other dequantize of a
    constant (a layer no pattern takes gets a constant weight, not a run-time dequantize). On
    each module the policy folds (``fold``, ``plan``, ``annotate``, ``FoldConstant``), the
    decisions are tried first: the module is folded under them and the table run on it with its
    checks, and a match the table did not make (its check refused it) loses its decisions. Every
    decision's rule names the pattern it serves (``keep-for:<pattern>``, ``fold-for:<pattern>``).

    Parameters
    ----------
    patterns : str or list
        What ``FuseOpsByPattern`` takes (``FusionPattern`` objects or ``(name, pattern[,
        annotations[, check]])`` tuples, highest priority first), or the name of a table in
        TVM's pattern registry: ``"nnapi"``, ``"clml"``, ``"cublas"``, ``"cutlass"``,
        ``"example_npu"``, or a prefix of registered pattern names (``"cutlass.decode_matmul"``).
    name : str, optional
        The policy's name (default ``backend:<table>``), as ``register_policy`` registers it.

    Returns
    -------
    FoldPolicy
        A policy like any other: it registers, composes, and ``annotate(mod, policy=...)``
        writes it into the IR.

    Notes
    -----
    Trying costs a fold and a partition per round, on modules where some match needs a
    decision (rounds end when every match is confirmed; each round drops at least one). Run the
    backend's own preprocessing (a layout conversion) before, as its partitioner would.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from tvm.relax.dpl import is_const, is_op, wildcard
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> s, zp = relax.const(0.5), relax.const(0, "int8")
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = bb.emit(relax.op.quantize(relax.const(np.ones((4, 4), "float32")), s, zp))
    ...         dq = bb.emit(relax.op.dequantize(w, s, zp))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> weight = is_op("relax.dequantize")(is_const(), is_const(), is_const())
    >>> table = [("npu.qmatmul", is_op("relax.matmul")(wildcard(), weight))]
    >>> print(fgr.plan(bb.get(), fgr.backend_policy(table)).explain())
    fold plan under policy 'backend:npu': 1 folded, 1 kept by policy, 1 not constant
      main: lv = relax.quantize: folded [fold-for:npu.qmatmul]: npu.qmatmul wants it constant
      main: lv1 = relax.dequantize: kept by policy [keep-for:npu.qmatmul]: npu.qmatmul matches this call on constants
      main: gv = relax.matmul: not constant: 'x' is a run-time input
    """
    table = resolve_table(patterns)
    return table_policy(table.spec, name=name, binder=TableBinder(ADAPTER, table))


@serialized
def explain_offload(
    mod: tvm.IRModule, patterns: TableLike, *, policy: Optional[PolicySpec] = None
) -> OffloadReport:
    """Which calls ``patterns`` offloads from ``mod``, and why each other one is not offloaded.

    One row per call of an op some pattern is built around (``conv2d``, ``matmul``, ...) that
    reads run-time data: the composite that took it, or the reason (``operand-not-constant``,
    ``folded-away``, ``check-refused``, ``no-pattern``) with a sentence naming the operand, the
    rule or the check and the call's operand dtypes, shapes and quantization.

    Parameters
    ----------
    mod : tvm.IRModule
        The module: as imported (with ``policy``), as a pipeline left it, or partitioned already
        (``partition(...).mod``: calls in composites are offloaded). Not changed.
    patterns : str or list
        The table, as :func:`backend_policy` takes it.
    policy : str, FoldPolicy or list, optional
        Fold ``mod`` under this policy first (reasons then name its rules); None explains the
        module as given.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from tvm.relax.dpl import is_const, is_op, wildcard
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> s, zp = relax.const(0.5), relax.const(0, "int8")
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         dq = bb.emit(relax.op.dequantize(relax.const(np.ones((4, 4), "int8")), s, zp))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> weight = is_op("relax.dequantize")(is_const(), is_const(), is_const())
    >>> table = [("npu.qmatmul", is_op("relax.matmul")(wildcard(), weight))]
    >>> report = fgr.explain_offload(bb.get(), table, policy="default")
    >>> [(row.name, row.composite, row.reason.kind) for row in report.rows]
    [('gv', None, 'folded-away')]
    >>> fgr.explain_offload(bb.get(), table, policy=fgr.backend_policy(table)).rows[0].composite
    'npu.qmatmul'
    """
    return OffloadSession(ADAPTER, mod, resolve_table(patterns)).report(policy)
