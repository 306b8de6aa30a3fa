"""How the fast engine runs each folded call: the one place that decides it.

For every folded node, :func:`choose_strategies` picks one way, in this order:

==============  ===========================================================================
way             when
==============  ===========================================================================
``OPERAND``     ``fold_allow``: its operand's value is its value
``SHAPE``       ``tensor_to_shape``: the shape values are read from the operand
``FILL``        every element of the result has one bit pattern, known from the kernel's TIR
                and its sources (``fills``: ``broadcast_to`` of a one-element constant, a
                transpose of that), if ``fills`` is on: written without a kernel
``STOCK``       an operator call with a 0-d constant operand whose value stock's kernel is
                built around (``_stock.value_shapes_kernel``: ``pow(x, 0.5)``, ``x * 0``): the
                reference engine computes it, with stock's kernel for that value
``HOST_COPY``   data movement NumPy copies bit for bit (``host``), if ``host_copies`` is on
``KERNEL``      everything else: the legalized kernel, built for ``target`` (``-O0`` where
                ``opt_level`` proves it exact, if ``quick_builds`` is on: every kernel that
                only moves data (``movement``), some arithmetic under conditions; else stock's
                ``-O3``), checked against ``guard`` just before it runs (a call that fails the
                guard runs the ``-O3`` build); a large quantize / dequantize in ``row_blocks``
                over the threads, if ``row_blocks`` is on; a shared kernel reads its 0-d
                operands from memory, and where one is computed by an earlier fold its value
                is checked just before the call (``scalars_checked``), the call going the
                ``STOCK`` way where stock's kernel depends on it
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
from .. import _compat
from .._sites import CallSite, KernelSpec, SiteKind
from .._stock import scalar_value_key
from .fills import fill_scalar
from .host import HostFunction, host_function
from .interface import EngineOptions
from .movement import Movement, read_movement
from .opt_level import OPTIMIZED_TARGET, ValueGuard, build_target
from .row_blocks import RowBlocks, row_blocks

__all__ = ["Strategy", "Way", "choose_strategies", "needs_stock_kernel"]


class Way(Enum):
    """The ways a folded call can be computed (see the module docstring)."""

    OPERAND = "operand"
    SHAPE = "shape"
    FILL = "fill"
    STOCK = "stock's kernel"
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
    #: a 0-d operand is computed by an earlier fold: :func:`needs_stock_kernel` before the call
    scalars_checked: bool = False
    #: ``FILL``: the bits of every element (a 0-d array of the result's dtype)
    scalar: Optional[np.ndarray] = None

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
    movements: Dict[int, Optional[Movement]] = {}  # by id of the KernelSpec: what its TIR does
    fills: Dict[int, np.ndarray] = {}  # node id -> its scalar, for the fills decided so far
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
        if id(kernel) not in movements:
            movements[id(kernel)] = read_movement(kernel.prim_func)
        movement = movements[id(kernel)]
        if options.fills:
            node = graph.nodes[site.node_id]
            scalar = fill_scalar(site, node, kernel, movement, fills)
            if scalar is not None:
                fills[site.node_id] = scalar
                strategies[site.node_id] = Strategy(Way.FILL, kernel, scalar=scalar)
                continue
        literal = [
            None if constant is None else _compat.constant_array(constant)
            for constant in site.leaf_constants
        ]
        if site.kind is SiteKind.OP and needs_stock_kernel(site, literal):
            strategies[site.node_id] = Strategy(Way.STOCK)
            continue
        host = host_function(site) if options.host_copies and site.kind is SiteKind.OP else None
        if host is not None:
            strategies[site.node_id] = Strategy(Way.HOST_COPY, kernel, host)
            continue
        if id(kernel) not in targets:
            members = _members(kernel, sites) if site.kind is SiteKind.OP else []
            targets[id(kernel)] = (
                build_target(members, moves_data=movement is not None)
                if options.quick_builds
                else (OPTIMIZED_TARGET, None)
            )
        target, guard = targets[id(kernel)]
        blocks = (
            row_blocks(site, graph.nodes[site.node_id], kernel.result_type, options.threads)
            if options.row_blocks
            else None
        )
        pending = site.kind is SiteKind.OP and any(
            value is None and _compat.static_shape(_compat.type_of(leaf)) == ()
            for value, leaf in zip(literal, site.leaves)
        )
        strategies[site.node_id] = Strategy(
            Way.KERNEL, kernel, None, target, guard, blocks, scalars_checked=pending
        )
    return strategies


def needs_stock_kernel(site: CallSite, leaves: Sequence[Any]) -> bool:
    """Whether a 0-d operand of ``site`` has a value stock's kernel is built around.

    ``leaves`` are the operands' tensors (None for one not known yet, which is not judged).
    """
    zero_d = [
        leaf.numpy() if leaf is not None and len(leaf.shape) == 0 else None for leaf in leaves
    ]
    if all(value is None for value in zero_d):
        return False
    dtypes = [_compat.dtype_of(_compat.type_of(leaf)) for leaf in site.leaves]
    return any(key is not None for key in scalar_value_key(site.call, zero_d, dtypes))


def _members(kernel: KernelSpec, sites: Sequence[CallSite]) -> List[CallSite]:
    return [sites[node_id] for node_id in kernel.members]
