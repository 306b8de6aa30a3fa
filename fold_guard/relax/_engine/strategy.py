"""How the fast engine runs each folded call: the one place that decides it.

For every folded node, :func:`choose_strategies` picks one way, in this order:

==============  ===========================================================================
way             when
==============  ===========================================================================
``OPERAND``     ``fold_allow``: its operand's value is its value
``SHAPE``       ``tensor_to_shape``: the shape values are read from the operand
``HOST_COPY``   data movement NumPy copies bit for bit (``host``), if ``host_copies`` is on
``KERNEL``      everything else: the legalized kernel, built for ``target`` (``-O0`` where
                ``opt_level`` proves it exact, if ``quick_builds`` is on; else stock's
                ``-O3``), checked against ``guard`` just before it runs (a call that fails the
                guard runs the ``-O3`` build); a large quantize / dequantize in ``row_blocks``
                over the threads, if ``row_blocks`` is on
==============  ===========================================================================

Nothing here runs anything: the strategy of a call is data (:class:`Strategy`), and
``fast`` follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..._core.graph import FoldGraph
from ..._core.planner import FoldPlan
from .._sites import CallSite, KernelSpec, SiteKind
from .host import HostFunction, host_function
from .interface import EngineOptions
from .opt_level import OPTIMIZED_TARGET, ValueGuard, build_target
from .row_blocks import RowBlocks, row_blocks

__all__ = ["Strategy", "Way", "choose_strategies"]


class Way(Enum):
    """The ways a folded call can be computed (see the module docstring)."""

    OPERAND = "operand"
    SHAPE = "shape"
    HOST_COPY = "host copy"
    KERNEL = "kernel"


@dataclass(frozen=True, eq=False)
class Strategy:
    """How one folded call runs; ``kernel`` and the fields after it only where ``way`` needs them."""

    way: Way
    kernel: Optional[KernelSpec] = None
    host: Optional[HostFunction] = None
    target: str = OPTIMIZED_TARGET
    guard: Optional[ValueGuard] = None
    blocks: Optional[RowBlocks] = None

    def target_for(self, site: CallSite, leaves: Sequence[Any]) -> str:
        """The target to run ``site`` with on these operand values: ``-O3`` where the guard fails."""
        if self.guard is None or self.guard(site, [np.from_dlpack(leaf) for leaf in leaves]):
            return self.target
        return OPTIMIZED_TARGET


def choose_strategies(
    plan: FoldPlan,
    graph: FoldGraph,
    sites: Sequence[CallSite],
    kernels: Mapping[int, KernelSpec],
    options: EngineOptions,
) -> Dict[int, Strategy]:
    """The strategy of every folded call of ``plan`` that can run (one without a kernel has none)."""
    targets: Dict[int, tuple] = {}  # by id of the KernelSpec: (target, guard), decided per kernel
    strategies: Dict[int, Strategy] = {}
    for decision in plan.folded:
        site = sites[decision.node]
        if site.kind is SiteKind.ALLOW:
            strategies[site.node_id] = Strategy(Way.OPERAND)
            continue
        if site.kind is SiteKind.TENSOR_TO_SHAPE:
            strategies[site.node_id] = Strategy(Way.SHAPE)
            continue
        kernel = kernels.get(site.node_id)
        if kernel is None:
            continue
        host = host_function(site) if options.host_copies and site.kind is SiteKind.OP else None
        if host is not None:
            strategies[site.node_id] = Strategy(Way.HOST_COPY, kernel, host)
            continue
        if id(kernel) not in targets:
            members = _members(kernel, sites) if site.kind is SiteKind.OP else []
            targets[id(kernel)] = (
                build_target(members)
                if members and options.quick_builds
                else (OPTIMIZED_TARGET, None)
            )
        target, guard = targets[id(kernel)]
        blocks = (
            row_blocks(site, graph.nodes[site.node_id], kernel.result_type, options.threads)
            if options.row_blocks
            else None
        )
        strategies[site.node_id] = Strategy(Way.KERNEL, kernel, None, target, guard, blocks)
    return strategies


def _members(kernel: KernelSpec, sites: Sequence[CallSite]) -> List[CallSite]:
    return [sites[node_id] for node_id in kernel.members]
