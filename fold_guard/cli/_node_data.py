"""``fold-guard draw -o decisions.json``: the plan as Model Explorer node data.

Google AI Edge's Model Explorer colours a graph's nodes from a *node data* file (the format of
``model_explorer/node_data_builder.py``, ai-edge-model-explorer 0.1.34; the schema written from
it is ``model_explorer_node_data.schema.json`` beside this module):
``{graph id: {"results": {node id: {"value", "bgColor", "textColor"}}, "thresholds": [...]}}``.

Node ids are those of the adapter that shows the model (:class:`ExplorerGraph`):

- ONNX, ``model-explorer-onnx`` 0.4.2 (on onnx-ir 1.1): the graph id is the ONNX graph's name
  (``""`` when it has none: the file then holds that one graph's data alone, the top-level
  ``results`` form); a node's id is its name after onnx-ir's ``NameFixPass`` (a name used before
  gets ``_1``, ``_2``, ...; an unnamed node is named ``node``, ``node_1``, ... in graph order;
  the adapter's own ``<node_{i}>`` fallback never applies: the pass runs first); an initializer
  is ``[value] <name>``. :func:`onnx_explorer_ids` reproduces that; :func:`match_conversions`
  pairs Relax's per-node conversions (:mod:`fold_guard.relax.frontends._layers`) with the nodes, in order.
- TFLite, Model Explorer's built-in flatbuffer adapter (C++, ``ai-edge-model-explorer-adapter``
  0.2.1): the graph id is the subgraph's name, else its signature key, else ``main``; operator
  ``i`` is ``"i"``; then ``GraphInputs`` and one ``pseudo_const`` node per constant tensor, in
  the order operators first read them, numbered on (:func:`tflite_explorer_ids`).

A node gets one value: the decision of the last Relax call its conversion emitted (its result: a
Conv's bias ``add``, a DequantizeLinear's ``dequantize``), as a category label with the HTML
page's colours (:data:`._categories.CATEGORIES`), or with ``numeric=True`` the bytes its folds
add (positive) or save (negative), coloured by thresholds. A constant node (an initializer, a
``pseudo_const``) gets the decision of the first call computing from constants that reads it as
the file holds it (a kept one first: then it ships as it is).

This module imports neither TVM nor onnx: it reads the plan and the ids the loader found.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._core.graph import InputKind
from .._core.planner import FoldPlan
from .._core.reasons import Action
from ._categories import CATEGORIES, category_of

__all__ = [
    "LABELS",
    "ExplorerGraph",
    "match_conversions",
    "node_data",
    "onnx_explorer_ids",
    "tflite_explorer_ids",
]

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
_KEPT = {"kept_by_barrier", "kept_by_rule", "kept_with_input", "unsupported"}

#: The numeric view's thresholds (upper bounds, in bytes): saves, none, adds a little, adds much.
_THRESHOLDS = (
    (-1, "#2e7d32", "#ffffff"),
    (0, "#cfd8dc", "#000000"),
    (65536, "#ffcc80", "#000000"),
    (2**62, "#c62828", "#ffffff"),
)


@dataclass(frozen=True)
class ExplorerGraph:
    """Where a model's calls are in Model Explorer's graph of the model file."""

    graph_id: str
    #: ``(function, label)`` of a call -> the node whose conversion emitted it
    calls: Mapping[Tuple[str, str], str]
    #: ``(function, label)`` of a call -> the constant nodes (as the file holds them) it reads
    constants: Mapping[Tuple[str, str], Tuple[str, ...]] = field(default_factory=dict)


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


def tflite_explorer_ids(
    num_operators: int,
    operator_inputs: Sequence[Sequence[int]],
    operator_outputs: Sequence[Sequence[int]],
    graph_inputs: Sequence[int],
    graph_outputs: Sequence[int],
) -> Dict[int, str]:
    """The built-in TFLite adapter's id of each constant tensor's ``pseudo_const`` node.

    Operators take ids ``0 .. n-1``; the ``GraphInputs`` node (if the subgraph has inputs) the
    next; then, walking the operators in order, each input tensor that no earlier node produced
    (``-1`` is an absent optional input) becomes a constant node with the next id, as do graph
    outputs nothing produced, after the ``GraphOutputs`` node's.

    >>> tflite_explorer_ids(2, [[0, 1], [2, 3, 1]], [[2], [4]], [0], [4])
    {1: '3', 3: '4'}
    """
    next_id = num_operators
    produced: set[int] = set()
    if graph_inputs:
        next_id += 1
        produced.update(graph_inputs)
    found: Dict[int, str] = {}

    def read(tensors: Sequence[int]) -> None:
        nonlocal next_id
        for tensor in tensors:
            if tensor >= 0 and tensor not in produced:
                found[tensor] = str(next_id)
                produced.add(tensor)
                next_id += 1

    for inputs, outputs in zip(operator_inputs, operator_outputs):
        read(inputs)
        produced.update(outputs)
    if graph_outputs:
        next_id += 1
        read(graph_outputs)
    return found


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
    graph: ExplorerGraph,
    *,
    numeric: bool = False,
    name: str = "fold-guard",
) -> Dict[str, Any]:
    """The node-data file: one result per node of ``graph`` that has a decided call.

    Calls without a node (an ``If`` branch's) are left out.
    """
    last: Dict[str, int] = {}
    delta: Dict[str, int] = {}
    folds: set[str] = set()
    for node in plan.graph.nodes:
        node_id = graph.calls.get((node.function, node.label))
        if node_id is None:
            continue
        last[node_id] = node.id  # graph order: the last call wins, the node's result
        delta[node_id] = delta.get(node_id, 0) + _fold_delta(plan, node.id)
        if plan.decisions[node.id].action is Action.FOLD:
            folds.add(node_id)
    results: Dict[str, Dict[str, Any]] = {}
    data: Dict[str, Any] = {"name": name, "results": results}
    if numeric:
        for node_id in last:
            if node_id in folds:
                results[node_id] = {"value": delta[node_id]}
        data["name"] = f"{name}: bytes a fold adds (+) or saves (-)"
        data["thresholds"] = [
            {"value": value, "bgColor": bg, "textColor": text} for value, bg, text in _THRESHOLDS
        ]
    else:
        for node_id, index in last.items():
            results[node_id] = _result(plan, index)
        for node_id, index in _constant_readers(plan, graph).items():
            results[node_id] = _result(plan, index)
        data["showLabelCountColumnsInChildrenStatsTable"] = True
    return {graph.graph_id: data} if graph.graph_id else data


def _result(plan: FoldPlan, index: int) -> Dict[str, Any]:
    """Call ``index``'s decision as a labelled, coloured value."""
    decision = plan.decisions[index]
    category = category_of(decision.reason)
    label = LABELS[category]
    if category in ("kept_by_rule", "kept_with_input") and decision.rule:
        label = f"{label} {decision.rule}"
    return {
        "value": label,
        "bgColor": CATEGORIES[category][1],
        "textColor": "#000000" if category in _DARK_TEXT else "#ffffff",
    }


def _constant_readers(plan: FoldPlan, graph: ExplorerGraph) -> Dict[str, int]:
    """Each constant node's deciding call: where what the constant feeds meets run-time code.

    From each constant-only call that reads the constant, the path follows constant-only
    consumers to the last one (a weight's ``dequantize`` after its folded ``permute_dims``): that
    call's decision is what became of the constant, as the precision ledger says it. A kept
    decision wins over the others (the constant then ships as it is), else the first found.
    """
    users = plan.graph.consumers()

    def weight_side(index: int) -> bool:
        return category_of(plan.decisions[index].reason) != "not_constant"

    def frontier(index: int) -> int:
        seen = {index}
        while True:
            following = [u for u in users[index] if weight_side(u) and u not in seen]
            if not following:
                return index
            index = following[0]
            seen.add(index)

    chosen: Dict[str, int] = {}
    for node in plan.graph.nodes:
        if not weight_side(node.id):
            continue  # run-time code reads the constant: nothing was decided about it
        ids = graph.constants.get((node.function, node.label), ())
        if not ids:
            continue
        end = frontier(node.id)
        kept = category_of(plan.decisions[end].reason) in _KEPT
        for node_id in ids:
            current = chosen.get(node_id)
            if current is None or (
                kept and category_of(plan.decisions[current].reason) not in _KEPT
            ):
                chosen[node_id] = end
    return chosen
