"""The fast engine: each folded call run the way ``strategy`` chose, a level at a time.

It builds every kernel its strategies name in one :class:`~.library.KernelLibrary` (through the
kernel cache where there is one), then evaluates a level at a time (``run``): the large calls on
a thread pool, values released as soon as nothing reads them.

Faults never change the output silently. When a fast mechanism fails for a call (a host copy,
a kernel that did not build, a row block, anything that raises while the call is prepared or
run), the call is run again on the reference engine: its bits then are the reference's, and the
fallback is counted in ``stats.fallbacks`` and logged at INFO. Only a call the reference engine
cannot compute either (its kernel fails, as stock's would) becomes "evaluation failed". The one
deliberate exception is a copy whose result the stock kernel leaves undefined
(``host.UndefinedResultError``): that call is kept, as documented, instead of folding garbage.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial
from typing import Any, ContextManager, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..._core.driver import pending_levels, releasable
from ..._core.graph import FoldGraph, FoldNode
from ..._core.planner import FoldPlan
from .._sites import CallSite, KernelSpec
from .cache import KernelCache
from .host import UndefinedResultError, run_host
from .interface import EngineOptions, EngineStats, Values
from .library import KernelLibrary
from .opt_level import OPTIMIZED_TARGET
from .reference import ReferenceEngine, allocate, leaf_values, record_failure
from .run import Call, Outcome, Pool, drop_unneeded, run_level, spent
from .strategy import Strategy, Way, choose_strategies

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
        escaping: frozenset,
        reference: ReferenceEngine,
    ) -> None:
        self._options = options
        self._graph = graph
        self._sites = sites
        self._kernels = kernels
        self._escaping = escaping
        self._reference = reference
        self.stats = EngineStats()
        cache = (
            KernelCache(options.cache_dir, OPTIMIZED_TARGET, max_bytes=options.cache_max_bytes)
            if options.cache_dir is not None
            else None
        )
        self._library = KernelLibrary(cache, options.threads, self.stats)
        self._strategies: Dict[int, Strategy] = {}
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

    def evaluate(self, plan: FoldPlan, values: Values, *, strict: bool) -> Dict[int, str]:
        failures: Dict[int, str] = {}
        release = releasable(plan, self._escaping)
        threads = self._options.threads
        pool: ContextManager[Optional[Pool]] = (
            Pool(threads, warm_up=self._options.pool_warm_up) if threads > 1 else nullcontext()
        )
        # computed this round or held from an earlier one (a consumer whose own value was
        # dropped has still been evaluated)
        evaluated: Set[int] = set(values)
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
        return failures

    def _fall_back(
        self,
        node: FoldNode,
        fault: Exception,
        values: Values,
        failures: Dict[int, str],
        strict: bool,
    ) -> Optional[List[object]]:
        """``node`` computed by the reference engine after ``fault``; None if it fails there too."""
        if isinstance(fault, UndefinedResultError):
            record_failure(node, fault, failures, strict)
            return None
        try:
            outputs = self._reference.compute(node, values)
        except Exception as err:  # noqa: BLE001 - the call fails as stock's would: recorded
            record_failure(node, err, failures, strict)
            return None
        note = f"{node.label} = {node.op}: {type(fault).__name__}: {fault}".splitlines()[0]
        self.stats.fallbacks.append(note)
        logger.info("fold_guard: reran %s on the reference engine", note)
        return outputs

    def _call(self, node: FoldNode, values: Values) -> Call:
        """``node`` ready to run as its strategy says; raises a fault where that cannot be."""
        site = self._sites[node.id]
        strategy = self._strategies.get(node.id)
        if strategy is None:
            raise LookupError(f"no strategy for {node.label} = {node.op}")
        leaves = leaf_values(site, self._graph, values)
        if strategy.way in (Way.OPERAND, Way.SHAPE):
            outputs = self._reference.compute(node, values)  # no kernel: nothing to speed up
            return Call(node, lambda: [lambda: outputs])
        nbytes = sum(info.nbytes or 0 for info in node.outputs)
        if strategy.way is Way.HOST_COPY:
            host, striped = strategy.host, self._options.striped_transposes
            assert host is not None, "a host-copy strategy names its copy"

            def start_copy() -> List[Any]:
                (out,) = allocate(node.outputs[:1])
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
            outputs = allocate(node.outputs)
            if blocks is None:
                return [partial(_run_kernel, function, args, outputs, outputs)]
            return [
                partial(_run_kernel, function, block_args, block_outputs, outputs)
                for block_args, block_outputs in blocks.arguments(kernel.arg_map, args, outputs)
            ]

        return Call(node, start, nbytes, len(blocks.bounds) if blocks is not None else 1)


def _run_kernel(
    function: Any, args: Sequence[object], writes: Sequence[object], outputs: Sequence[object]
) -> List[object]:
    """Run ``function`` writing ``writes`` (the outputs, or a block's rows of them); return ``outputs``."""
    function(*args, *writes)
    return list(outputs)
