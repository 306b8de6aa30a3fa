"""The IR-neutral view of a module that the planner decides on.

A :class:`FoldGraph` lists the calls of one or more functions in topological order. Each
:class:`FoldNode` says what a policy may look at (op name, attributes, input and output dtypes,
shapes and byte sizes), where each input comes from (a literal constant, another node, or
something only known at run time), whether the node is a ``fold_barrier`` / ``fold_allow``
annotation, whether the adapter could evaluate it at all, and what the IR's own default
(the stock ``FoldConstant``) would do with it.

Invariant: every ``NodeInput`` of kind ``NODE`` refers to a node earlier in ``FoldGraph.nodes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import (
    AbstractSet,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

from .errors import PlanInvariantError
from .reasons import Reason

__all__ = [
    "SOURCE_KINDS",
    "Annotation",
    "FoldGraph",
    "FoldNode",
    "InputKind",
    "ModuleT",
    "NodeInput",
    "TensorInfo",
    "dtype_nbytes",
    "reachable_from_constants",
    "reads_barrier",
]

#: The adapter's module type (``tvm.IRModule``) in the results the core defines for adapters.
ModuleT = TypeVar("ModuleT")

_DTYPE_BITS = {
    "bool": 8,
    "int4": 4,
    "uint4": 4,
    "int8": 8,
    "uint8": 8,
    "int16": 16,
    "uint16": 16,
    "int32": 32,
    "uint32": 32,
    "int64": 64,
    "uint64": 64,
    "float16": 16,
    "bfloat16": 16,
    "float32": 32,
    "float64": 64,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
}


def dtype_nbytes(dtype: str, shape: Optional[Sequence[Optional[int]]]) -> Optional[int]:
    """Bytes a dense tensor of ``dtype`` and ``shape`` occupies, or None when unknown.

    >>> dtype_nbytes("int8", (4, 4))
    16
    >>> dtype_nbytes("float32", (2, None)) is None
    True
    """
    if shape is None:
        return None
    dims = [dim for dim in shape if dim is not None]
    bits = _DTYPE_BITS.get(dtype)
    if bits is None or len(dims) != len(shape):
        return None
    return (math.prod(dims) * bits + 7) // 8


class Annotation(Enum):
    """Which fold_guard annotation a node is, if any."""

    NONE = "none"
    BARRIER = "fold_barrier"
    ALLOW = "fold_allow"


class InputKind(Enum):
    """Where a node's input comes from."""

    CONSTANT = "constant"  # a literal constant, or a static value such as a shape
    NODE = "node"  # the output of another node in the graph
    RUNTIME = "runtime"  # a run-time input, or anything the adapter cannot see as constant
    #: a weight passed as a function parameter (Relax: at or after the function's ``num_input``):
    #: known before run time, but not to this pass; ``LiftTransformParams`` computes what depends
    #: only on such parameters and constants ahead of run time
    PARAMETER = "parameter"
    #: one item of another node's tuple result, read through a tuple-item binding (Relax
    #: ``q = encoded[0]``; ``node`` names the call): never constant to folding, since the stock
    #: pass folds no tuple item, but known before run time when that call is lifted
    #: (``LiftTransformParams`` lifts tuple items with the call that makes them)
    TUPLE_ITEM = "tuple_item"


#: The input kinds that read another node's result (``NodeInput.source``): whole, or one item
#: of its tuple.
SOURCE_KINDS = frozenset({InputKind.NODE, InputKind.TUPLE_ITEM})


@dataclass(frozen=True)
class TensorInfo:
    """dtype, static shape (None per unknown dim, or None if not a tensor) and byte size."""

    dtype: str
    shape: Optional[Tuple[Optional[int], ...]]
    nbytes: Optional[int] = None

    @staticmethod
    def of(dtype: str, shape: Optional[Sequence[Optional[int]]]) -> TensorInfo:
        """Build a TensorInfo, computing ``nbytes`` from dtype and shape."""
        shape_t = None if shape is None else tuple(shape)
        return TensorInfo(dtype, shape_t, dtype_nbytes(dtype, shape_t))

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(dim is not None for dim in self.shape)


@dataclass(frozen=True)
class NodeInput:
    """One input of a node. ``label`` names it in messages (a variable name or a short expression).

    ``reads_value`` is False where the call's kernel reads only this input's static type (its
    shape and dtype), not its value: Relax ``zeros_like(x)`` legalizes to a kernel with no
    argument for ``x``. Such an input does not stop the call folding, whatever its kind (the
    stock Relax pass legalizes first and folds a kernel whose arguments are all constants),
    except the output of a barrier, across which nothing folds. It is still a use of its source
    (:meth:`FoldGraph.consumers`).
    """

    kind: InputKind
    label: str
    tensor: Optional[TensorInfo] = None
    node: Optional[int] = None
    reads_value: bool = True

    @property
    def source(self) -> int:
        """The id of the node this input reads (inputs of kind ``NODE`` only)."""
        if self.node is None:
            raise PlanInvariantError(
                f"input {self.label} of kind {self.kind.value} has no source node"
            )
        return self.node


