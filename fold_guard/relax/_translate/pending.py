"""Stock decisions that wait for a 0-d operand folded earlier in the same pass.

The stock pass legalizes a call with its 0-d operands as constants, values included, and a
legalizer may reject a value (a division's simplifier raises "Divide by zero" on a zero
divisor). When such an operand is itself folded in this pass, its value is unknown while the
plan is made: the planning legalization shows it as one (:mod:`.requests`), and the decision is
made again on the real value once it is evaluated (:func:`check_pending_scalars`), before the
plan is final. A call stock would not fold there is then kept, with stock's reason.

    lv = sqrt(2.0)        folds
    lv1 = divide(c, lv)   folds: legalized on 1.414 once lv has its value (on 0.0: kept)
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..._core.graph import FoldGraph, InputKind
from ..._core.planner import FoldPlan
from .. import _compat
from .._sites import CallSite, KernelSpec, SiteKind
from .._stock import scalar_rule
from .requests import leaf_type, legalize_requests, make_request

__all__ = [
    "check_pending_scalars",
    "pending_scalar_leaves",
    "scalar_sources",
    "stock_legalization_error",
]


def pending_scalar_leaves(
    sites: Sequence[CallSite], kernels: Mapping[int, KernelSpec]
) -> Dict[int, Tuple[int, ...]]:
    """Per operator call with a kernel: its 0-d operands that are not literal constants."""
    pending: Dict[int, Tuple[int, ...]] = {}
    for site in sites:
        if site.node_id in kernels and site.kind is SiteKind.OP:
            leaves = tuple(
                i
                for i, constant in enumerate(site.leaf_constants)
                if constant is None and _compat.static_shape(leaf_type(site, i)) == ()
            )
            if leaves:
                pending[site.node_id] = leaves
    return pending


def scalar_sources(graph: FoldGraph, pending: Mapping[int, Tuple[int, ...]]) -> FrozenSet[int]:
    """The nodes whose values :func:`check_pending_scalars` reads (kept until it has)."""
    nodes = graph.nodes
    return frozenset(
        nodes[node].inputs[leaf].source
        for node, leaves in pending.items()
        for leaf in leaves
        if nodes[node].inputs[leaf].kind is InputKind.NODE
    )


def check_pending_scalars(
    sites: Sequence[CallSite],
    pending: Mapping[int, Tuple[int, ...]],
    plan: FoldPlan,
    values: Mapping[int, Sequence[object]],
) -> Dict[int, str]:
    """The folded calls stock would not fold, judged on their pending operands' values.

    Judged wherever those values are known, whether or not the call itself was evaluated (an
    engine that legalizes on the values, as stock does, fails such a call with the legalizer's
    error; stock's reason takes its place).
    """
    found: Dict[int, str] = {}
    nodes = plan.graph.nodes
    for decision in plan.folded:
        leaves = pending.get(decision.node)
        if not leaves:
            continue
        inputs = nodes[decision.node].inputs
        scalars = {
            leaf: values[inputs[leaf].source][0].numpy()  # type: ignore[attr-defined]
            for leaf in leaves
            if inputs[leaf].kind is InputKind.NODE and inputs[leaf].source in values
        }
        if len(scalars) != len(leaves):
            continue
        why = stock_legalization_error(sites[decision.node], scalars)
        if why is not None:
            found[decision.node] = why
    return found


def stock_legalization_error(site: CallSite, scalars: Mapping[int, np.ndarray]) -> Optional[str]:
    """Why the stock pass would not fold ``site`` with these 0-d operand values, or None.

    The stock pass legalizes a call with its scalar operands as constants, values included; this
    does the same with ``scalars`` (leaf index -> value, for the leaves that were still pending
    when the call was first legalized). Stock raises where ``LegalizeOps`` raises: the call is
    then kept with that error, as every call stock cannot evaluate.
    """
    func, request = make_request(
        "check", [site], symbolic=False, scalars_as_constants=True, scalars=scalars
    )
    legalized, errors = legalize_requests({request.name: func})
    if request.name in errors:
        return scalar_rule(site.op_name, None, errors[request.name])
    return scalar_rule(site.op_name, legalized[request.name][request.name])
