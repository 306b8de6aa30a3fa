"""Fold decisions derived from a backend's pattern table: the rules of ``backend_policy``.

**Deriving.** For each pattern of the table in priority order, and each call its root could
match (a call that reads run-time data: a match computed from constants only is not a layer, and
folding it is never worse), the pattern is matched against the graph with every fold decision
still open (:class:`~fold_guard._core.pattern_match.WhatIf`). A match asks a price: every call
it wants as a constant operand (``is_const()`` / ``is_constant()``: the call and every call it
computes from) *folds*, every call on constants it matches as an operation (a weight's
``dequantize``, a ``decode`` kernel, a ``qnn.*`` op) is *kept*. A match is accepted when its
price agrees with what earlier, higher-priority matches asked, and the calls it takes are taken
by no earlier match, as ``FuseOpsByPattern`` / ``MergeComposite`` give earlier patterns
priority. Two patterns that want opposite decisions for one call: the earlier match wins, the
later one is not accepted (its alternatives are tried first). A match that would keep a call
that something outside it reads too (a weight two layers share) is not made: its composite
would have to leak the value; the weight folds, and a pattern wanting it constant can match.
What no accepted match claims follows the IR's default, except a dequantize of constants,
which folds with what it computes from: a layer no pattern takes gets a constant weight, not a
run-time dequantize.

**Confirming.** The description of a pattern is approximate and a pattern's check function
needs TVM, so the adapter *tries* the decisions (:class:`Binding`): it folds the module under
them, runs the table (checks included) and reports which calls ended in a composite. A match
whose root or kept calls did not is dropped (its check refused it, or the real matcher
disagrees) and the decisions are derived again without it, until every accepted match is
confirmed. Each round drops at least one match, so this ends; a table none of whose matches
needs a decision is never tried.

**As data.** The settled decisions are claims keyed by ``(function, label, occurrence)``, the
same in every walk of the module, so the policy's rules (one keep and one fold rule per pattern,
named after it) are data and deterministic. Before it is bound to a module (a policy used
without its adapter), a rule derives the decisions from the graph alone, unconfirmed.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import (
    Callable,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from .builtin_policies import DEQUANTIZE_OPS
from .graph import FoldGraph, FoldNode
from .kernel_names import DEQUANTIZE, kernel_role
from .pattern_match import Arg, Miss, WhatIf, cone_of, constant_sets, match_at
from .pattern_spec import TableSpec
from .policy import CallView, FoldPolicy, Rule
from .reasons import Action

__all__ = [
    "UNCLAIMED_DEQUANTIZE_RULE",
    "Binding",
    "Candidate",
    "Decided",
    "Derivation",
    "NodeKey",
    "TableRules",
    "bind_tables",
    "derive",
    "is_dequantize",
    "node_keys",
    "runtime_calls",
    "table_policy",
    "unconfirmed_policy",
]

#: ``(function, label, occurrence)``: a call, the same in every walk of one module.
NodeKey = Tuple[str, str, int]
#: The rule that folds a dequantize of a constant that no accepted match keeps.
UNCLAIMED_DEQUANTIZE_RULE = "fold-dequantize-no-pattern-takes"


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


@dataclass(frozen=True)
class Decided:
    """Settled decisions: claims by node key, and the matches a trial refused (with why)."""

    claims: Mapping[NodeKey, Tuple[Action, str]]
    excluded: Mapping[Tuple[str, NodeKey], str]


@dataclass(frozen=True)
class Binding:
    """What an adapter gives to settle tables on one module.

    ``graph`` is the module's FoldGraph, ``arguments`` its calls' argument layout where it is
    not one tensor per input, and ``trial(policy, tables)`` folds the module under ``policy``,
    runs each table (checks included) and returns, per table, node id -> the composite the call
    ended in.
    """

    graph: FoldGraph
    arguments: Mapping[int, Sequence[Arg]]
    trial: Callable[[FoldPolicy, Sequence[TableRules]], Sequence[Mapping[int, str]]]


#: How an adapter binds a table to the module being folded (its analysis, whatever its type).
Binder = Callable[[object], Optional[Binding]]


class TableRules:
    """One table's decisions, shared by its rules: settled (:class:`Decided`) once bound to a
    module by ``binder``, else derived from each graph unconfirmed. Graph-wide claims are
    computed once per graph (a cache that never changes an answer)."""

    def __init__(
        self, table: TableSpec, binder: Optional[Binder] = None, decided: Optional[Decided] = None
    ) -> None:
        self.table = table
        self.binder = binder
        self.decided = decided
        self._memo: Dict[
            int,
            Tuple[
                weakref.ref[FoldGraph],
                Tuple[Mapping[int, Tuple[Action, str]], FrozenSet[int]],
            ],
        ] = {}

    def __repr__(self) -> str:
        state = "settled" if self.decided is not None else "unbound"
        return f"TableRules({self.table.name!r}, {state})"

    def claims_for(self, graph: FoldGraph) -> Mapping[int, Tuple[Action, str]]:
        """Node id -> (the action the table asks, the pattern asking) on ``graph``."""
        return self._facts(graph)[0]

    def unclaimed_for(self, graph: FoldGraph) -> FrozenSet[int]:
        """The dequantize calls of constants no accepted match keeps, with every call they
        compute from that no match keeps either: what :data:`UNCLAIMED_DEQUANTIZE_RULE` folds."""
        return self._facts(graph)[1]

    def _facts(self, graph: FoldGraph) -> Tuple[Mapping[int, Tuple[Action, str]], FrozenSet[int]]:
        entry = self._memo.get(id(graph))
        if entry is not None and entry[0]() is graph:
            return entry[1]
        if self.decided is None:
            claims = derive(self.table, graph, {}).claims
        else:
            keys = node_keys(graph)
            claims = {
                node: self.decided.claims[key]
                for node, key in enumerate(keys)
                if key in self.decided.claims
            }
        kept = {node for node, (action, _) in claims.items() if action is Action.KEEP}
        constant, _ = constant_sets(graph)
        unclaimed: set[int] = set()
        for node in graph.nodes:
            if is_dequantize(node) and node.id in constant and node.id not in kept:
                unclaimed.update(n for n in cone_of(graph, node.id) if n not in kept)
        facts = (claims, frozenset(unclaimed))
        memo, key = self._memo, id(graph)

        def forget(_: weakref.ref[FoldGraph]) -> None:
            memo.pop(key, None)

        self._memo[key] = (weakref.ref(graph, forget), facts)
        return facts

    def bound(self, decided: Decided) -> TableRules:
        return TableRules(self.table, self.binder, decided)


@dataclass(frozen=True)
class _Claimed:
    """A rule's predicate: the table asks ``action`` of this call for ``pattern``."""

    table: TableRules
    action: Action
    pattern: str

    def __call__(self, call: CallView) -> bool:
        return self.table.claims_for(call.graph).get(call.node.id) == (self.action, self.pattern)


