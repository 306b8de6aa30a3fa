"""Matching a described pattern (:mod:`~fold_guard._core.pattern_spec`) at a call of a FoldGraph.

The graph holds every call of a module, constant or not; which constant calls stay calls and which
become constants is a fold decision. A :class:`World` answers, for one node, whether it can
appear as a constant or as a call, and at what price (the fold decisions that would make it so):

* :class:`WhatIf`: any decision still open: a call computed from constants may become a
  constant (all of its constant cone folds) or stay a call (it is kept); used to derive what a
  table needs (``fold_guard._core.offload``);
* :class:`AsDecided`: the decisions of a plan (or of the module as it is): used to explain why a
  table did not take a call.

:func:`match_at` returns a :class:`Hit` (the decisions the match needs, the calls it takes) or
None, recording the furthest :class:`Miss`: which operand or call stopped it, and whether a
different fold decision would have got past that point (``fixable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .graph import SOURCE_KINDS, FoldGraph, FoldNode, InputKind, NodeInput
from .pattern_spec import (
    AllOf,
    AnyValue,
    ConstantValue,
    Constrained,
    ItemOf,
    OneOf,
    OpCall,
    PatternNode,
    StaticValue,
    TupleOf,
    Unread,
)
from .reasons import Action

__all__ = [
    "STRUCTURE",
    "Arg",
    "AsDecided",
    "Hit",
    "LeafArg",
    "Miss",
    "Refusal",
    "StaticArg",
    "TupleArg",
    "WhatIf",
    "World",
    "cone_of",
    "constant_sets",
    "describe_node",
    "match_at",
]

#: Miss kinds: the structure differs; an operand the pattern wants constant is not one (the
#: report's kind); a call on constants the pattern wants was folded away.
STRUCTURE = "structure"
NOT_CONSTANT = "operand-not-constant"
FOLDED_AWAY = "folded-away"


@dataclass(frozen=True)
class LeafArg:
    """A tensor argument: ``node.inputs[index]``."""

    index: int


@dataclass(frozen=True)
class StaticArg:
    """A non-tensor argument (a kernel's ``GlobalVar``, a shape), by its text."""

    text: str


@dataclass(frozen=True)
class TupleArg:
    """An inline tuple argument."""

    items: Tuple[Arg, ...]


Arg = Union[LeafArg, StaticArg, TupleArg]
Claims = Dict[int, Action]


def describe_node(node: FoldNode) -> str:
    """``lv3 = relax.dequantize``, ``lv3 = call_tir(decode)`` for a kernel call."""
    op = f"call_tir({node.callee})" if node.lowered else node.op
    return f"{node.label} = {op}"


@dataclass(frozen=True)
class Refusal:
    """Why a node cannot appear as asked: the miss kind, a phrase, and whether a different fold
    decision would change that."""

    kind: str
    text: str
    fixable: bool = False


class World:
    """How nodes can appear to a pattern; subclasses decide (see the module docstring)."""

    def __init__(self, graph: FoldGraph) -> None:
        self.graph = graph

    def as_constant(self, node: int) -> Union[Claims, Refusal]:  # pragma: no cover - abstract
        raise NotImplementedError

    def as_call(self, node: int) -> Union[Claims, Refusal]:  # pragma: no cover - abstract
        raise NotImplementedError


def constant_sets(graph: FoldGraph) -> Tuple[FrozenSet[int], FrozenSet[int]]:
    """The nodes that compute from constants only, and those known before run time (constants
    and weight parameters): what can fold, and what can be lifted or kept."""
    return (
        graph.reachable_from_constants(through_barriers=False),
        graph.reachable_from_constants(through_barriers=False, with_parameters=True),
    )


def cone_of(graph: FoldGraph, node: int) -> List[int]:
    """``node`` and every node it computes from (through node inputs)."""
    seen, todo = {node}, [node]
    while todo:
        for inp in graph.nodes[todo.pop()].inputs:
            if inp.kind in SOURCE_KINDS and inp.source not in seen:
                seen.add(inp.source)
                todo.append(inp.source)
    return sorted(seen)


class WhatIf(World):
    """Every decision open, except those ``claims`` already made and the calls ``taken`` by
    earlier matches (in a composite already, so not available to another pattern)."""

    def __init__(
        self,
        graph: FoldGraph,
        claims: Mapping[int, Tuple[Action, str]],
        taken: Mapping[int, str],
        facts: Optional[Tuple[FrozenSet[int], FrozenSet[int]]] = None,
    ) -> None:
        super().__init__(graph)
        self.claims = claims
        self.taken = taken
        self.constant, self.before_run_time = facts or constant_sets(graph)

    def as_constant(self, node: int) -> Union[Claims, Refusal]:
        n = self.graph.nodes[node]
        if node in self.taken:
            return Refusal(STRUCTURE, f"{describe_node(n)} is in a match of {self.taken[node]}")
        if node not in self.constant:
            if node in self.before_run_time:
                return Refusal(
                    NOT_CONSTANT,
                    f"{describe_node(n)} computes from weight parameters (lifting makes it a "
                    "parameter, not a constant)",
                )
            return Refusal(NOT_CONSTANT, f"{describe_node(n)} reads run-time data")
        cone = cone_of(self.graph, node)
        for member in cone:
            m = self.graph.nodes[member]
            if m.unfoldable is not None:
                return Refusal(
                    NOT_CONSTANT, f"{describe_node(m)} cannot fold ({m.unfoldable.text})"
                )
            claim = self.claims.get(member)
            if claim is not None and claim[0] is Action.KEEP:
                return Refusal(STRUCTURE, f"{describe_node(m)} is kept for {claim[1]}")
        return {member: Action.FOLD for member in cone}

    def as_call(self, node: int) -> Union[Claims, Refusal]:
        n = self.graph.nodes[node]
        if node in self.taken:
            return Refusal(STRUCTURE, f"{describe_node(n)} is in a match of {self.taken[node]}")
        claim = self.claims.get(node)
        if claim is not None and claim[0] is Action.FOLD:
            return Refusal(STRUCTURE, f"{describe_node(n)} folds for {claim[1]}")
        return {node: Action.KEEP} if node in self.before_run_time else {}


class AsDecided(World):
    """Fixed decisions: ``folded`` are the nodes that become constants; ``why`` says, per node
    that stays a call, why (a plan's reason and rule), and ``folded_by`` which rule folded a
    node. With ``folded`` empty, the module as it is: every call stays."""

    def __init__(
        self,
        graph: FoldGraph,
        folded: FrozenSet[int] = frozenset(),
        why: Optional[Mapping[int, str]] = None,
        folded_by: Optional[Mapping[int, str]] = None,
    ) -> None:
        super().__init__(graph)
        self.folded = folded
        self.why = why or {}
        self.folded_by = folded_by or {}
        self.constant = graph.reachable_from_constants(through_barriers=False)

    def as_constant(self, node: int) -> Union[Claims, Refusal]:
        if node in self.folded:
            return {}
        n = self.graph.nodes[node]
        fixable = node in self.constant and n.unfoldable is None
        why = self.why.get(node, "a call in this module")
        if not fixable:
            why = why if node in self.why else "reads run-time data"
        return Refusal(NOT_CONSTANT, f"{describe_node(n)}, {why}", fixable)

    def as_call(self, node: int) -> Union[Claims, Refusal]:
        if node not in self.folded:
            return {}
        n = self.graph.nodes[node]
        rule = self.folded_by.get(node, "")
        by = f" [{rule}]" if rule else ""
        return Refusal(FOLDED_AWAY, f"{describe_node(n)} was folded away{by}", True)


@dataclass(frozen=True)
class Miss:
    """Where matching a pattern at ``root`` stopped: the furthest failure of any alternative."""

    pattern: str
    root: int
    kind: str
    detail: str
    fixable: bool
    reached: FrozenSet[int]
    depth: int


@dataclass(frozen=True)
class Hit:
    """A match: the decisions it needs (node -> fold / keep) and the calls it takes."""

    claims: Mapping[int, Action]
    nodes: FrozenSet[int]


@dataclass(frozen=True)
class _State:
    claims: Mapping[int, Action] = field(default_factory=dict)
    nodes: FrozenSet[int] = frozenset()
    depth: int = 0

    def add(self, claims: Mapping[int, Action], node: Optional[int] = None) -> Optional[_State]:
        merged = dict(self.claims)
        for key, action in claims.items():
            if merged.setdefault(key, action) is not action:
                return None  # one match wanting a node folded and kept
        nodes = self.nodes | {node} if node is not None else self.nodes
        return _State(merged, nodes, self.depth + 1)


@dataclass(frozen=True)
class _Items:
    """An inline tuple argument, its fields resolved."""

    refs: Tuple[_Ref, ...]


# What a pattern node is matched against: a node's output, one input of a node, a static
# argument, an inline tuple.
_Ref = Union[int, NodeInput, StaticArg, _Items]


def _resolve(node: FoldNode, arg: Arg) -> _Ref:
    if isinstance(arg, LeafArg):
        return node.inputs[arg.index]
    if isinstance(arg, TupleArg):
        return _Items(tuple(_resolve(node, item) for item in arg.items))
    return arg


class _Matcher:
    def __init__(
        self, world: World, arguments: Mapping[int, Sequence[Arg]], pattern: str, root: int
    ) -> None:
        self.world = world
        self.graph = world.graph
        self.arguments = arguments
        self.pattern = pattern
        self.root = root
        self.miss: Optional[Miss] = None

    def fail(
        self, state: _State, kind: str, detail: str, fixable: bool = False
    ) -> Optional[_State]:
        """Record a miss (the furthest one is kept); returns None, the failed match."""
        if self.miss is None or state.depth > self.miss.depth:
            self.miss = Miss(
                self.pattern, self.root, kind, detail, fixable, state.nodes, state.depth
            )
        return None

    def match(self, p: PatternNode, ref: _Ref, state: _State, where: str) -> Optional[_State]:
        if isinstance(p, (AnyValue, Unread)):
            return state
        if isinstance(p, OneOf):
            for option in p.options:
                found = self.match(option, ref, state, where)
                if found is not None:
                    return found
            return None
        if isinstance(p, AllOf):
            current: Optional[_State] = state
            for part in p.parts:
                current = self.match(part, ref, current, where) if current else None
            return current
        if isinstance(p, Constrained):
            inner = self.match(p.inner, ref, state, where)
            return inner if inner is None else self.constrain(p, ref, inner, where)
        if isinstance(ref, NodeInput) and ref.kind is InputKind.NODE:
            ref = ref.source
        if isinstance(p, ConstantValue):
            return self.constant(ref, state, where)
        if isinstance(p, StaticValue):
            if isinstance(ref, StaticArg) and (p.name is None or p.name == ref.text):
                return state
            return self.fail(state, STRUCTURE, f"{where} is not the static argument {p.name}")
        if isinstance(p, TupleOf):
            return self.tuple(p, ref, state, where)
        if isinstance(p, ItemOf):
            if isinstance(ref, NodeInput) and ref.kind is InputKind.TUPLE_ITEM:
                return self.match(p.source, ref.source, state, where)
            return self.fail(state, STRUCTURE, f"{where} is not an item of a tuple")
        assert isinstance(p, OpCall)
        return self.call(p, ref, state, where)

    def constant(self, ref: _Ref, state: _State, where: str) -> Optional[_State]:
        if isinstance(ref, int):
            answer = self.world.as_constant(ref)
            if isinstance(answer, Refusal):
                return self.fail(state, answer.kind, f"{where} is {answer.text}", answer.fixable)
            return state.add(answer)
        if isinstance(ref, NodeInput):
            if ref.kind is InputKind.CONSTANT:
                return state.add({})
            what = "a weight parameter" if ref.kind is InputKind.PARAMETER else "run-time data"
            return self.fail(state, NOT_CONSTANT, f"{where} is {what} ({ref.label})")
        return self.fail(state, STRUCTURE, f"{where} is not a tensor")

    def call(self, p: OpCall, ref: _Ref, state: _State, where: str) -> Optional[_State]:
        wanted = "|".join(p.ops) or "a call"
        if not isinstance(ref, int):
            if isinstance(ref, NodeInput) and ref.kind is InputKind.CONSTANT:
                detail = f"{where} is already a constant, not {wanted} of one"
                return self.fail(state, FOLDED_AWAY, detail)
            return self.fail(state, STRUCTURE, f"{where} is not a call of {wanted}")
        node = self.graph.nodes[ref]
        if p.ops and node.op not in p.ops:
            detail = f"{where} is {describe_node(node)}, not {wanted}"
            return self.fail(state, STRUCTURE, detail)
        answer = self.world.as_call(ref)
        if isinstance(answer, Refusal):
            return self.fail(state, answer.kind, f"{where}: {answer.text}", answer.fixable)
        current = state.add(answer, ref)
        if current is None or p.args is None:
            return current
        args = self.arguments.get(ref) or tuple(LeafArg(i) for i in range(len(node.inputs)))
        if len(args) < len(p.args) or (len(args) > len(p.args) and not p.variadic):
            detail = f"{describe_node(node)} has {len(args)} operands, the pattern {len(p.args)}"
            return self.fail(current, STRUCTURE, detail)
        for index, (sub, arg) in enumerate(zip(p.args, args)):
            target = _resolve(node, arg)
            label = f"operand {index} of {describe_node(node)}"
            found = self.match(sub, target, current, label)
            if found is None:
                return None
            current = found
        return current

    def tuple(self, p: TupleOf, ref: _Ref, state: _State, where: str) -> Optional[_State]:
        if not isinstance(ref, _Items):
            return self.fail(state, STRUCTURE, f"{where} is not an inline tuple")
        if p.fields is None:
            return state
        if len(p.fields) != len(ref.refs):
            return self.fail(state, STRUCTURE, f"{where} has {len(ref.refs)} fields")
        current: Optional[_State] = state
        for index, (sub, item) in enumerate(zip(p.fields, ref.refs)):
            current = self.match(sub, item, current, f"{where}, field {index}") if current else None
        return current

    def constrain(self, p: Constrained, ref: _Ref, state: _State, where: str) -> Optional[_State]:
        node = self.graph.nodes[ref] if isinstance(ref, int) else None
        tensor = (
            ref.tensor
            if isinstance(ref, NodeInput)
            else (node.outputs[0] if node is not None and len(node.outputs) == 1 else None)
        )
        if p.dtype is not None and (tensor is None or tensor.dtype != p.dtype):
            got = "unknown" if tensor is None else tensor.dtype
            return self.fail(state, STRUCTURE, f"{where} has dtype {got}, the pattern {p.dtype}")
        if p.shape is not None and (tensor is None or tensor.shape != p.shape):
            return self.fail(state, STRUCTURE, f"{where} has another shape than {list(p.shape)}")
        for key, value in p.attrs:
            actual = node.attrs.get(key) if node is not None else None
            if _plain(actual) != _plain(value):
                detail = f"{where} has {key}={_plain(actual)}, the pattern {key}={_plain(value)}"
                return self.fail(state, STRUCTURE, detail)
        return state


def _plain(value: object) -> object:
    """Attribute values compared as text: TVM arrays, tuples and lists alike."""
    if isinstance(value, (str, bytes)):
        return str(value)
    if isinstance(value, Iterable):
        return tuple(_plain(item) for item in value)
    return str(value)


def match_at(
    pattern: str,
    root: PatternNode,
    node: int,
    world: World,
    arguments: Mapping[int, Sequence[Arg]],
) -> Tuple[Optional[Hit], Optional[Miss]]:
    """Match ``root`` (pattern ``pattern``'s tree) at graph node ``node`` under ``world``.

    ``arguments`` gives a node's arguments where they are not simply one tensor per input (a
    kernel's ``GlobalVar`` and tuple, a shape). Returns the hit, or None and the furthest miss.
    """
    matcher = _Matcher(world, arguments, pattern, node)
    found = matcher.match(root, node, _State(), f"{describe_node(world.graph.nodes[node])}")
    if found is None:
        return None, matcher.miss
    return Hit(dict(found.claims), found.nodes), None
