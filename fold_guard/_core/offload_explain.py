"""The reason a table did not take a call, from the matcher and from runs of the real table.

The adapter runs the table four times on the module: under the decisions being explained and
under the decisions the table itself asks for (:func:`~fold_guard._core.offload.unconfirmed_policy`),
each with the patterns' checks and without them (:class:`Runs`). The matcher says where the
structure stops matching under the decisions being explained (:class:`~fold_guard._core.
pattern_match.AsDecided`). A missed call's reason is the first of these that holds:

1. a different fold decision gets past the stop, and under the table's decisions the call is
   taken: ``operand-not-constant`` / ``folded-away``, naming the operand and the rule;
2. under the table's decisions the structure matches but the check refuses: ``check-refused``;
3. as the module is, the structure matches but the check refuses: ``check-refused``;
4. a different decision gets past the stop but the table still does not take the call: the
   stop's kind, saying so;
5. the operand is run-time data (no fold makes it constant): ``operand-not-constant``;
6. otherwise ``no-pattern``, with the closest pattern and where it differs.

The order puts what a user can change first: CLML's conv bias kept as a dequantize reads
"operand-not-constant" although another pattern's check (a plain add's) refused it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .graph import SOURCE_KINDS, FoldGraph, FoldNode
from .kernel_names import DEQUANTIZE, QUANTIZE, kernel_role
from .offload_derive import runtime_calls
from .offload_report import (
    CHECK_REFUSED,
    FOLDED_AWAY,
    NO_PATTERN,
    OPERAND_NOT_CONSTANT,
    OffloadReason,
    OffloadRow,
)
from .op_names import OP_TABLES
from .pattern_match import Arg, AsDecided, Miss, match_at
from .pattern_spec import PatternSpec, TableSpec
from .plan import DEFAULT_RULE, FoldDecision
from .reasons import Action
from .summary import tensor_text

__all__ = ["Runs", "explain_rows", "operands_text", "plan_world"]

#: How far above a call (through its consumers) a pattern's root may be: requantize(bias_add(
#: conv2d)) with a clip is four.
ROOT_DEPTH = 5

_QDQ_OPS = frozenset(name for t in OP_TABLES for name in t.quantize | t.dequantize)


@dataclass(frozen=True)
class Runs:
    """Where the table's runs put each call: node -> composite, with checks and without."""

    checked: Mapping[int, str]
    unchecked: Mapping[int, str]


def _is_qdq(node: FoldNode) -> bool:
    if node.lowered:
        return kernel_role(node.callee) in (DEQUANTIZE, QUANTIZE)
    return node.op in _QDQ_OPS


def _elements(shape: Optional[Tuple[Optional[int], ...]]) -> Optional[int]:
    if shape is None or any(d is None for d in shape):
        return None
    total = 1
    for dim in shape:
        total *= dim  # type: ignore[operator]
    return total


def _quantization(graph: FoldGraph, node: FoldNode) -> List[str]:
    """Per-channel or per-tensor scales of the call itself (a ``qnn.*`` op) and of the
    quantize / dequantize calls its operands come from."""
    notes: List[str] = []
    sources: List[Tuple[Optional[int], FoldNode]] = (
        [(None, node)] if node.op.startswith("qnn.") else []
    )
    for position, inp in enumerate(node.inputs):
        if inp.kind in SOURCE_KINDS and _is_qdq(graph.nodes[inp.source]):
            sources.append((position, graph.nodes[inp.source]))
    for index, source in sources:
        scales = [
            _elements(inp.tensor.shape)
            for inp in source.inputs[1:]
            if inp.tensor is not None and inp.tensor.dtype.startswith("float")
        ]
        many = [n for n in scales if n is not None and n > 1]
        axis = source.attrs.get("axis") if not source.lowered else None
        data = source.inputs[0].tensor if source.inputs else None
        where = (
            f"operand {index} is {source.op} of {tensor_text(data)}"
            if index is not None
            else node.op
        )
        if many:
            along = f" along axis {axis}" if axis is not None else ""
            notes.append(f"{where}, per-channel ({max(many)} scales{along})")
        elif scales:
            notes.append(f"{where}, per-tensor")
    return notes


