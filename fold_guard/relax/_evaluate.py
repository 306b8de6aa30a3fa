"""Run the folded calls of a plan, in topological order, on the compiled kernels."""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import tvm
from tvm import relax

from .._core.driver import pending
from .._core.graph import FoldGraph
from .._core.planner import FoldPlan, evaluation_error
from . import _compat
from ._host import run_host
from ._kernels import KernelLibrary, KernelSet
from ._lower import CallSite, SiteKind

__all__ = ["evaluate_plan"]

Values = Dict[int, List[tvm.runtime.Tensor]]


def evaluate_plan(
    plan: FoldPlan,
    sites: Sequence[CallSite],
    kernels: KernelSet,
    library: KernelLibrary,
    values: Values,
    *,
    strict: bool = False,
) -> Dict[int, str]:
    """Fill ``values`` (node id -> output tensors) for every folded node not yet in it.

    Returns the nodes whose evaluation failed, with the error text; the caller re-plans with them.
    With ``strict`` the first failure raises FoldNotPossibleError chained to the original error.
    """
    failures: Dict[int, str] = {}
    device = tvm.cpu(0)
    graph: FoldGraph = plan.graph
    for node in pending(plan, values):
        node_id = node.id
        site = sites[node_id]
        leaves = [_leaf_value(site, i, graph, values) for i in range(len(site.leaves))]
        if site.kind is SiteKind.ALLOW:
            values[node_id] = leaves[:1]
            continue
        if site.kind is SiteKind.TENSOR_TO_SHAPE:
            values[node_id] = [relax.ShapeExpr([int(v) for v in leaves[0].numpy().reshape(-1)])]
            continue
        kernel = kernels.kernels.get(node_id)
        if kernel is None:
            failures[node_id] = kernels.unsupported.get(
                node_id, "no kernel was prepared for this call"
            )
            continue
        host = kernels.host.get(node_id)
        try:
            if host is not None:
                outputs = [run_host(host, leaves, node.outputs[0])]
            else:
                outputs = [tvm.runtime.empty(i.shape, i.dtype, device) for i in node.outputs]
                args = [leaves[a] if isinstance(a, int) else a for a in kernel.arg_map]
                library.function_for(kernel, site, leaves)(*args, *outputs)
        except Exception as err:
            failures[node_id] = f"{type(err).__name__}: {err}".splitlines()[0]
            if strict:
                raise evaluation_error(node, failures[node_id]) from err
            continue
        values[node_id] = outputs
    return failures


def _leaf_value(
    site: CallSite, index: int, graph: FoldGraph, values: Mapping[int, List]
) -> tvm.runtime.Tensor:
    constant = site.leaf_constants[index]
    if constant is not None:
        return _compat.constant_array(constant)
    return values[graph.nodes[site.node_id].inputs[index].source][0]
