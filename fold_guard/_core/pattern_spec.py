"""A backend's pattern table as plain data: what each pattern matches, as an adapter read it.

A BYOC backend ships its pattern table as TVM dataflow patterns (``tvm.relax.dpl``,
``tvm.relay.dataflow_pattern``): trees of calls, wildcards, constants, alternatives and
constraints, tried in table order (the first pattern that matches a call takes it). The adapters
walk those trees into the values below, so that the core can reason about what a table needs
without TVM: which operands a pattern wants as constants, which calls on constants it wants
intact, and which op a pattern is built around (its *anchor*, the op a report's row is about).

The description is exact where it matters to folding (calls, operands, constants, alternatives)
and approximate elsewhere: a construct an adapter does not translate is :class:`Unread` and
matches anything, and repeated sub-patterns (which TVM binds to one expression) are independent
here. Deciding from an approximate description is safe because every decision is confirmed by
running the real table (``fold_guard._core.offload``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

from .op_names import OP_TABLES

__all__ = [
    "AllOf",
    "AnyValue",
    "ConstantValue",
    "Constrained",
    "ItemOf",
    "OneOf",
    "OpCall",
    "PatternNode",
    "PatternSpec",
    "StaticValue",
    "TableSpec",
    "TupleOf",
    "Unread",
    "anchor_ops",
    "default_table_name",
    "root_ops",
]


@dataclass(frozen=True)
class AnyValue:
    """``wildcard()``: any value."""


@dataclass(frozen=True)
class ConstantValue:
    """``is_const()`` / ``is_constant()``: a constant tensor in the module."""


@dataclass(frozen=True)
class StaticValue:
    """A non-tensor argument: a ``call_tir``'s ``GlobalVar`` (``name``: its name, None for any)."""

    name: Optional[str] = None


@dataclass(frozen=True)
class OpCall:
    """A call of one of ``ops`` (empty: of anything) with ``args`` (None: any arguments).

    ``variadic``: arguments beyond those listed are allowed (Relax ``varg_default_wildcard``).
    """

    ops: Tuple[str, ...]
    args: Optional[Tuple[PatternNode, ...]] = None
    variadic: bool = False


@dataclass(frozen=True)
class OneOf:
    """Alternatives, tried in order (``a | b``, ``pattern.optional(...)``)."""

    options: Tuple[PatternNode, ...]


@dataclass(frozen=True)
class AllOf:
    """Every part must match the same value (``a & b``)."""

    parts: Tuple[PatternNode, ...]


@dataclass(frozen=True)
class Constrained:
    """``inner`` with a dtype, a static shape or attribute values (``has_dtype``, ``has_attr``)."""

    inner: PatternNode
    dtype: Optional[str] = None
    shape: Optional[Tuple[Optional[int], ...]] = None
    attrs: Tuple[Tuple[str, object], ...] = ()


@dataclass(frozen=True)
class TupleOf:
    """An inline tuple of ``fields`` (None: any tuple)."""

    fields: Optional[Tuple[PatternNode, ...]] = None


@dataclass(frozen=True)
class ItemOf:
    """Item ``index`` (None: any) of the tuple ``source`` matches."""

    source: PatternNode
    index: Optional[int] = None


@dataclass(frozen=True)
class Unread:
    """A construct the adapter does not translate (``what`` names it): it matches anything."""

    what: str


PatternNode = Union[
    AnyValue, ConstantValue, StaticValue, OpCall, OneOf, AllOf, Constrained, TupleOf, ItemOf, Unread
]

#: Ops that wrap an activation's values in a quantized pattern (its Q/DQ and dtype casts): the
#: search for a pattern's anchor stops before them.
_WRAPPER_OPS: FrozenSet[str] = frozenset(
    name for table in OP_TABLES for name in table.quantize | table.dequantize | table.cast
)


def root_ops(node: PatternNode) -> FrozenSet[str]:
    """The ops a call must have for ``node`` to match it ("" stands for any op)."""
    if isinstance(node, OpCall):
        return frozenset(node.ops) if node.ops else frozenset({""})
    if isinstance(node, OneOf):
        return frozenset(op for option in node.options for op in root_ops(option))
    if isinstance(node, AllOf):
        calls = [root_ops(part) for part in node.parts if root_ops(part)]
        return calls[0] if calls else frozenset()
    if isinstance(node, Constrained):
        return root_ops(node.inner)
    return frozenset()


def _required_calls(node: PatternNode) -> Tuple[OpCall, ...]:
    """The calls ``node`` requires (every alternative a call), else () (it may match a non-call)."""
    if isinstance(node, OpCall):
        return (node,)
    if isinstance(node, Constrained):
        return _required_calls(node.inner)
    if isinstance(node, AllOf):
        for part in node.parts:
            found = _required_calls(part)
            if found:
                return found
        return ()
    if isinstance(node, OneOf):
        each = [_required_calls(option) for option in node.options]
        return tuple(call for calls in each for call in calls) if all(each) else ()
    return ()


def _is_wrapper(call: OpCall) -> bool:
    return bool(call.ops) and all(op in _WRAPPER_OPS for op in call.ops)


def _deepest(call: OpCall) -> FrozenSet[str]:
    """The ops of the deepest calls down the first-operand chain below and at ``call`` that are
    not an activation's quantize / dequantize / cast; empty when there are only those."""
    first = _required_calls(call.args[0]) if call.args else ()
    below = frozenset(op for inner in first for op in _deepest(inner))
    if below:
        return below
    return frozenset() if _is_wrapper(call) else frozenset(call.ops)


