"""What both adapters' ``backend_policy`` and ``explain_offload`` share: trying a table on a module.

Deciding is the core's (:mod:`fold_guard._core.offload`, :mod:`fold_guard._core.offload_explain`);
trying needs TVM, and is the same recipe on both IRs, with the IR's steps as an
:class:`OffloadAdapter`:

1. read the module for folding (the adapter's analysis: graph, translation) and tag a copy of
   it, each call with a span naming its graph node;
2. make the module the backend's partitioner would see under a policy (fold; Relax with weights
   as parameters: annotate, fold, lift);
3. run the table on it, with or without the patterns' checks, and read which tagged call ended in
   which composite.

An :class:`OffloadSession` holds step 1 for one module and table, so that the counts under many
policies (the command's comparison) read the module once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .._core.offload import Binding, TableRules, bind_tables, is_dequantize, unconfirmed_policy
from .._core.offload_explain import Runs, explain_rows, plan_world
from .._core.offload_report import OffloadReport, OffloadRow
from .._core.pattern_match import Arg, AsDecided
from .._core.planner import plan_folds
from .._core.policy import FoldPolicy
from .._core.reasons import Action
from .._core.registry import PolicySpec, resolve_policy
from .partition import Partitioned

__all__ = ["OffloadAdapter", "OffloadSession", "TableBinder"]


@dataclass(frozen=True)
class OffloadAdapter:
    """An IR's steps (module docstring). ``analysis_type`` is the adapter's analysis class;
    ``table`` objects have ``spec``, ``name`` and ``check_text(pattern)``; ``existing`` reads
    what a partition did to a module that the walk does not see (Relay's external functions:
    their composites' calls, and the functions' names)."""

    analysis_type: type
    analyse: Callable[[Any], Any]
    tag: Callable[[Any], Any]
    arguments: Callable[[Any], Mapping[int, Sequence[Arg]]]
    decided: Callable[[Any, FoldPolicy], Any]
    composites: Callable[..., Dict[int, str]]
    #: the IR's stock flow on a module (``FoldConstant``; Relax with weights as parameters, then
    #: ``LiftTransformParams``), for comparisons
    stock: Callable[[Any], Any]
    existing: Optional[
        Callable[[Any, FrozenSet[str]], Tuple[List[Tuple[str, str, str, str]], FrozenSet[str]]]
    ] = None


class TableBinder:
    """Binds a table's rules to the module an analysis read (:class:`~fold_guard._core.offload.Binding`):
    the trial folds a tagged copy under the policy being settled and runs each table on it."""

    def __init__(self, adapter: OffloadAdapter, table: Any) -> None:
        self.adapter = adapter
        self.table = table

    def __call__(self, analysis: object) -> Optional[Binding]:
        adapter = self.adapter
        if not isinstance(analysis, adapter.analysis_type):
            return None
        tagged = adapter.tag(analysis)

        def trial(policy: FoldPolicy, tables: Sequence[TableRules]) -> Sequence[Mapping[int, str]]:
            module = adapter.decided(tagged, policy)
            return [adapter.composites(module, _table_of(t), checks=True) for t in tables]

        return Binding(analysis.graph, adapter.arguments(analysis), trial)  # type: ignore[attr-defined]


def _table_of(rules: TableRules) -> Any:
    if not isinstance(rules.binder, TableBinder):
        raise TypeError(f"{rules!r} was not made by an adapter's backend_policy")
    return rules.binder.table


class OffloadSession:
    """One module and one table: the module read and tagged once, then tried under policies."""

    def __init__(self, adapter: OffloadAdapter, mod: Any, table: Any) -> None:
        if isinstance(mod, Partitioned):
            mod = mod.mod
        self.adapter = adapter
        self.table = table
        # A partitioned module: what its composites hold is offloaded already.
        self.existing: List[Tuple[str, str, str, str]] = []
        self.skip: FrozenSet[str] = frozenset()
        if adapter.existing is not None:
            self.existing, self.skip = adapter.existing(mod, table.spec.anchors)
        self.analysis = adapter.analyse(mod)
        self.graph = self.analysis.graph
        self.tagged = adapter.tag(self.analysis)
        self.arguments = adapter.arguments(self.analysis)
        self._what_if: Optional[Runs] = None
        self._counts: Dict[Tuple[Action, ...], int] = {}

    def _runs(self, module: Any) -> Runs:
        composites = self.adapter.composites
        return Runs(composites(module, self.table), composites(module, self.table, checks=False))

    def resolve(self, policy: PolicySpec) -> FoldPolicy:
        """``policy`` resolved, a backend's table rules settled on this module."""
        return bind_tables(resolve_policy(policy), self.analysis)

    def count(self, policy: PolicySpec) -> int:
        """How many of the report's calls the table offloads under ``policy``.

        Policies that decide every call alike give the same module: it is made and run once
        (the comparison's built-in policies often agree on a model)."""
        resolved = self.resolve(policy)
        actions = tuple(d.action for d in plan_folds(self.graph, resolved).decisions)
        if actions not in self._counts:
            module = self.adapter.decided(self.tagged, resolved)
            self._counts[actions] = self.count_module(module)
        return self._counts[actions]

    def count_stock(self) -> int:
        """How many calls the table offloads after the IR's stock ``FoldConstant``."""
        return self.count_module(self.adapter.stock(self.tagged))

    def count_module(self, module: Any) -> int:
        """How many of the report's calls the table offloads from ``module``: :attr:`tagged`
        after the caller's own passes (a stock ``FoldConstant``, say)."""
        taken = self.adapter.composites(module, self.table)
        rows = explain_rows(
            self.table.spec,
            self.graph,
            self.arguments,
            AsDecided(self.graph),
            Runs(taken, taken),
            Runs(taken, taken),
            self.table.check_text,
            reasons=False,
            skip=self.skip,
        )
        return len(self.existing) + sum(row.offloaded for row in rows)

    def runtime_dequantize(self, policy: PolicySpec) -> Tuple[str, ...]:
        """The dequantize calls of constants (or weight parameters) ``policy`` leaves to run
        time outside any composite of the table: each a weight dequantized at every inference."""
        resolved = self.resolve(policy)
        decisions = plan_folds(self.graph, resolved).decisions
        taken = self.adapter.composites(self.adapter.decided(self.tagged, resolved), self.table)
        known = self.graph.reachable_from_constants(through_barriers=True, with_parameters=True)
        return tuple(
            node.label
            for node, decision in zip(self.graph.nodes, decisions)
            if is_dequantize(node)
            and node.id in known
            and decision.action is Action.KEEP
            and node.id not in taken
        )

    def report(self, policy: Optional[PolicySpec]) -> OffloadReport:
        """The report under ``policy`` (None: the module as given)."""
        if policy is None:
            world, module, name = AsDecided(self.graph), self.tagged, None
        else:
            resolved = self.resolve(policy)
            world = plan_world(self.graph, plan_folds(self.graph, resolved).decisions)
            module, name = self.adapter.decided(self.tagged, resolved), resolved.name
        if self._what_if is None:
            wanted, _ = unconfirmed_policy(self.table.spec, self.graph, self.arguments)
            self._what_if = self._runs(self.adapter.decided(self.tagged, wanted))
        rows = explain_rows(
            self.table.spec,
            self.graph,
            self.arguments,
            world,
            self._runs(module),
            self._what_if,
            self.table.check_text,
            skip=self.skip,
        )
        before = tuple(
            OffloadRow(f"{function}/{label}", op, composite, None, function, label)
            for function, label, op, composite in self.existing
        )
        return OffloadReport(self.table.name, name, before + rows)
