"""Fold decisions derived from a backend's pattern table: the rules of ``backend_policy``.

**Deriving** is :mod:`fold_guard._core.offload_derive`: each pattern, in the table's priority
order, matched with every decision open; a match asks its constant operands folded and the calls
on constants it matches kept. What no accepted match claims follows the IR's default, except a
dequantize of constants, which folds with what it computes from: a layer no pattern takes gets a
constant weight, not a run-time dequantize.

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
from .offload_derive import Derivation, NodeKey, derive, node_keys
from .pattern_match import Arg, cone_of, constant_sets
from .pattern_spec import TableSpec
from .policy import CallView, FoldPolicy, Rule
from .reasons import Action

__all__ = [
    "UNCLAIMED_DEQUANTIZE_RULE",
    "Binding",
    "Decided",
    "TableRules",
    "bind_tables",
    "is_dequantize",
    "table_policy",
    "unconfirmed_policy",
]

#: The rule that folds a dequantize of a constant that no accepted match keeps.
UNCLAIMED_DEQUANTIZE_RULE = "fold-dequantize-no-pattern-takes"


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