def anchor_ops(node: PatternNode) -> FrozenSet[str]:
    """The ops a pattern is built around: from its root down through first operands that it
    requires to be calls, the deepest that is not an activation's quantize / dequantize / cast
    (the root's own ops when the chain has nothing else).

    ``requantize(bias_add(qnn.conv2d(x, W, ...)))`` is about ``qnn.conv2d``; ``relu(add(matmul(x,
    W), b))`` about ``matmul``; ``quantize(softmax(dequantize(x)))`` about ``softmax``;
    ``cast(qnn.conv2d(...))`` about ``qnn.conv2d``; a pattern of one op about that op.

    >>> conv = OpCall(("qnn.conv2d",), (AnyValue(), ConstantValue()))
    >>> bias = OpCall(("nn.bias_add",), (conv, ConstantValue()))
    >>> sorted(anchor_ops(OpCall(("qnn.requantize",), (OneOf((conv, bias)),))))
    ['qnn.conv2d']
    >>> sorted(anchor_ops(OpCall(("qnn.dequantize",), (AnyValue(),))))
    ['qnn.dequantize']
    """
    found: Set[str] = set()
    for call in _required_calls(node):
        found |= _deepest(call) or set(call.ops)
    return frozenset(found)


def _children(node: PatternNode) -> Iterator[PatternNode]:
    if isinstance(node, OpCall):
        yield from node.args or ()
    elif isinstance(node, OneOf):
        yield from node.options
    elif isinstance(node, AllOf):
        yield from node.parts
    elif isinstance(node, Constrained):
        yield node.inner
    elif isinstance(node, TupleOf):
        yield from node.fields or ()
    elif isinstance(node, ItemOf):
        yield node.source


def text_of(node: PatternNode, depth: int = 0) -> str:
    """A short rendering, ``qnn.requantize(qnn.conv2d(*, const, ...) | ..., const, ...)``.

    >>> text_of(OpCall(("relax.matmul",), (AnyValue(), OpCall(("relax.dequantize",), (ConstantValue(),) * 3))))
    'relax.matmul(*, relax.dequantize(const, const, const))'
    """
    if depth > 6:
        return "..."
    if isinstance(node, AnyValue):
        return "*"
    if isinstance(node, ConstantValue):
        return "const"
    if isinstance(node, StaticValue):
        return node.name or "static"
    if isinstance(node, OpCall):
        head = "|".join(node.ops) or "call"
        if node.args is None:
            return f"{head}(...)"
        args = [text_of(arg, depth + 1) for arg in node.args] + (["..."] if node.variadic else [])
        return f"{head}({', '.join(args)})"
    if isinstance(node, OneOf):
        return " | ".join(text_of(option, depth + 1) for option in node.options)
    if isinstance(node, AllOf):
        return " & ".join(text_of(part, depth + 1) for part in node.parts)
    if isinstance(node, Constrained):
        return text_of(node.inner, depth)
    if isinstance(node, TupleOf):
        fields = node.fields
        return (
            "(...)" if fields is None else f"({', '.join(text_of(f, depth + 1) for f in fields)})"
        )
    if isinstance(node, ItemOf):
        return f"{text_of(node.source, depth + 1)}[{'?' if node.index is None else node.index}]"
    return f"<{node.what}>"


def _may_claim(node: PatternNode, below_root: bool) -> bool:
    """Whether matching ``node`` can ask a fold decision of a call: a constant operand, or a
    call below the root (which may be a call on constants the pattern wants kept)."""
    if isinstance(node, ConstantValue) or (below_root and isinstance(node, OpCall)):
        return True
    nested = below_root or isinstance(node, OpCall)
    return any(_may_claim(child, nested) for child in _children(node))


@dataclass(frozen=True)
class PatternSpec:
    """One entry of a table: its name (the composite's), what it matches, its check's name."""

    name: str
    root: PatternNode
    check: str = ""

    @property
    def root_ops(self) -> FrozenSet[str]:
        return root_ops(self.root)

    @property
    def anchors(self) -> FrozenSet[str]:
        return anchor_ops(self.root)

    @property
    def ops(self) -> FrozenSet[str]:
        """Every op the pattern names: the calls it can take."""
        found: Set[str] = set()
        todo: List[PatternNode] = [self.root]
        while todo:
            node = todo.pop()
            if isinstance(node, OpCall):
                found.update(node.ops)
            todo.extend(_children(node))
        return frozenset(found)

    @property
    def may_claim(self) -> bool:
        """Whether a fold decision can matter to this pattern (else it matches regardless)."""
        return _may_claim(self.root, False)

    def text(self) -> str:
        return text_of(self.root)


@dataclass(frozen=True)
class TableSpec:
    """A backend's table in priority order (the first pattern that matches a call takes it)."""

    name: str
    patterns: Tuple[PatternSpec, ...]

    @property
    def anchors(self) -> FrozenSet[str]:
        """Every op some pattern is built around: the calls a report has a row for."""
        return frozenset(op for pattern in self.patterns for op in pattern.anchors)

    def pattern(self, name: str) -> Optional[PatternSpec]:
        return next((p for p in self.patterns if p.name == name), None)


def default_table_name(pattern_names: Sequence[str]) -> str:
    """The name of a table its caller did not name: the part before the first dot that all its
    patterns' names share (``"cmsis-nn.qnn_conv2d"`` -> ``"cmsis-nn"``), else ``"table"``.

    >>> default_table_name(["npu.qconv2d", "npu.qmatmul"]), default_table_name(["a.x", "b.y"])
    ('npu', 'table')
    """
    heads = {name.split(".")[0] for name in pattern_names}
    return heads.pop() if len(heads) == 1 else "table"