def operands_text(graph: FoldGraph, node: FoldNode) -> str:
    """``operands uint8[1, 16, 16, 3] (x), int8[8, 3, 3, 3] (const), ...; quantization ...``."""
    operands = ", ".join(f"{tensor_text(inp.tensor)} ({inp.label})" for inp in node.inputs)
    text = f"operands {operands}" if operands else "no tensor operands"
    if len(node.outputs) == 1:
        text += f"; result {tensor_text(node.outputs[0])}"
    quantization = _quantization(graph, node)
    return text + (f"; quantization: {', '.join(quantization)}" if quantization else "")


def _roots_near(graph: FoldGraph, node: int, pattern: PatternSpec) -> List[int]:
    """``node`` and the calls reading it (transitively, :data:`ROOT_DEPTH` deep) that the
    pattern's root could match."""
    ops = pattern.root_ops
    consumers = graph.consumers()
    found, frontier, seen = [], [node], {node}
    for _ in range(ROOT_DEPTH):
        nxt = []
        for current in frontier:
            if "" in ops or graph.nodes[current].op in ops:
                found.append(current)
            for user in consumers[current]:
                if user not in seen:
                    seen.add(user)
                    nxt.append(user)
        frontier = nxt
    return found


@dataclass(frozen=True)
class _Attempt:
    pattern: PatternSpec
    miss: Optional[Miss]  # None: the structure matches as decided


def _attempts(
    table: TableSpec,
    graph: FoldGraph,
    node: FoldNode,
    world: AsDecided,
    arguments: Mapping[int, Sequence[Arg]],
) -> List[_Attempt]:
    attempts: List[_Attempt] = []
    for pattern in table.patterns:
        if node.op not in pattern.ops:
            continue
        for root in _roots_near(graph, node.id, pattern):
            hit, miss = match_at(pattern.name, pattern.root, root, world, arguments)
            if hit is not None and node.id in hit.nodes:
                attempts.append(_Attempt(pattern, None))
            elif miss is not None and (root == node.id or node.id in miss.reached):
                attempts.append(_Attempt(pattern, miss))
    return attempts


def _score(miss: Miss) -> Tuple[bool, int]:
    return miss.fixable, miss.depth


def _depth(miss: Miss) -> int:
    return miss.depth


def _best(misses: Sequence[Miss]) -> Optional[Miss]:
    return max(misses, key=_score, default=None)


