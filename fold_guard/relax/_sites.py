"""The data the Relax adapter's translation hands the stages after it: a leaf module.

The seam of the adapter runs through here. Translation (``_translate``: the Relax module read
into call sites and graph nodes, and what ``LegalizeOps`` makes of them) produces these values;
evaluation (``_engine``) and the rewrite (``_rewrite``) consume them, and stock's rules
(``_stock``) say which :class:`SiteKind` a call is. This module imports nothing of fold_guard's but
the core's graph, so every side depends on it and none on another.

* :class:`CallSite`: where a call is and what it reads (its tensor leaves, their constants).
* :class:`PlanningFacts`: the facts only legalization knows, frozen; legalization makes
  them on every run, so no cache can change a plan.
* :class:`KernelSpec`: the legalized PrimFunc that computes a call, and how its buffers map to
  the call's leaves.
* :class:`Translation`: every call site of a module with its graph node, and the functions
  they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import FrozenSet, Mapping, Optional, Tuple

import tvm
from tvm import relax

from .._core.graph import FoldNode

__all__ = ["CallSite", "KernelSpec", "PlanningFacts", "SiteKind", "StaticShapeVar", "Translation"]


class SiteKind(Enum):
    """How a call binding is evaluated, as far as translation can tell."""

    OP = "op"  # an operator with FLegalize, evaluated through its legalized TIR kernel
    CALL_TIR = "call_tir"  # call_tir of a PrimFunc in the module
    TENSOR_TO_SHAPE = "tensor_to_shape"  # read the shape values straight from the constant
    ALLOW = "allow"
    BARRIER = "barrier"
    OTHER = "other"  # anything fold_guard cannot evaluate


@dataclass(frozen=True)
class StaticShapeVar:
    """A shape variable whose type gives all its values (``s: R.Shape([3, 4])``).

    It is static for folding, like a ShapeExpr, but stays a variable: legalizers see it as the
    stock pass shows it to them (``shape_to_tensor`` of it becomes a TIR kernel with no inputs).
    """

    var: relax.Var
    #: its values, read from its type
    values: Tuple[int, ...]


@dataclass(frozen=True, eq=False)
class CallSite:
    """The Relax call behind FoldNode ``node_id``: where it is and what it reads.

    ``leaves`` are the tensor arguments in node-input order; ``template_args`` are the call's
    arguments with every tensor leaf replaced by its index into ``leaves`` (an ``int``), inline
    tuples kept as Python tuples, and static arguments (shapes, prim values) as Relax expressions
    or :class:`StaticShapeVar`. ``leaf_constants[i]`` is the constant leaf ``i`` is bound to, if
    any; ``zero_size_leaves`` are leaves that are run-time tensors of a static zero-size shape
    (their one possible value stands in ``leaf_constants``).
    """

    node_id: int
    function: str
    call: relax.Call
    kind: SiteKind
    var: relax.Var
    in_dataflow: bool
    leaves: Tuple[relax.Expr, ...] = ()
    leaf_constants: Tuple[Optional[relax.Expr], ...] = ()
    template_args: Tuple[object, ...] = ()
    zero_size_leaves: Tuple[int, ...] = ()

    @property
    def op_name(self) -> str:
        """The operator's name (``relax.quantize``), or "" for a call of something else."""
        op = self.call.op
        return op.name if isinstance(op, tvm.ir.Op) else ""


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """How a call is computed by a TIR kernel: the PrimFunc and what each of its buffers is.

    ``arg_map[i]`` is an ``int`` (the index of a leaf of the call) or a ``tvm.runtime.Tensor``
    (a constant the legalizer put into the call). ``result_type`` is the result type the kernel
    was legalized for, symbolic where one kernel serves calls of several shapes (``None`` for a
    module's own ``call_tir``, whose result is the call's). ``members`` are the node ids of every
    call this kernel serves (one op-signature group, or one call).
    """

    prim_func: tvm.tirx.PrimFunc
    arg_map: Tuple[object, ...]
    result_type: object = None
    members: Tuple[int, ...] = ()


@dataclass(frozen=True)
class PlanningFacts:
    """What legalization tells the planner, per node id; made afresh by every run.

    ``unsupported``: calls with no kernel at all, and why. ``not_stock_foldable``: calls
    fold_guard could evaluate but the stock pass would not fold, and why. ``unread``: a call's
    leaves that are not literal constants and that its kernel does not read (``zeros_like(x)``
    reads only ``x``'s static shape): as in stock, which folds a legalized call whose arguments
    are all constants, they do not stop it folding. ``unwritten``: calls whose kernel may leave
    part of its output unwritten (``fold_guard._tvm.unwritten``), and why.
    """

    unsupported: Mapping[int, str] = field(default_factory=dict)
    not_stock_foldable: Mapping[int, str] = field(default_factory=dict)
    unread: Mapping[int, Tuple[int, ...]] = field(default_factory=dict)
    unwritten: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Translation:
    """The graph nodes (``sites[i]`` describes ``nodes[i]``) and the Relax functions they came from."""

    nodes: Tuple[FoldNode, ...]
    sites: Tuple[CallSite, ...]
    functions: Mapping[str, Tuple[tvm.ir.GlobalVar, relax.Function]]
    #: nodes whose variable is used other than as a tensor operand of a call the graph holds (a
    #: return value, a tuple, a match cast, a branch or closure that captures it): the rewrite
    #: may need their values whatever their consumers do
    escaping: FrozenSet[int] = frozenset()