def is_dequantize(node: FoldNode) -> bool:
    """A dequantize op, or a kernel call whose name says it dequantizes (or decodes)."""
    if node.lowered:
        return kernel_role(node.callee) == DEQUANTIZE
    return node.op in DEQUANTIZE_OPS


@dataclass(frozen=True)
class _Unclaimed:
    """A dequantize of constants that no accepted match keeps, or a call it computes from."""

    table: TableRules

    def __call__(self, call: CallView) -> bool:
        return call.node.id in self.table.unclaimed_for(call.graph)


def table_rules(rules: TableRules) -> Tuple[Rule, ...]:
    """A keep and a fold rule per pattern that a decision can matter to, named after it, then the
    fold of every other dequantize of a constant."""
    made: List[Rule] = []
    for pattern in rules.table.patterns:
        if not pattern.may_claim:
            continue
        made.append(
            Rule(
                f"keep-for:{pattern.name}",
                Action.KEEP,
                f"{pattern.name} matches this call on constants",
                _Claimed(rules, Action.KEEP, pattern.name),
            )
        )
        made.append(
            Rule(
                f"fold-for:{pattern.name}",
                Action.FOLD,
                f"{pattern.name} wants it constant",
                _Claimed(rules, Action.FOLD, pattern.name),
            )
        )
    made.append(
        Rule(
            UNCLAIMED_DEQUANTIZE_RULE,
            Action.FOLD,
            f"a dequantize of constants no pattern of {rules.table.name} takes folds, with what it "
            "computes from (a layer the backend does not take gets a constant weight, not a "
            "run-time dequantize)",
            _Unclaimed(rules),
        )
    )
    return tuple(made)