@dataclass(frozen=True)
class FoldNode:
    """One call the planner decides on.

    ``unfoldable`` is set by the adapter when it could never evaluate this call, whatever its
    inputs (``Reason.IMPURE``, ``Reason.UNSUPPORTED``, ``Reason.DYNAMIC_SHAPE``), or never to a
    defined value (``Reason.UNWRITTEN_MEMORY``: its kernel's result would depend on memory
    nobody wrote), with ``unfoldable_detail`` saying why. ``default_fold`` says whether the IR's stock pass folds this
    call when all its inputs are constant; ``default_rule`` names the stock rule that keeps it
    otherwise (for example ``"relax: ops fold only inside dataflow blocks"``). ``lift_rule`` is
    the same for the parameter path: empty when the IR's stock parameter lifting
    (``LiftTransformParams``) lifts this call once its inputs are known before run time, else the
    stock rule that keeps it at run time (outside a dataflow block, ``stop_lift_params``). ``lowered`` marks a
    call that is already a compiled-kernel call (Relax ``call_tir``, as after ``LegalizeOps``):
    its ``op`` no longer says what it computes, ``callee`` does: the kernel's name (a PrimFunc's
    ``global_symbol``, else its ``GlobalVar`` name; an extern's name for a packed call), with
    ``op_pattern`` where ``AnnotateTIROpPattern`` set one (TVM's ``OpPatternKind``: 0
    elementwise, 1 broadcast, 2 injective, 3 comm-reduce, 4 out-elementwise-fusable, 7 opaque).
    ``type_source`` names the node whose static
    *type* alone gives this node's value (Relay ``shape_of`` of a statically shaped operand): the
    node reads no input value, so it has no input for it, but it still counts as consuming that
    node's output where it matters, i.e. it is kept when that node is a barrier.
    """

    id: int
    op: str
    label: str
    function: str
    inputs: Tuple[NodeInput, ...]
    outputs: Tuple[TensorInfo, ...]
    attrs: Mapping[str, object] = field(default_factory=dict)
    annotation: Annotation = Annotation.NONE
    unfoldable: Optional[Reason] = None
    unfoldable_detail: str = ""
    default_fold: bool = True
    default_rule: str = ""
    lift_rule: str = ""
    lowered: bool = False
    type_source: Optional[int] = None
    callee: str = ""
    op_pattern: Optional[int] = None

    @property
    def where(self) -> str:
        """``function/label``, for messages."""
        return f"{self.function}/{self.label}" if self.function else self.label


@dataclass(frozen=True)
class FoldGraph:
    """The calls of a module, in topological order (every input node comes before its user)."""

    nodes: Tuple[FoldNode, ...]
    #: :meth:`consumers`, once asked (the graph is immutable; the driver, the rewrite and
    #: policies ask for it each round)
    _consumers: Optional[Dict[int, Tuple[int, ...]]] = field(
        default=None, init=False, repr=False, compare=False
    )
    _value_consumers: Optional[Dict[int, Tuple[int, ...]]] = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            if node.id != index:
                raise PlanInvariantError(
                    f"FoldGraph node {node.where} has id {node.id}, expected {index}: "
                    "node ids must be their position in topological order"
                )
            for inp in node.inputs:
                if inp.kind is InputKind.NODE and (inp.node is None or not 0 <= inp.node < index):
                    raise PlanInvariantError(
                        f"FoldGraph node {node.where} reads node {inp.node}, which does not "
                        "come before it: the graph is not topologically ordered"
                    )
            if node.type_source is not None and not 0 <= node.type_source < index:
                raise PlanInvariantError(
                    f"FoldGraph node {node.where} reads the type of node {node.type_source}, which "
                    "does not come before it: the graph is not topologically ordered"
                )

    def consumers(self) -> Mapping[int, Tuple[int, ...]]:
        """Map each node id to the ids of the nodes that read it: its value (whole, or an item
        of its tuple) or its static type.

        A node that reads only the type (``type_source``, e.g. Relay's ``shape_of``) is still a
        use of it, for the policies that ask where a value goes (``weights-only``).
        """
        if self._consumers is not None:
            return MappingProxyType(self._consumers)
        users: Dict[int, List[int]] = {node.id: [] for node in self.nodes}
        for node in self.nodes:
            for inp in node.inputs:
                if inp.kind in SOURCE_KINDS:
                    users[inp.source].append(node.id)
            if node.type_source is not None and node.id not in users[node.type_source]:
                users[node.type_source].append(node.id)
        consumers = {key: tuple(value) for key, value in users.items()}
        object.__setattr__(self, "_consumers", consumers)  # frozen; eq and hash ignore it
        return MappingProxyType(consumers)

    def value_consumers(self) -> Mapping[int, Tuple[int, ...]]:
        """Like :meth:`consumers`, less the nodes that read only a static type.

        For the questions about where a *value* goes: whether every reader folds with it, or
        quantizes it; ``zeros_like(x)`` does not need ``x``'s value at run time.
        """
        if self._value_consumers is not None:
            return MappingProxyType(self._value_consumers)
        users: Dict[int, List[int]] = {node.id: [] for node in self.nodes}
        for node in self.nodes:
            for inp in node.inputs:
                if (
                    inp.kind in SOURCE_KINDS
                    and inp.reads_value
                    and node.id not in users[inp.source]
                ):
                    users[inp.source].append(node.id)
        consumers = {key: tuple(value) for key, value in users.items()}
        object.__setattr__(self, "_value_consumers", consumers)  # frozen, as _consumers
        return MappingProxyType(consumers)

    def reachable_from_constants(
        self, *, through_barriers: bool, with_parameters: bool = False
    ) -> FrozenSet[int]:
        """The nodes that compute from constants only: see :func:`reachable_from_constants`.

        ``through_barriers=False`` is the planner's view (a barrier's output is never constant);
        ``True`` looks through barriers, for questions about where constant data flows (a
        barrier over a weight still carries a weight). ``with_parameters`` counts weights passed
        as parameters (``InputKind.PARAMETER``) as constant data too.
        """
        nodes = [(node.inputs, node.annotation) for node in self.nodes]
        return reachable_from_constants(
            nodes, through_barriers=through_barriers, with_parameters=with_parameters
        )


