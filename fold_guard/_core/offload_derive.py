"""What a backend's table asks of a module: its matches and the fold decisions they need.

For each pattern of the table in priority order, and each call its root could match (a call that
reads run-time data: a match computed from constants only is not a layer, and folding it is never
worse), the pattern is matched against the graph with every fold decision still open
(:class:`~fold_guard._core.pattern_match.WhatIf`). A match asks a price: every call it wants as a
constant operand (``is_const()`` / ``is_constant()``: the call and every call it computes from)
*folds*, every call on constants it matches as an operation (a weight's ``dequantize``, a
``decode`` kernel, a ``qnn.*`` op) is *kept*. A match is accepted when its price agrees with
what earlier, higher-priority matches asked, and the calls it takes are taken by no earlier
match, as ``FuseOpsByPattern`` / ``MergeComposite`` give earlier patterns priority. Two patterns
that want opposite decisions for one call: the earlier match wins, the later one is not accepted
(its alternatives are tried first). A match that would keep a call that something outside it
reads too (a weight two layers share) is not made: its composite would have to leak the value;
the weight folds, and a pattern wanting it constant can match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .graph import FoldGraph
from .pattern_match import Arg, Miss, WhatIf, constant_sets, match_at
from .pattern_spec import TableSpec
from .reasons import Action

__all__ = ["Candidate", "Derivation", "NodeKey", "derive", "node_keys", "runtime_calls"]

#: ``(function, label, occurrence)``: a call, the same in every walk of one module.
NodeKey = Tuple[str, str, int]


def node_keys(graph: FoldGraph) -> Tuple[NodeKey, ...]:
    """Each node's key: its function, its label, and how many nodes of that label came before."""
    seen: Dict[Tuple[str, str], int] = {}
    keys: List[NodeKey] = []
    for node in graph.nodes:
        where = (node.function, node.label)
        keys.append((node.function, node.label, seen.get(where, 0)))
        seen[where] = seen.get(where, 0) + 1
    return tuple(keys)


def runtime_calls(graph: FoldGraph) -> FrozenSet[int]:
    """The calls that read run-time data (through barriers, weight parameters known)."""
    known = graph.reachable_from_constants(through_barriers=True, with_parameters=True)
    return frozenset(node.id for node in graph.nodes) - known


@dataclass(frozen=True)
class Candidate:
    """An accepted match: pattern, root call, the decisions it needs, the calls it takes."""

    pattern: str
    root: int
    claims: Mapping[int, Action]
    nodes: FrozenSet[int]

    @property
    def keeps(self) -> Tuple[int, ...]:
        return tuple(sorted(n for n, a in self.claims.items() if a is Action.KEEP))


@dataclass(frozen=True)
class Derivation:
    """What a table asks of one graph: accepted matches, the decisions (node -> action and the
    pattern asking), the calls each match takes, and the misses of the matches not accepted."""

    candidates: Tuple[Candidate, ...]
    claims: Mapping[int, Tuple[Action, str]]
    taken: Mapping[int, str]
    misses: Tuple[Miss, ...]


def derive(
    table: TableSpec,
    graph: FoldGraph,
    arguments: Mapping[int, Sequence[Arg]],
    excluded: Mapping[Tuple[str, NodeKey], str] = {},
    *,
    keys: Optional[Tuple[NodeKey, ...]] = None,
) -> Derivation:
    """Match ``table`` on ``graph`` with every decision open (the module docstring).

    ``excluded`` are the ``(pattern, root key)`` matches a trial refused; they are not accepted.

    >>> from fold_guard._core.graph import FoldNode, InputKind, NodeInput, TensorInfo
    >>> from fold_guard._core.pattern_spec import AnyValue, ConstantValue, OpCall, PatternSpec
    >>> t = TensorInfo.of("int8", (4, 4))
    >>> q = FoldNode(0, "qnn.quantize", "w", "main", (NodeInput(InputKind.CONSTANT, "c", t),), (t,))
    >>> x = NodeInput(InputKind.RUNTIME, "x", t)
    >>> dense = FoldNode(1, "qnn.dense", "y", "main", (x, NodeInput(InputKind.NODE, "w", t, 0)), (t,))
    >>> table = TableSpec("npu", (PatternSpec("npu.dense", OpCall(("qnn.dense",), (AnyValue(), ConstantValue()))),))
    >>> derived = derive(table, FoldGraph((q, dense)), {})
    >>> {node: (action.value, pattern) for node, (action, pattern) in derived.claims.items()}
    {0: ('fold', 'npu.dense')}
    """
    keys = keys or node_keys(graph)
    runtime = runtime_calls(graph)
    facts = constant_sets(graph)
    claims: Dict[int, Tuple[Action, str]] = {}
    taken: Dict[int, str] = {}
    candidates: List[Candidate] = []
    misses: List[Miss] = []
    for pattern in table.patterns:
        ops = pattern.root_ops
        for node in graph.nodes:
            if node.id in taken or node.id not in runtime:
                continue
            if "" not in ops and node.op not in ops:
                continue
            if (pattern.name, keys[node.id]) in excluded:
                continue
            world = WhatIf(graph, claims, taken, facts)
            hit, miss = match_at(pattern.name, pattern.root, node.id, world, arguments)
            if hit is None:
                if miss is not None:
                    misses.append(miss)
                continue
            leaking = _leaking(graph, hit.claims, hit.nodes)
            if leaking is not None:
                misses.append(
                    Miss(
                        pattern.name,
                        node.id,
                        "structure",
                        f"{graph.nodes[leaking].label} is read outside the match too: kept "
                        "inside its composite, its value would leak (a weight two layers share "
                        "folds instead)",
                        False,
                        hit.nodes,
                        len(hit.nodes),
                    )
                )
                continue
            claims.update((n, (action, pattern.name)) for n, action in hit.claims.items())
            taken.update((n, pattern.name) for n in hit.nodes)
            candidates.append(Candidate(pattern.name, node.id, hit.claims, hit.nodes))
    return Derivation(tuple(candidates), claims, taken, tuple(misses))


def _leaking(
    graph: FoldGraph, claims: Mapping[int, Action], nodes: FrozenSet[int]
) -> Optional[int]:
    """A call the match keeps inside its composite that a call outside the match reads too."""
    consumers = graph.consumers()
    for node, action in sorted(claims.items()):
        if action is Action.KEEP and any(user not in nodes for user in consumers[node]):
            return node
    return None