def _reason(
    table: TableSpec,
    graph: FoldGraph,
    node: FoldNode,
    attempts: Sequence[_Attempt],
    as_is: Runs,
    what_if: Runs,
    check_text: Callable[[str], str],
) -> OffloadReason:
    misses = [a.miss for a in attempts if a.miss is not None]
    fixable = _best([m for m in misses if m.fixable])
    operands = operands_text(graph, node)
    if fixable is not None and node.id in what_if.checked:
        taker = what_if.checked[node.id]
        wants = "a constant there" if fixable.kind == OPERAND_NOT_CONSTANT else "that call kept"
        change = "folded" if fixable.kind == OPERAND_NOT_CONSTANT else "kept"
        detail = (
            f"{fixable.pattern} wants {wants}: {fixable.detail}; {change}, {taker} takes the call"
        )
        return OffloadReason(fixable.kind, detail, fixable.pattern)
    if node.id in what_if.unchecked and node.id not in as_is.unchecked:
        pattern = what_if.unchecked[node.id]
        detail = (
            f"the structure matches {pattern} once the fold decisions it needs are made, but "
            f"{check_text(pattern)} refused it: {operands}"
        )
        return OffloadReason(CHECK_REFUSED, detail, pattern)
    if node.id in as_is.unchecked:
        pattern = as_is.unchecked[node.id]
        detail = (
            f"the structure matches {pattern}, but {check_text(pattern)} refused it: {operands}"
        )
        return OffloadReason(CHECK_REFUSED, detail, pattern)
    if fixable is not None:
        detail = (
            f"{fixable.pattern}: {fixable.detail}; even with a different fold decision the "
            f"table did not take it ({operands})"
        )
        return OffloadReason(fixable.kind, detail, fixable.pattern)
    constant = [m for m in misses if m.kind in (OPERAND_NOT_CONSTANT, FOLDED_AWAY)]
    if constant:
        miss = max(constant, key=_depth)
        detail = f"{miss.pattern} wants a constant there: {miss.detail}; no fold makes it one"
        if miss.kind == FOLDED_AWAY:
            detail = f"{miss.pattern}: {miss.detail}"
        return OffloadReason(miss.kind, detail, miss.pattern)
    closest = _best(misses)
    if closest is None:
        matched = next((a.pattern.name for a in attempts if a.miss is None), None)
        if matched is not None:
            detail = (
                f"its structure matches {matched} here, but the table grouped the calls "
                "around it otherwise (a higher-priority pattern took a neighbour)"
            )
            return OffloadReason(NO_PATTERN, detail, matched)
        having = [p for p in table.patterns if node.op in p.ops]
        if not having:
            return OffloadReason(NO_PATTERN, f"no pattern of {table.name} takes {node.op}", None)
        roots = sorted({op for p in having for op in p.root_ops})
        readers = sorted({graph.nodes[u].op for u in graph.consumers()[node.id]}) or ["nothing"]
        names = ", ".join(p.name for p in having[:3]) + (" ..." if len(having) > 3 else "")
        detail = (
            f"no pattern of {table.name} has this structure: {names} take {node.op} only under "
            f"{' / '.join(roots)}, and no call reading it within {ROOT_DEPTH} steps is one (it "
            f"is read by {', '.join(readers)})"
        )
        return OffloadReason(NO_PATTERN, detail, having[0].name)
    detail = f"no pattern of {table.name} has this structure; closest, {closest.pattern}: {closest.detail}"
    return OffloadReason(NO_PATTERN, detail, closest.pattern)


def explain_rows(
    table: TableSpec,
    graph: FoldGraph,
    arguments: Mapping[int, Sequence[Arg]],
    world: AsDecided,
    as_is: Runs,
    what_if: Runs,
    check_text: Callable[[str], str],
    *,
    reasons: bool = True,
    skip: FrozenSet[str] = frozenset(),
) -> Tuple[OffloadRow, ...]:
    """One row per call of an anchor op that reads run-time data (module docstring), but those
    of the functions in ``skip`` (composites a partition made before); ``reasons=False`` only
    says which composite took each call."""
    anchors = table.anchors
    runtime = runtime_calls(graph)
    rows: List[OffloadRow] = []
    for node in graph.nodes:
        if node.op not in anchors or node.id not in runtime:
            continue
        if node.function in skip or node.function.split("/")[0] in skip:
            continue
        composite = as_is.checked.get(node.id)
        reason = None
        if composite is None and reasons:
            attempts = _attempts(table, graph, node, world, arguments)
            reason = _reason(table, graph, node, attempts, as_is, what_if, check_text)
        rows.append(OffloadRow(node.label, node.op, composite, reason, node.function, node.label))
    return tuple(rows)


def plan_world(graph: FoldGraph, decisions: Sequence[FoldDecision]) -> AsDecided:
    """The :class:`AsDecided` world of a plan's decisions: what they fold becomes a constant,
    the rest stays a call, with the decision's reason and rule as the why."""
    folded = frozenset(d.node for d in decisions if d.action is Action.FOLD)
    why: Dict[int, str] = {}
    folded_by: Dict[int, str] = {}
    for d in decisions:
        if d.node in folded:
            folded_by[d.node] = d.rule
        else:
            # the stock rule's own words where the IR's default kept it ("QNN ops are kept ...")
            said = f" ({d.detail})" if d.rule == DEFAULT_RULE and d.detail else ""
            why[d.node] = d.reason.text + (f" [{d.rule}]" if d.rule else "") + said
    return AsDecided(graph, folded, why, folded_by)
