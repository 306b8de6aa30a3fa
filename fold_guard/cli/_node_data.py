"""``fold-guard draw -o decisions.json``: the plan as Model Explorer node data.

Google AI Edge's Model Explorer colours a graph's nodes from a *node data* file (the format of
``model_explorer/node_data_builder.py``, ai-edge-model-explorer 0.1.34; the schema written from
it is ``model_explorer_node_data.schema.json`` beside this module):
``{graph id: {"results": {node id: {"value", "bgColor", "textColor"}}, "thresholds": [...]}}``.

Node ids are those of the ``model-explorer-onnx`` adapter (0.4.2, on onnx-ir 1.1): the graph id is
the ONNX graph's name (``""`` when it has none: the file then holds that one graph's data alone,
the top-level ``results`` form) and a node's id its name after onnx-ir's
``NameFixPass``: a name used before gets ``_1``, ``_2``, ...; an unnamed node is named ``node``,
``node_1``, ... in graph order. (The adapter's own ``<node_{i}>`` fallback never applies: the pass
runs first.) :func:`onnx_explorer_ids` reproduces that; :func:`match_conversions` pairs Relax's
per-node conversions (:mod:`._layers`) with the nodes, in order.

A node gets one value: the decision of the last Relax call its conversion emitted (its result: a
Conv's bias ``add``, a DequantizeLinear's ``dequantize``), as a category label with the HTML
page's colours (:data:`._categories.CATEGORIES`), or with ``numeric=True`` the bytes its folds
add (positive) or save (negative), coloured by thresholds.

This module imports neither TVM nor onnx: it reads the plan, the report and a graph's node names.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._core.graph import InputKind
from .._core.planner import FoldPlan
from .._core.reasons import Action
from ._categories import CATEGORIES, category_of

__all__ = ["LABELS", "match_conversions", "node_data", "onnx_explorer_ids"]

#: Category -> the value Model Explorer shows (its legend and the group nodes' label counts).
LABELS: Dict[str, str] = {
    "folded": "folded",
    "lifted": "lifted",
    "kept_by_barrier": "kept: barrier",
    "kept_by_rule": "kept: rule",  # + the rule's name
    "kept_with_input": "kept: input kept by",  # + the rule's name
    "not_constant": "not constant",
    "unsupported": "cannot be evaluated",
}

_DARK_TEXT = {"kept_with_input", "not_constant", "lifted"}

#: The numeric view's thresholds (upper bounds, in bytes): saves, none, adds a little, adds much.
_THRESHOLDS = (
    (-1, "#2e7d32", "#ffffff"),
    (0, "#cfd8dc", "#000000"),
    (65536, "#ffcc80", "#000000"),
    (2**62, "#c62828", "#ffffff"),
)


def onnx_explorer_ids(graph_name: str, node_names: Sequence[str]) -> Tuple[str, List[str]]:
    """The adapter's graph id and each node's id, as onnx-ir's ``NameFixPass`` names them.

    >>> onnx_explorer_ids("", ["conv", "", "conv", ""])
    ('', ['conv', 'node', 'conv_1', 'node_1'])
    """
    used: set[str] = set()
    counter: collections.Counter[str] = collections.Counter()
    ids = []
    for name in node_names:
        preferred = name or "node"
        new = preferred
        while new in used:
            counter[preferred] += 1
            new = f"{preferred}_{counter[preferred]}"
        used.add(new)
        ids.append(new)
    return graph_name, ids


def match_conversions(
    recorded: Sequence[str], node_names: Sequence[str], node_ops: Sequence[str]
) -> List[Optional[int]]:
    """The graph node of each recorded conversion (its name, or op type for an unnamed node).

    Relax's importer converts the main graph's nodes in order (an ``If`` is not converted as an
    operator, its branches' nodes are, in between); a conversion is the next node of its name
    (an unnamed node: of its op type), else it is a branch's node and has none.

    >>> match_conversions(["a", "Add", "x", "b"], ["a", "", "b"], ["Conv", "Add", "Relu"])
    [0, 1, None, 2]
    """
    found: List[Optional[int]] = []
    at = 0
    for name in recorded:
        j = at
        while j < len(node_names) and (node_names[j] or node_ops[j]) != name:
            j += 1
        if j < len(node_names):
            found.append(j)
            at = j + 1
        else:
            found.append(None)
    return found


def _fold_delta(plan: FoldPlan, index: int) -> int:
    """Bytes the fold of call ``index`` adds (its result less what it read), 0 if it is kept."""
    if plan.decisions[index].action is not Action.FOLD:
        return 0
    node = plan.graph.nodes[index]
    read = sum(
        (inp.tensor.nbytes or 0)
        for inp in node.inputs
        if inp.kind in (InputKind.CONSTANT, InputKind.NODE) and inp.tensor is not None
    )
    return sum(out.nbytes or 0 for out in node.outputs) - read


def node_data(
    plan: FoldPlan,
    graph_id: str,
    explorer_ids: Mapping[Tuple[str, str], str],
    *,
    numeric: bool = False,
    name: str = "fold-guard",
) -> Dict[str, Any]:
    """The node-data file: one result per node of ``graph_id`` that has a decided call.

    ``explorer_ids`` maps a call's ``(function, label)`` to the node id its conversion came from;
    calls without one (an ``If`` branch's, a ``.json`` module's) are left out.
    """
    last: Dict[str, int] = {}
    delta: Dict[str, int] = {}
    folds: set[str] = set()
    for node in plan.graph.nodes:
        node_id = explorer_ids.get((node.function, node.label))
        if node_id is None:
            continue
        last[node_id] = node.id  # graph order: the last call wins, the node's result
        delta[node_id] = delta.get(node_id, 0) + _fold_delta(plan, node.id)
        if plan.decisions[node.id].action is Action.FOLD:
            folds.add(node_id)
    results: Dict[str, Dict[str, Any]] = {}
    graph: Dict[str, Any] = {"name": name, "results": results}
    if numeric:
        for node_id in last:
            if node_id in folds:
                results[node_id] = {"value": delta[node_id]}
        graph["name"] = f"{name}: bytes a fold adds (+) or saves (-)"
        graph["thresholds"] = [
            {"value": value, "bgColor": bg, "textColor": text} for value, bg, text in _THRESHOLDS
        ]
    else:
        for node_id, index in last.items():
            decision = plan.decisions[index]
            category = category_of(decision.reason)
            label = LABELS[category]
            if category in ("kept_by_rule", "kept_with_input") and decision.rule:
                label = f"{label} {decision.rule}"
            results[node_id] = {
                "value": label,
                "bgColor": CATEGORIES[category][1],
                "textColor": "#000000" if category in _DARK_TEXT else "#ffffff",
            }
        graph["showLabelCountColumnsInChildrenStatsTable"] = True
    return {graph_id: graph} if graph_id else graph