def table_policy(
    table: TableSpec, *, name: Optional[str] = None, binder: Optional[Binder] = None
) -> FoldPolicy:
    """The policy of ``table``: its rules (:func:`table_rules`), settled per module by ``binder``.

    >>> from fold_guard._core.pattern_spec import AnyValue, ConstantValue, OpCall, PatternSpec
    >>> spec = TableSpec("npu", (PatternSpec("npu.dense", OpCall(("qnn.dense",), (AnyValue(), ConstantValue()))),))
    >>> [rule.name for rule in table_policy(spec).rules]
    ['keep-for:npu.dense', 'fold-for:npu.dense', 'fold-dequantize-no-pattern-takes']
    """
    rules = table_rules(TableRules(table, binder))
    return FoldPolicy(
        name or f"backend:{table.name}",
        f"what the {len(table.patterns)} patterns of {table.name} need: fold what a pattern "
        "wants as a constant, keep the calls on constants it matches, fold every other "
        "dequantize of a constant; confirmed per module by running the table, checks included",
        rules,
    )


def unconfirmed_policy(
    table: TableSpec, graph: FoldGraph, arguments: Mapping[int, Sequence[Arg]]
) -> Tuple[FoldPolicy, Derivation]:
    """The decisions ``table`` asks of ``graph`` before any is tried (what :func:`derive` finds),
    as a policy settled on that graph, with the derivation: the fold decisions a report asks
    "would the table take this call then?" about."""
    derived = derive(table, graph, arguments)
    keys = node_keys(graph)
    decided = Decided({keys[node]: claim for node, claim in derived.claims.items()}, {})
    policy = table_policy(table)
    holder = _tables_of(policy)[0]
    return _with_tables(policy, {holder: holder.bound(decided)}), derived


def _tables_of(policy: FoldPolicy) -> List[TableRules]:
    found: List[TableRules] = []
    for rule in policy.rules:
        if isinstance(rule.matches, (_Claimed, _Unclaimed)) and rule.matches.table not in found:
            found.append(rule.matches.table)
    return found


def _rebound(rule: Rule, replaced: Mapping[TableRules, TableRules]) -> Rule:
    matches = rule.matches
    if isinstance(matches, (_Claimed, _Unclaimed)) and matches.table in replaced:
        return dataclasses.replace(
            rule, matches=dataclasses.replace(matches, table=replaced[matches.table])
        )
    return rule


def _with_tables(policy: FoldPolicy, replaced: Mapping[TableRules, TableRules]) -> FoldPolicy:
    rules = tuple(_rebound(rule, replaced) for rule in policy.rules)
    return dataclasses.replace(policy, rules=rules)


def bind_tables(policy: FoldPolicy, context: object) -> FoldPolicy:
    """``policy`` with every table not yet settled settled on the module ``context`` describes.

    The adapters call this on every analysis; a policy without table rules, or whose tables are
    settled (a trial's own fold), is returned as it is.
    """
    tables = [t for t in _tables_of(policy) if t.decided is None and t.binder is not None]
    binder = tables[0].binder if tables else None
    if binder is None:
        return policy
    binding = binder(context)
    if binding is None:
        return policy
    return _settle(policy, tables, binding)


def _settle(policy: FoldPolicy, tables: Sequence[TableRules], binding: Binding) -> FoldPolicy:
    keys = node_keys(binding.graph)
    excluded: List[Dict[Tuple[str, NodeKey], str]] = [{} for _ in tables]
    while True:
        derived = [
            derive(t.table, binding.graph, binding.arguments, excluded[i], keys=keys)
            for i, t in enumerate(tables)
        ]
        settled = {
            table: table.bound(
                Decided({keys[node]: claim for node, claim in d.claims.items()}, dict(excluded[i]))
            )
            for i, (table, d) in enumerate(zip(tables, derived))
        }
        bound = _with_tables(policy, settled)
        pending = [(i, c) for i, d in enumerate(derived) for c in d.candidates if c.claims]
        if not pending:
            return bound
        composites = binding.trial(bound, [settled[t] for t in tables])
        refused = False
        for i, candidate in pending:
            missing = [n for n in (candidate.root, *candidate.keeps) if n not in composites[i]]
            if missing:
                where = binding.graph.nodes[missing[0]].label
                excluded[i][(candidate.pattern, keys[candidate.root])] = (
                    f"tried, {where} was not in a composite (the check refused the match, or the "
                    "table matches differently)"
                )
                refused = True
        if not refused:
            return bound
