"""The fast engine: each folded call run the way ``strategy`` chose, a level at a time.

It builds every kernel its strategies name in one :class:`~.library.KernelLibrary` (through the
kernel cache where there is one), then evaluates a level at a time (``run``): the large calls on
a thread pool, values released as soon as nothing reads them.

Faults never change the output silently. When a fast mechanism fails for a call (a host copy,
a kernel that did not build, a row block, anything that raises while the call is prepared or
run), the call is run again on the reference engine: its bits then are the reference's, and the
fallback is counted in ``stats.fallbacks`` and logged at INFO. Only a call the reference engine
cannot compute either (its kernel fails, as stock's would) becomes "evaluation failed". A bug of
this engine's own bookkeeping (a folded call with no strategy) is no fault of the evaluation: it
raises :class:`~fold_guard.PlanInvariantError`, never retried. The one
deliberate exception is a copy whose result the stock kernel leaves undefined
(``host.UndefinedResultError``): that call is kept, as documented, instead of folding garbage.
A call whose stock kernel is built around one of its 0-d operands' values (``strategy``'s
``STOCK`` way) is computed by the reference engine too, by design: not a fallback. A fill that
only other fills read stays a ``fills.LazyFill`` and is dropped unwritten; should anything read
it after all (a consumer rerun on the reference engine), it is computed then.

This engine assembles its operands, allocates its outputs and records its failures itself: it
shares no helper with the reference engine it is compared with.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial
from typing import Any, ContextManager, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import tvm

from ..._core.driver import pending_levels
from ..._core.errors import PlanInvariantError
from ..._core.graph import FoldGraph, FoldNode, InputKind, TensorInfo
from ..._core.planner import FoldPlan, evaluation_error
from .. import _compat
from .._sites import CallSite, KernelSpec
from .cache import KernelCache
from .fills import FILL_PARTS_MIN_BYTES, LazyFill, fill_parts
from .host import UndefinedResultError, run_host
from .interface import EngineOptions, EngineStats, Values
from .library import KernelLibrary
from .opt_level import OPTIMIZED_TARGET
from .reference import ReferenceEngine
from .run import Call, Outcome, Pool, drop_unneeded, run_level, spent
from .strategy import Strategy, Way, choose_strategies, needs_stock_kernel

__all__ = ["FastEngine"]

logger = logging.getLogger("fold_guard")


class FastEngine:
    """The :class:`~fold_guard.relax._engine.interface.Engine` with every speed mechanism."""

    def __init__(
        self,
        options: EngineOptions,
        graph: FoldGraph,
        sites: Sequence[CallSite],
        kernels: Mapping[int, KernelSpec],
        reference: ReferenceEngine,
    ) -> None:
        self._options = options
        self._graph = graph
        self._sites = sites
        self._kernels = kernels
        self._reference = reference
        self.stats = EngineStats()
        cache = (
            KernelCache(options.cache_dir, OPTIMIZED_TARGET, max_bytes=options.cache_max_bytes)
            if options.cache_dir is not None
            else None
        )
        self._library = KernelLibrary(cache, options.threads, self.stats)
        self._strategies: Dict[int, Strategy] = {}
        self._lazy: Set[int] = set()
        #: (id of a KernelSpec, target) -> its compiled function (the spec lives in _kernels)
        self._functions: Dict[Tuple[int, str], Any] = {}

    def prepare(self, plan: FoldPlan) -> None:
        self._strategies = choose_strategies(
            plan, self._graph, self._sites, self._kernels, self._options
        )
        self._library.build(
            (strategy.kernel.prim_func, strategy.target)
            for strategy in self._strategies.values()
            if strategy.way is Way.KERNEL and strategy.kernel is not None
        )

    def evaluate(
        self,
        plan: FoldPlan,
        values: Values,
        *,
        strict: bool,
        release: Mapping[int, Sequence[int]],
    ) -> Dict[int, str]:
        failures: Dict[int, str] = {}
        threads = self._options.threads
        pool: ContextManager[Optional[Pool]] = (
            Pool(threads, warm_up=self._options.pool_warm_up) if threads > 1 else nullcontext()
        )
        # computed this round or held from an earlier one (a consumer whose own value was
        # dropped has still been evaluated)
        evaluated: Set[int] = set(values)
        # fills that only fills read, and nothing after them: never written (``fills``)
        self._lazy = {
            node_id
            for node_id, strategy in self._strategies.items()
            if strategy.way is Way.FILL
            and node_id in release
            and all(self._way(consumer) is Way.FILL for consumer in release[node_id])
        }
        faults: Dict[int, Exception] = {}

        def finished(call: Call, outcome: Outcome) -> None:
            call.start = spent  # its operands and closure go now, not at the level's end
            if isinstance(outcome, Exception):
                faults[call.node.id] = outcome
                return
            values[call.node.id] = outcome
            evaluated.add(call.node.id)
            drop_unneeded(call.node, release, evaluated, values)

        with pool as executor:
            for level in pending_levels(plan, values):
                calls: List[Call] = []
                for node in level:
                    try:
                        calls.append(self._call(node, values))
                    except Exception as err:  # noqa: BLE001 - a fault: rerun below, counted
                        faults[node.id] = err
                run_level(calls, executor, threads, finished)
                for node in level:  # in plan order, whichever finished first
                    if node.id in faults:
                        outputs = self._fall_back(
                            node, faults.pop(node.id), values, failures, strict
                        )
                        if outputs is not None:
                            values[node.id] = outputs
                            evaluated.add(node.id)
                            drop_unneeded(node, release, evaluated, values)
        # a lazy fill still held is read after all (a consumer failed, so the re-plan keeps it)
        for node_id, outputs in values.items():
            if any(isinstance(value, LazyFill) for value in outputs):
                values[node_id] = [_written(value) for value in outputs]
        return failures

    def _unlazy(self, node: FoldNode, values: Values) -> None:
        """The lazy fills ``node`` reads, computed by the reference engine (theirs first)."""
        for inp in node.inputs:
            if inp.kind is not InputKind.NODE or inp.source not in values:
                continue
            if any(isinstance(value, LazyFill) for value in values[inp.source]):
                source = self._graph.nodes[inp.source]
                self._unlazy(source, values)
                values[inp.source] = self._reference.compute(source, values)

    def _way(self, node_id: int) -> Optional[Way]:
        strategy = self._strategies.get(node_id)
        return strategy.way if strategy is not None else None

    def _fall_back(
        self,
        node: FoldNode,
        fault: Exception,
        values: Values,
        failures: Dict[int, str],
        strict: bool,
    ) -> Optional[List[object]]:
        """``node`` computed by the reference engine after ``fault``; None if it fails there too."""
        if isinstance(fault, PlanInvariantError):
            raise fault  # an internal bug, not a fault of the evaluation: never retried
        if isinstance(fault, UndefinedResultError):
            _fail(node, fault, failures, strict)
            return None
        try:
            self._unlazy(node, values)  # the reference engine reads tensors
            outputs = self._reference.compute(node, values)
        except Exception as err:  # noqa: BLE001 - the call fails as stock's would: recorded
            _fail(node, err, failures, strict)
            return None
        if isinstance(fault, _StockKernel):
            return outputs
        note = f"{node.label} = {node.op}: {type(fault).__name__}: {fault}".splitlines()[0]
        self.stats.fallbacks.append(note)
        logger.info("fold_guard: reran %s on the reference engine", note)
        return outputs

    def _call(self, node: FoldNode, values: Values) -> Call:
        """``node`` ready to run as its strategy says; raises a fault where that cannot be."""
        site = self._sites[node.id]
        strategy = self._strategies.get(node.id)
        if strategy is None:
            raise PlanInvariantError(
                f"the fast engine has no strategy for folded call {node.label} = {node.op}; "
                "please report it"
            )
        nbytes = sum(info.nbytes or 0 for info in node.outputs)
        if strategy.way is Way.FILL:  # reads no operand: a lazy one stays unwritten
            return self._fill(node, strategy, nbytes)
        leaves = self._operands(node, site, values)
        if strategy.way in (Way.OPERAND, Way.SHAPE):
            outputs = self._reference.compute(node, values)  # no kernel: nothing to speed up
            return Call(node, lambda: [lambda: outputs])
        if strategy.way is Way.STOCK or (
            strategy.scalars_checked and needs_stock_kernel(site, leaves)
        ):
            raise _StockKernel(f"{node.label} = {node.op}: a 0-d operand is compiled in")
        if strategy.way is Way.HOST_COPY:
            host, striped = strategy.host, self._options.striped_transposes
            assert host is not None, "a host-copy strategy names its copy"

            def start_copy() -> List[Any]:
                (out,) = _empty(node.outputs[:1])
                return [lambda: [run_host(host, leaves, out, striped=striped)]]

            return Call(node, start_copy, nbytes)
        kernel = strategy.kernel
        assert kernel is not None, "a kernel strategy names its kernel"
        target = strategy.target_for(site, leaves)
        function = self._functions.get((id(kernel), target))
        if function is None:
            function = self._functions[(id(kernel), target)] = self._library.function(
                kernel.prim_func, target
            )
        args = [leaves[a] if isinstance(a, int) else a for a in kernel.arg_map]
        blocks = strategy.blocks

        def start() -> List[Any]:
            outputs = _empty(node.outputs)
            if blocks is None:
                return [partial(_run_kernel, function, args, outputs, outputs)]
            return [
                partial(_run_kernel, function, block_args, block_outputs, outputs)
                for block_args, block_outputs in blocks.arguments(kernel.arg_map, args, outputs)
            ]

        return Call(node, start, nbytes, len(blocks.bounds) if blocks is not None else 1)

    def _fill(self, node: FoldNode, strategy: Strategy, nbytes: int) -> Call:
        """``node`` as a fill: a :class:`LazyFill` if only fills read it, else written in parts."""
        scalar = strategy.scalar
        assert scalar is not None, "a fill strategy names its bits"
        shapes = [tuple(int(d or 0) for d in info.shape or ()) for info in node.outputs]
        if node.id in self._lazy:
            lazy: List[object] = [LazyFill(scalar, shape) for shape in shapes]
            return Call(node, lambda: [lambda: lazy])
        threads = self._options.threads

        def start() -> List[Any]:
            outputs = _empty(node.outputs)
            writes = [part for out in outputs for part in fill_parts(out, scalar, threads)]
            if not writes:
                return [lambda: outputs]
            return [partial(_write_part, write, outputs) for write in writes]

        parts = len(node.outputs) * (threads if nbytes >= FILL_PARTS_MIN_BYTES else 1)
        return Call(node, start, nbytes, parts)

    def _operands(self, node: FoldNode, site: CallSite, values: Values) -> List[Any]:
        """Per operand of ``site``: the tensor of its constant, else of the node it reads (None
        for one whose value the kernel does not read and that has none here)."""
        operands: List[Any] = []
        for constant, inp in zip(site.leaf_constants, node.inputs):
            if constant is not None:
                operands.append(_compat.constant_array(constant))
            elif inp.kind is InputKind.NODE and (inp.reads_value or inp.source in values):
                value = values[inp.source][0]
                if isinstance(value, LazyFill):  # decided lazy, read after all: write it now
                    values[inp.source] = [_written(v) for v in values[inp.source]]
                    value = values[inp.source][0]
                operands.append(value)
            else:
                operands.append(None)
        return operands


class _StockKernel(Exception):
    """Raised for a call the reference engine computes by design (see ``Way.STOCK``)."""


def _empty(outputs: Sequence[TensorInfo]) -> List[Any]:
    """Uninitialised CPU tensors for ``outputs`` (static types: a folded call has them)."""
    return [tvm.runtime.empty(out.shape, out.dtype, tvm.cpu(0)) for out in outputs]


def _fail(node: FoldNode, err: BaseException, failures: Dict[int, str], strict: bool) -> None:
    """Record why ``node`` could not be evaluated; with ``strict`` raise it, chained."""
    text = failures[node.id] = str(f"{type(err).__name__}: {err}").split("\n", 1)[0]
    if strict:
        raise evaluation_error(node, text) from err


def _written(value: object) -> object:
    """``value`` as a tensor: a :class:`LazyFill` written out, anything else as it is."""
    return value.materialize() if isinstance(value, LazyFill) else value


def _write_part(write: Any, outputs: Sequence[object]) -> List[object]:
    """Write one part of a fill; return the call's outputs."""
    write()
    return list(outputs)


def _run_kernel(
    function: Any, args: Sequence[object], writes: Sequence[object], outputs: Sequence[object]
) -> List[object]:
    """Run ``function`` writing ``writes`` (the outputs, or a block's rows of them); return ``outputs``."""
    function(*args, *writes)
    return list(outputs)
