"""``backend_policy`` and ``explain_offload`` for Relay: a backend's own table decides the fold.

The Relay side of ``fold_guard.relax``'s: the decision rules are the core's
(:mod:`fold_guard._core.offload`, :mod:`fold_guard._core.offload_explain`); this module reads
the table (:mod:`.table`), describes the calls' arguments, and tries decisions by
folding a tagged copy of the module and running ``MergeComposite`` on it (no device needed).
Run a backend's own preprocessing first where it rewrites the graph (Arm Compute Library's
``preprocess_module``), and ``FakeQuantizationToInteger`` for tables of ``qnn.*`` patterns.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import tvm
from tvm import relay

from ..._core.builtin_policies import DEFAULT_POLICY
from ..._core.offload import table_policy
from ..._core.offload_report import OffloadReport
from ..._core.pattern_match import Arg, LeafArg, TupleArg
from ..._core.policy import FoldPolicy
from ..._core.registry import PolicySpec
from ..._tvm.offload import OffloadAdapter, OffloadSession, TableBinder
from ..._tvm.serial import serialized
from .._pass import fold
from .._sites import SiteKind, Source, Translation, TupleSource
from .._translate import Analysis, analyse
from .table import (
    TableLike,
    composites_of,
    existing_offloads,
    resolve_table,
    tag_calls,
)

__all__ = ["ADAPTER", "backend_policy", "call_arguments", "explain_offload"]


def _arguments(sources: Sequence[Source], counter: List[int]) -> Tuple[Arg, ...]:
    found: List[Arg] = []
    for source in sources:
        if isinstance(source, TupleSource):
            found.append(TupleArg(_arguments(source.fields, counter)))
        else:
            found.append(LeafArg(counter[0]))
            counter[0] += 1
    return tuple(found)


def call_arguments(translation: Translation) -> Dict[int, Tuple[Arg, ...]]:
    """Each call's arguments as patterns see them: a literal tuple (``concatenate``'s) as a
    tuple of its fields, every other argument one tensor input."""
    arguments: Dict[int, Tuple[Arg, ...]] = {}
    for site in translation.sites:
        if site.kind is not SiteKind.SHAPE and any(isinstance(s, TupleSource) for s in site.args):
            arguments[site.node_id] = _arguments(site.args, [0])
    return arguments


def _tagged(analysis: Analysis) -> tvm.IRModule:
    return tag_calls(analysis.mod, {site.call: site.node_id for site in analysis.translation.sites})


#: The Relay steps of trying a table (``fold_guard._tvm.offload``).
ADAPTER = OffloadAdapter(
    analysis_type=Analysis,
    analyse=lambda mod: analyse(mod, DEFAULT_POLICY),
    tag=_tagged,
    arguments=lambda analysis: call_arguments(analysis.translation),
    decided=lambda tagged, policy: fold(tagged, policy=policy).mod,
    composites=composites_of,
    stock=lambda mod: relay.transform.FoldConstant()(mod),
    existing=existing_offloads,
)


def backend_policy(table: TableLike, *, name: Optional[str] = None) -> FoldPolicy:
    """The fold policy a backend's own pattern table asks for (as ``fold_guard.relax.backend_policy``).

    Fold what a pattern wants as a constant (an ``is_constant()`` operand: ``qnn.quantize(<fp32
    weight>)`` under a ``qnn.conv2d``, with every call it is computed from), keep what it matches
    as a call on constants (a ``qnn.dequantize`` / ``qnn.*`` call of constants), fold every
    other ``qnn.dequantize`` of a constant, and elsewhere fold as Relay's default does. The
    decisions are tried on each module first (folded, then ``MergeComposite`` with the checks);
    a match a check refuses loses its decisions. Every rule names its pattern.

    Parameters
    ----------
    table : str or list
        What ``MergeComposite`` takes (``(name, pattern[, check])`` tuples, highest priority
        first) or a name ``get_pattern_table`` knows: ``"cmsis-nn"``, ``"arm_compute_lib"``,
        ``"ethos-n"``, ``"dnnl"``.
    name : str, optional
        The policy's name (default ``backend:<table>``).

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="int8")
    >>> zero, half = relay.const(0), relay.const(0.5)
    >>> w = relay.qnn.op.quantize(relay.const(np.ones((4, 4), "float32")), half, zero, out_dtype="int8")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.qnn.op.dense(x, w, zero, zero, half, half, units=4)))
    >>> table = [("npu.qdense", is_op("qnn.dense")(wildcard(), *[is_constant() for _ in range(5)]))]
    >>> print(fgr.plan(mod, fgr.backend_policy(table)).explain())
    fold plan under policy 'backend:npu': 1 folded, 1 not constant
      main: %0 = qnn.quantize: folded [fold-for:npu.qdense]: npu.qdense wants it constant
      main: %1 = qnn.dense: not constant: 'x' is a run-time input
    """
    read = resolve_table(table)
    return table_policy(read.spec, name=name, binder=TableBinder(ADAPTER, read))


@serialized
def explain_offload(
    mod: tvm.IRModule, table: TableLike, *, policy: Optional[PolicySpec] = None
) -> OffloadReport:
    """Which calls ``table`` offloads from ``mod``, and why each other one is not offloaded.

    As ``fold_guard.relax.explain_offload``: one row per call of an op some pattern is built
    around that reads run-time data, with the composite that took it, or the reason
    (``operand-not-constant``, ``folded-away``, ``check-refused``, ``no-pattern``) and a
    sentence naming the operand, rule or check and the call's operand dtypes, shapes and
    quantization. ``policy``: fold ``mod`` under it first; None explains ``mod`` as given.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="int8")
    >>> zero, half = relay.const(0), relay.const(0.5)
    >>> w = relay.qnn.op.quantize(relay.const(np.ones((4, 4), "float32")), half, zero, out_dtype="int8")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.qnn.op.dense(x, w, zero, zero, half, half, units=4)))
    >>> table = [("npu.qdense", is_op("qnn.dense")(wildcard(), *[is_constant() for _ in range(5)]))]
    >>> [(r.op, r.composite, r.reason.kind) for r in fgr.explain_offload(mod, table, policy="default").rows]
    [('qnn.dense', None, 'operand-not-constant')]
    >>> fgr.explain_offload(mod, table, policy=fgr.backend_policy(table)).offloaded
    1
    """
    return OffloadSession(ADAPTER, mod, resolve_table(table)).report(policy)