def reachable_from_constants(
    nodes: Sequence[Tuple[Sequence[NodeInput], Annotation]],
    *,
    through_barriers: bool,
    opaque: AbstractSet[int] = frozenset(),
    with_parameters: bool = False,
) -> FrozenSet[int]:
    """Ids of the nodes whose every input is a literal constant or the output of such a node.

    ``nodes[i]`` are the inputs and the annotation of node ``i`` (topologically ordered, as in a
    FoldGraph), so that an adapter can ask before it has built its FoldNodes. Unless
    ``through_barriers``, a barrier's output is never constant (the planner's rule); neither is
    the output of a node in ``opaque`` (an adapter's: a call it can never evaluate). A node whose
    output is not constant is still in the result when its inputs are. This is the one definition
    of "computes from constants"; whether a node *folds* is the planner's (a node can compute from
    constants and still be kept). ``with_parameters`` counts a weight passed as a parameter
    (``InputKind.PARAMETER``) as a constant, and a tuple item (``InputKind.TUPLE_ITEM``) of a
    node found: "computes from weights", known before run time.

    >>> t = TensorInfo.of("float32", (2,))
    >>> c, x = NodeInput(InputKind.CONSTANT, "c", t), NodeInput(InputKind.RUNTIME, "x", t)
    >>> a = NodeInput(InputKind.NODE, "a", t, 0)
    >>> chain = [((c,), Annotation.NONE), ((a,), Annotation.NONE), ((x,), Annotation.NONE)]
    >>> sorted(reachable_from_constants(chain, through_barriers=False))
    [0, 1]
    >>> sorted(reachable_from_constants([((c,), Annotation.BARRIER), ((a,), Annotation.NONE)], through_barriers=False))
    [0]
    >>> shape_of_x = NodeInput(InputKind.RUNTIME, "x", t, reads_value=False)  # zeros_like(x)
    >>> sorted(reachable_from_constants([((shape_of_x,), Annotation.NONE)], through_barriers=False))
    [0]
    """
    barriers: FrozenSet[int] = frozenset()
    if not through_barriers:
        barriers = frozenset(
            node_id
            for node_id, (_, annotation) in enumerate(nodes)
            if annotation is Annotation.BARRIER
        )
    blocked = set(opaque) | barriers
    leaf_kinds = (
        (InputKind.CONSTANT, InputKind.PARAMETER) if with_parameters else (InputKind.CONSTANT,)
    )
    source_kinds = SOURCE_KINDS if with_parameters else frozenset({InputKind.NODE})
    found: Set[int] = set()
    for node_id, (node_inputs, _) in enumerate(nodes):
        if all(
            inp.kind in leaf_kinds
            or (inp.kind in source_kinds and inp.source in found and inp.source not in blocked)
            or (not inp.reads_value and not reads_barrier(inp, barriers))
            for inp in node_inputs
        ):
            found.add(node_id)
    return frozenset(found)


def reads_barrier(inp: NodeInput, barriers: AbstractSet[int]) -> bool:
    """Whether ``inp`` is the output of one of ``barriers`` (never constant, not even its type)."""
    return inp.kind in SOURCE_KINDS and inp.node in barriers
