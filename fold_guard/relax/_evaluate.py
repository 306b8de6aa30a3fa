"""Run the folded calls of a plan on the compiled kernels, one dependency level at a time.

The calls of one level read only values of earlier levels, so they are independent: the large
ones run on a pool of threads, one per CPU this process may use (a compiled kernel and NumPy's
copies release the GIL), while the calling thread runs the small ones. A large quantize or
dequantize runs in blocks of rows, one per thread (``_row_blocks``). Where a call runs changes
none of its bits: every call writes its own output tensors (a block its own rows of them), and
its kernel is the one it would run alone. Everything that touches shared state (choosing a
kernel, checking a guard, building an ``-O3`` kernel on demand, recording values and failures)
stays on the calling thread.

As each call finishes, the values nothing needs any more are dropped (``releasable``: every
consumer folded and evaluated, no use outside the graph), and a call allocates its outputs only
when it starts, so a model's intermediate constants (the int8 weights between ``quantize`` and
``dequantize``) do not all stay alive to the end.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import (
    AbstractSet,
    Any,
    Callable,
    ContextManager,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Union,
)

import tvm
from tvm import relax

from .._core.driver import pending_levels, releasable
from .._core.graph import FoldGraph, FoldNode, InputKind, TensorInfo
from .._core.planner import FoldPlan, evaluation_error
from . import _compat
from ._host import run_host
from ._kernels import KernelLibrary, KernelSet
from ._lower import CallSite, SiteKind
from ._row_blocks import row_blocks
from ._threads import usable_cpus

__all__ = ["PARALLEL_MIN_BYTES", "evaluate_plan"]

Values = Dict[int, List[tvm.runtime.Tensor]]

#: A call whose outputs are smaller than this runs on the calling thread: handing it to another
#: thread would cost more than it saves.
PARALLEL_MIN_BYTES = 1 << 18


#: A part of a call's computation; each returns the call's output tensors.
Run = Callable[[], List[object]]


@dataclass(eq=False)
class _Call:
    """One folded call, ready to run.

    ``start`` allocates its outputs, on the calling thread (allocations on pool threads land in
    per-thread malloc arenas, which hold on to freed memory: +33 MiB at 1 GiB of weights), and
    returns the computation in ``parts`` parts, which any threads may run at once.
    """

    node: FoldNode
    start: Callable[[], Sequence[Run]]
    nbytes: int = 0
    parts: int = 1


def evaluate_plan(
    plan: FoldPlan,
    sites: Sequence[CallSite],
    kernels: KernelSet,
    library: KernelLibrary,
    values: Values,
    *,
    escaping: AbstractSet[int] = frozenset(),
    strict: bool = False,
) -> Dict[int, str]:
    """Fill ``values`` (node id -> output tensors) for every folded node the rewrite will need.

    A folded node whose consumers are all folded and evaluated, and that is not in ``escaping``
    (``LoweredModule.escaping``), has its value dropped from ``values`` once they are.

    Returns the nodes whose evaluation failed, with the error text; the caller re-plans with them.
    With ``strict`` the first failure (in plan order) raises FoldNotPossibleError chained to the
    original error.
    """
    failures: Dict[int, str] = {}
    release = releasable(plan, escaping)
    threads = usable_cpus()
    pool: ContextManager[Optional[_Pool]] = _Pool(threads) if threads > 1 else nullcontext()
    errors: Dict[int, Exception] = {}
    # computed this round or still held from an earlier one (a consumer whose own value was
    # dropped has still been evaluated)
    evaluated: Set[int] = set(values)

    def finished(call: _Call, outcome: Outcome) -> None:
        call.start = _spent  # its operands and closure go now, not at the level's end
        if isinstance(outcome, Exception):
            errors[call.node.id] = outcome
        else:
            values[call.node.id] = outcome
            evaluated.add(call.node.id)
            _drop_unneeded(call.node, release, evaluated, values)

    with pool as executor:
        for level in pending_levels(plan, values):
            calls: List[_Call] = []
            for node in level:
                try:
                    call = _prepare(
                        node, sites[node.id], kernels, library, plan.graph, values, threads
                    )
                except Exception as err:  # noqa: BLE001 - recorded as this call's failure
                    _record_failure(node, err, failures, strict)
                    continue
                if isinstance(call, str):
                    failures[node.id] = call
                else:
                    calls.append(call)
            _run_level(calls, executor, threads, finished)
            for call in calls:  # in plan order, whichever finished first
                if call.node.id in errors:
                    _record_failure(call.node, errors[call.node.id], failures, strict)
    return failures


class _Pool:
    """A thread pool whose threads all start with its first task.

    ``ThreadPoolExecutor`` starts a thread for a task only if it counts no idle one, and it
    counts one per task ended, not per thread waiting: after a level of many calls it may count
    idle threads that are busy, and leave the row blocks of the next level's one large call to a
    single thread. So the first task is preceded by one per thread that waits for all of them to
    arrive. A fold with no large call starts no thread.
    """

    def __init__(self, threads: int):
        self._threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="fold_guard")
        self._started = False

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True)

    def submit(self, task: Callable[[], List[object]]) -> Future:
        if not self._started:
            self._started = True
            arrived = threading.Barrier(self._threads)

            def arrive() -> None:
                try:
                    arrived.wait(timeout=10)
                except threading.BrokenBarrierError:  # a thread that never started
                    pass

            for _ in range(self._threads):
                self._executor.submit(arrive)
        return self._executor.submit(task)


def _spent() -> Sequence[Run]:
    raise AssertionError("a folded call ran twice")


def _drop_unneeded(
    node: FoldNode,
    release: Mapping[int, Sequence[int]],
    evaluated: AbstractSet[int],
    values: Values,
) -> None:
    """Drop the values of ``node`` (just evaluated) and its operands that nothing needs any more."""
    candidates = [inp.source for inp in node.inputs if inp.kind is InputKind.NODE]
    for node_id in (*candidates, node.id):
        consumers = release.get(node_id)
        if consumers is not None and all(consumer in evaluated for consumer in consumers):
            values.pop(node_id, None)


Outcome = Union[List[object], Exception]


def _run_level(
    calls: Sequence[_Call],
    executor: Optional[_Pool],
    threads: int,
    finished: Callable[[_Call, Outcome], None],
) -> None:
    """Run ``calls``, the large ones on ``executor``; ``finished`` sees each outcome on this thread.

    Large calls are started (their outputs allocated) while fewer than ``threads`` parts run,
    and each outcome is handed to ``finished`` as its call's last part ends: the operands a call
    was the last to read are dropped before the next call allocates, so the level's outputs
    replace its operands instead of coming on top of them.
    """
    large = [c for c in calls if c.nbytes >= PARALLEL_MIN_BYTES] if executor is not None else []
    if sum(c.parts for c in large) < 2:
        large = []
    waiting = deque(large)
    running: Dict[Future, _Call] = {}
    parts_left: Dict[_Call, int] = {}
    errors: Dict[_Call, Exception] = {}

    def start_next() -> None:
        """Start the next waiting call that allocates (one that cannot is recorded as failed)."""
        assert executor is not None
        while waiting:
            call = waiting.popleft()
            try:
                parts = call.start()
            except Exception as err:  # noqa: BLE001 - recorded as this call's failure
                finished(call, err)
                continue
            parts_left[call] = len(parts)
            for part in parts:
                running[executor.submit(part)] = call
            return

    def fill() -> None:
        while waiting and len(running) < threads:
            start_next()

    def collect(block: bool) -> None:
        """Hand over the calls whose last part ended (with ``block``, wait for a part first)."""
        if block:
            done = list(wait(running, return_when=FIRST_COMPLETED)[0])
        else:
            done = [future for future in running if future.done()]
        for future in done:
            call = running.pop(future)
            error = future.exception()
            if isinstance(error, Exception):
                errors.setdefault(call, error)
            elif error is not None:
                future.result()  # KeyboardInterrupt and the like: raised here
            parts_left[call] -= 1
            if not parts_left[call]:
                del parts_left[call]
                finished(call, errors.pop(call) if call in errors else future.result())
        fill()

    fill()
    on_pool = set(large)
    for call in calls:
        if call not in on_pool:
            finished(call, _outcome(call))
            # a pool thread whose part ended gets the next one now, not after the small calls
            if running:
                collect(block=False)
    while running:
        collect(block=True)


def _outcome(call: _Call) -> Outcome:
    """Run all of ``call`` on this thread."""
    try:
        outputs: List[object] = []
        for part in call.start():
            outputs = part()
        return outputs
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
    threads: int,
) -> Union[_Call, str]:
    """How to run ``node``, or why it cannot run; raises where choosing its kernel fails."""
    node_id = node.id
    leaves = [_leaf_value(site, i, graph, values) for i in range(len(site.leaves))]
    if site.kind is SiteKind.ALLOW:
        return _Call(node, lambda: [lambda: leaves[:1]])
    if site.kind is SiteKind.TENSOR_TO_SHAPE:
        shape = relax.ShapeExpr([int(v) for v in leaves[0].numpy().reshape(-1)])
        return _Call(node, lambda: [lambda: [shape]])
    kernel = kernels.kernels.get(node_id)
    if kernel is None:
        return kernels.unsupported.get(node_id, "no kernel was prepared for this call")
    nbytes = sum(info.nbytes or 0 for info in node.outputs)
    host = kernels.host.get(node_id)
    if host is not None:

        def start_copy() -> Sequence[Run]:
            (out,) = _allocate(node.outputs[:1])
            return [lambda: [run_host(host, leaves, out)]]

        return _Call(node, start_copy, nbytes)
    function = library.function_for(kernel, site, leaves)
    args = [leaves[a] if isinstance(a, int) else a for a in kernel.arg_map]
    blocks = row_blocks(site, node, kernel.out_ty, threads)

    def start() -> Sequence[Run]:
        outputs = _allocate(node.outputs)
        if blocks is None:
            return [partial(_run_kernel, function, args, outputs, outputs)]
        return [
            partial(_run_kernel, function, block_args, block_outputs, outputs)
            for block_args, block_outputs in blocks.arguments(kernel.arg_map, args, outputs)
        ]

    return _Call(node, start, nbytes, len(blocks.bounds) if blocks is not None else 1)


def _run_kernel(
    function: Any,
    args: Sequence[object],
    writes: Sequence[tvm.runtime.Tensor],
    outputs: Sequence[tvm.runtime.Tensor],
) -> List[object]:
    """Run ``function`` writing ``writes`` (the outputs, or a block's rows of them); return ``outputs``."""
    function(*args, *writes)
    return list(outputs)


def _allocate(outputs: Sequence[TensorInfo]) -> List[tvm.runtime.Tensor]:
    """New CPU tensors of the (static) result types ``outputs``, for a call to write into."""
    device = tvm.cpu(0)
    tensors = []
    for info in outputs:
        assert info.shape is not None and None not in info.shape, "folded results are static"
        tensors.append(tvm.runtime.empty(info.shape, info.dtype, device))
    return tensors


def _leaf_value(
    site: CallSite, index: int, graph: FoldGraph, values: Mapping[int, List]
) -> tvm.runtime.Tensor:
    constant = site.leaf_constants[index]
    if constant is not None:
        return _compat.constant_array(constant)
    return values[graph.nodes[site.node_id].inputs[index].source][0]
