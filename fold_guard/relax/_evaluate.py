"""Run the folded calls of a plan on the compiled kernels, one dependency level at a time.

The calls of one level read only values of earlier levels, so they are independent: the large
ones run on a pool of threads, one per CPU this process may use (a compiled kernel and NumPy's
copies release the GIL), while the calling thread runs the small ones. Where a call runs changes
none of its bits: every call writes its own output tensors, and its kernel is the one it would
run alone. Everything that touches shared state (choosing a kernel, checking a guard, building
an ``-O3`` kernel on demand, recording values and failures) stays on the calling thread.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Mapping, Optional, Sequence, Union

import tvm
from tvm import relax

from .._core.driver import pending_levels
from .._core.graph import FoldGraph, FoldNode
from .._core.planner import FoldPlan, evaluation_error
from . import _compat
from ._host import run_host
from ._kernels import KernelLibrary, KernelSet
from ._lower import CallSite, SiteKind
from ._threads import usable_cpus

__all__ = ["PARALLEL_MIN_BYTES", "evaluate_plan"]

Values = Dict[int, List[tvm.runtime.Tensor]]

#: A call whose outputs are smaller than this runs on the calling thread: handing it to another
#: thread would cost more than it saves.
PARALLEL_MIN_BYTES = 1 << 18


@dataclass
class _Call:
    """One folded call, ready to run: ``run`` returns its output tensors."""

    node: FoldNode
    run: Callable[[], List[object]]
    nbytes: int = 0


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
    With ``strict`` the first failure (in plan order) raises FoldNotPossibleError chained to the
    original error.
    """
    failures: Dict[int, str] = {}
    threads = usable_cpus()
    pool: ContextManager[Optional[ThreadPoolExecutor]] = (
        ThreadPoolExecutor(threads, thread_name_prefix="fold_guard")
        if threads > 1
        else nullcontext()
    )
    with pool as executor:
        for level in pending_levels(plan, values):
            calls: List[_Call] = []
            for node in level:
                try:
                    call = _prepare(node, sites[node.id], kernels, library, plan.graph, values)
                except Exception as err:  # noqa: BLE001 - recorded as this call's failure
                    _record_failure(node, err, failures, strict)
                    continue
                if isinstance(call, str):
                    failures[node.id] = call
                else:
                    calls.append(call)
            outcomes = _run_level(calls, executor)
            for call in calls:  # in plan order, whichever finished first
                outcome = outcomes[call.node.id]
                if isinstance(outcome, Exception):
                    _record_failure(call.node, outcome, failures, strict)
                else:
                    values[call.node.id] = outcome
    return failures


Outcome = Union[List[object], Exception]


def _run_level(
    calls: Sequence[_Call], executor: Optional[ThreadPoolExecutor]
) -> Dict[int, Outcome]:
    large = [c for c in calls if c.nbytes >= PARALLEL_MIN_BYTES] if executor is not None else []
    futures: Dict[int, Future] = {}
    if len(large) > 1:
        assert executor is not None
        futures = {call.node.id: executor.submit(call.run) for call in large}
    outcomes: Dict[int, Outcome] = {}
    for call in calls:
        if call.node.id not in futures:
            outcomes[call.node.id] = _outcome(call.run)
    for node_id, future in futures.items():
        error = future.exception()
        outcomes[node_id] = error if isinstance(error, Exception) else future.result()
    return outcomes


def _outcome(run: Callable[[], List[object]]) -> Outcome:
    try:
        return run()
    except Exception as err:  # noqa: BLE001 - recorded as this call's failure
        return err


def _record_failure(
    node: FoldNode, err: BaseException, failures: Dict[int, str], strict: bool
) -> None:
    failures[node.id] = f"{type(err).__name__}: {err}".splitlines()[0]
    if strict:
        raise evaluation_error(node, failures[node.id]) from err


def _prepare(
    node: FoldNode,
    site: CallSite,
    kernels: KernelSet,
    library: KernelLibrary,
    graph: FoldGraph,
    values: Values,
) -> Union[_Call, str]:
    """How to run ``node``, or why it cannot run; raises where choosing its kernel fails."""
    node_id = node.id
    leaves = [_leaf_value(site, i, graph, values) for i in range(len(site.leaves))]
    if site.kind is SiteKind.ALLOW:
        return _Call(node, lambda: leaves[:1])
    if site.kind is SiteKind.TENSOR_TO_SHAPE:
        shape = relax.ShapeExpr([int(v) for v in leaves[0].numpy().reshape(-1)])
        return _Call(node, lambda: [shape])
    kernel = kernels.kernels.get(node_id)
    if kernel is None:
        return kernels.unsupported.get(node_id, "no kernel was prepared for this call")
    nbytes = sum(info.nbytes or 0 for info in node.outputs)
    host = kernels.host.get(node_id)
    if host is not None:
        return _Call(node, lambda: [run_host(host, leaves, node.outputs[0])], nbytes)
    function = library.function_for(kernel, site, leaves)
    device = tvm.cpu(0)
    outputs = [tvm.runtime.empty(info.shape, info.dtype, device) for info in node.outputs]
    args = [leaves[a] if isinstance(a, int) else a for a in kernel.arg_map]

    def run() -> List[object]:
        function(*args, *outputs)
        return list(outputs)

    return _Call(node, run, nbytes)


def _leaf_value(
    site: CallSite, index: int, graph: FoldGraph, values: Mapping[int, List]
) -> tvm.runtime.Tensor:
    constant = site.leaf_constants[index]
    if constant is not None:
        return _compat.constant_array(constant)
    return values[graph.nodes[site.node_id].inputs[index].source][0]
