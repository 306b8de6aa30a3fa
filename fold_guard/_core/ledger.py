"""The precision ledger: per weight, what a plan decided, as rows that travel inside the module.

A *weight* is a value computed from constants (or weights passed as parameters) only that a
run-time call reads: ``dequantize(quantize(W))`` feeding a ``conv2d``. Its row says what went in
(the largest constant leaf of its subgraph: the weight itself, not its scale or zero point), what
ships (the folded result, or the constant a kept call still reads: the int8 under a kept
``dequantize``), the action (``folded`` / ``kept`` / ``lifted``), the rule that decided and why.

Rows are keyed by the *content* of the weight (an adapter's ``weight_key``: :func:`content_key`
of a constant's dtype, shape and bytes, or a parameter's name), never by a variable name, so
passes that rename or re-bind variables do not break them. The adapters store
:func:`ledger_payload` as a module attribute (:data:`LEDGER_ATTR`) and read it back with
:func:`ledger_rows_from_payload`.

>>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo
>>> from fold_guard._core.planner import plan_folds
>>> from fold_guard._core.registry import resolve_policy
>>> f32, i8 = TensorInfo.of("float32", (4, 4)), TensorInfo.of("int8", (4, 4))
>>> w, x = NodeInput(InputKind.CONSTANT, "W", f32), NodeInput(InputKind.RUNTIME, "x", f32)
>>> q = FoldNode(0, "relax.quantize", "q", "main", (w,), (i8,))
>>> dq = FoldNode(1, "relax.dequantize", "dq", "main", (NodeInput(InputKind.NODE, "q", i8, 0),), (f32,))
>>> mm = FoldNode(2, "relax.matmul", "y", "main", (x, NodeInput(InputKind.NODE, "dq", f32, 1)), (f32,))
>>> plan = plan_folds(FoldGraph((q, dq, mm)), resolve_policy("keep-qdq-weights"))
>>> [row.brief() for row in ledger_rows(plan, lambda node, index: "w0")]
['w0: kept float32[4, 4] -> int8[4, 4] [keep-dequantize-of-integer-constant]']
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, cast

from .graph import SOURCE_KINDS, InputKind, TensorInfo
from .planner import DEFAULT_RULE, FoldPlan
from .reasons import Action

__all__ = [
    "LEDGER_ATTR",
    "LEDGER_VERSION",
    "LedgerRow",
    "content_key",
    "ledger_payload",
    "ledger_rows",
    "ledger_rows_from_payload",
    "name_layers",
]

#: The module attribute that holds the ledger (Relax and Relay ``IRModule.attrs``).
LEDGER_ATTR = "fold_guard.ledger"
LEDGER_VERSION = 1

#: ``weight_key(node_id, input_index)``: the content key of a constant or parameter input, or
#: None for an input that is no weight (a shape, a static value).
WeightKey = Callable[[int, int], Optional[str]]


def content_key(dtype: str, shape: Sequence[int], data: bytes) -> str:
    """``sha256:<16 hex digits>`` of a constant's dtype, shape and bytes (both adapters' key).

    >>> content_key("int8", (2,), bytes([1, 2]))
    'sha256:aa678146e95a2a32'
    """
    digest = hashlib.sha256(f"{dtype}{list(shape)}".encode())
    digest.update(data)
    return "sha256:" + digest.hexdigest()[:16]


@dataclass(frozen=True)
class LedgerRow:
    """What was decided for one weight: a row of the precision ledger (``ledger(mod)``).

    ``key`` is the weight's content key (``constant_key`` of each adapter). Shapes use -1 for a
    dimension not known statically.

    >>> from fold_guard import LedgerRow
    >>> row = LedgerRow.from_dict("sha256:0", {"action": "kept", "dtype_before": "int8"})
    >>> row.key, row.action, row.dtype_before
    ('sha256:0', 'kept', 'int8')
    """

    key: str
    function: str
    #: the binding that carries the weight into run-time code (as the plan saw it)
    label: str
    #: the run-time call that reads it, ``label = op``
    consumer: str
    #: the source layer, where the caller knows it (the command line's ONNX node), else ""
    layer: str
    action: str
    rule: str
    reason: str
    dtype_before: str
    shape_before: Tuple[int, ...]
    bytes_before: int
    dtype_after: str
    shape_after: Tuple[int, ...]
    bytes_after: int

    def to_dict(self) -> Dict[str, object]:
        """The row as the attribute stores it (shapes as lists)."""
        data: Dict[str, object] = {
            "key": self.key,
            "function": self.function,
            "label": self.label,
            "consumer": self.consumer,
            "layer": self.layer,
            "action": self.action,
            "rule": self.rule,
            "reason": self.reason,
            "dtype_before": self.dtype_before,
            "shape_before": list(self.shape_before),
            "bytes_before": self.bytes_before,
            "dtype_after": self.dtype_after,
            "shape_after": list(self.shape_after),
            "bytes_after": self.bytes_after,
        }
        return data

    @staticmethod
    def from_dict(key: str, data: Mapping[str, object]) -> LedgerRow:
        """A row read back from the attribute (missing fields empty)."""

        def text(name: str) -> str:
            return str(data.get(name, ""))

        def number(name: str) -> int:
            value = data.get(name, 0)
            return int(value) if isinstance(value, (int, str)) else 0

        def shape(name: str) -> Tuple[int, ...]:
            value = data.get(name, ())
            dims = cast(Sequence[object], value) if isinstance(value, (list, tuple)) else ()
            return tuple(int(dim) if isinstance(dim, (int, str)) else -1 for dim in dims)

        return LedgerRow(
            key=text("key") or key,
            function=text("function"),
            label=text("label"),
            consumer=text("consumer"),
            layer=text("layer"),
            action=text("action"),
            rule=text("rule"),
            reason=text("reason"),
            dtype_before=text("dtype_before"),
            shape_before=shape("shape_before"),
            bytes_before=number("bytes_before"),
            dtype_after=text("dtype_after"),
            shape_after=shape("shape_after"),
            bytes_after=number("bytes_after"),
        )

    def brief(self) -> str:
        """``key: action dtype[shape] -> dtype[shape] [rule]``."""
        before = f"{self.dtype_before}{list(self.shape_before)}"
        after = f"{self.dtype_after}{list(self.shape_after)}"
        return f"{self.key}: {self.action} {before} -> {after} [{self.rule}]"

    def line(self) -> str:
        """One line for a person: where, what became of it, bytes, rule and key."""
        where = f"{self.layer} ({self.label})" if self.layer else f"{self.function}: {self.label}"
        before = f"{self.dtype_before}{list(self.shape_before)}"
        after = f"{self.dtype_after}{list(self.shape_after)}"
        return (
            f"{where}: {self.action} {before} -> {after}, {self.bytes_before} -> "
            f"{self.bytes_after} B [{self.rule}] {self.key}"
        )


def _shape(info: Optional[TensorInfo]) -> Tuple[int, ...]:
    if info is None or info.shape is None:
        return ()
    return tuple(-1 if dim is None else dim for dim in info.shape)


def ledger_rows(
    plan: FoldPlan,
    weight_key: WeightKey,
    layers: Optional[Mapping[Tuple[str, str], str]] = None,
) -> Tuple[LedgerRow, ...]:
    """One row per weight of ``plan`` (see the module doc), in graph order.

    A weight is one constant (or parameter) leaf: where run-time code reads what it computes in
    two places (an embedding table read by ``take`` and by ``shape_of``), the first place's row
    stands for it. Two leaves with the same content (the same scale in every layer) are two
    weights: the second is keyed ``KEY#1``.
    """
    graph, decisions = plan.graph, plan.decisions
    nodes = graph.nodes
    weight_side = graph.reachable_from_constants(through_barriers=True, with_parameters=True)
    users = graph.consumers()
    rows: List[LedgerRow] = []
    used: Set[str] = set()
    leaves_seen: Set[Tuple[int, int]] = set()
    for node in nodes:
        if node.id not in weight_side:
            continue
        runtime_users = [u for u in users[node.id] if u not in weight_side]
        if users[node.id] and not runtime_users:
            continue  # only other weight-side calls read it: not a frontier
        region = _region(plan, node.id, weight_side)
        weight = _weight_leaf(plan, region, weight_key)
        if weight is None or weight[2] in leaves_seen:
            continue
        key, before, leaf = weight
        leaves_seen.add(leaf)
        decision = decisions[node.id]
        action = {Action.FOLD: "folded", Action.LIFT: "lifted"}.get(decision.action, "kept")
        if action == "kept":
            after = _shipped(plan, region)
            cause = decisions[decision.root] if decision.root is not None else decision
            rule = decision.rule or cause.rule or cause.reason.text
        else:
            after = node.outputs[0] if node.outputs else None
            rule = decision.rule or DEFAULT_RULE
        unique, n = key, 0
        while unique in used:
            n += 1
            unique = f"{key}#{n}"
        used.add(unique)
        consumer = nodes[runtime_users[0]] if runtime_users else None
        rows.append(
            LedgerRow(
                key=unique,
                function=node.function,
                label=node.label,
                consumer=f"{consumer.label} = {consumer.op}" if consumer else "",
                layer=(layers or {}).get((node.function, node.label), ""),
                action=action,
                rule=rule,
                reason=decision.reason.text,
                dtype_before=before.dtype if before else "",
                shape_before=_shape(before),
                bytes_before=(before.nbytes or 0) if before else 0,
                dtype_after=after.dtype if after else "",
                shape_after=_shape(after),
                bytes_after=(after.nbytes or 0) if after else 0,
            )
        )
    return tuple(rows)


def _region(plan: FoldPlan, frontier: int, weight_side: Set[int] | frozenset[int]) -> List[int]:
    """The weight-side calls ``frontier`` computes from, itself included, in graph order."""
    seen = {frontier}
    stack = [frontier]
    while stack:
        for inp in plan.graph.nodes[stack.pop()].inputs:
            if inp.kind in SOURCE_KINDS and inp.source in weight_side and inp.source not in seen:
                seen.add(inp.source)
                stack.append(inp.source)
    return sorted(seen)


def _weight_leaf(
    plan: FoldPlan, region: Sequence[int], weight_key: WeightKey
) -> Optional[Tuple[str, Optional[TensorInfo], Tuple[int, int]]]:
    """The key, type and place (node, input) of the region's largest keyed constant leaf (the
    first of equals)."""
    best: Optional[Tuple[int, str, Optional[TensorInfo], Tuple[int, int]]] = None
    for node_id in region:
        for index, inp in enumerate(plan.graph.nodes[node_id].inputs):
            if inp.kind not in (InputKind.CONSTANT, InputKind.PARAMETER):
                continue
            key = weight_key(node_id, index)
            if key is None:
                continue
            size = (inp.tensor.nbytes or 0) if inp.tensor else 0
            if best is None or size > best[0]:
                best = (size, key, inp.tensor, (node_id, index))
    return None if best is None else (best[1], best[2], best[3])


#: Actions whose call's result exists before run time: what a kept call reads from them ships.
_COMPUTED = (Action.FOLD, Action.LIFT)


def _shipped(plan: FoldPlan, region: Sequence[int]) -> Optional[TensorInfo]:
    """The largest value a kept call of the region still reads: a constant (or weight parameter),
    or a result folded now or lifted ahead of run time."""
    nodes, decisions = plan.graph.nodes, plan.decisions
    best: Optional[TensorInfo] = None
    for node_id in region:
        if decisions[node_id].action in _COMPUTED:
            continue
        for inp in nodes[node_id].inputs:
            if inp.kind in (InputKind.CONSTANT, InputKind.PARAMETER):
                info = inp.tensor
            elif inp.kind is InputKind.NODE and decisions[inp.source].action in _COMPUTED:
                outputs = nodes[inp.source].outputs
                info = outputs[0] if outputs else None
            else:
                continue
            if info is not None and (best is None or (info.nbytes or 0) > (best.nbytes or 0)):
                best = info
    return best


def _mapping(value: object) -> Mapping[str, object]:
    """``value`` as a mapping with string keys, or empty when it is none."""
    if not isinstance(value, Mapping):
        return {}
    return {str(key): item for key, item in cast(Mapping[object, object], value).items()}


def ledger_payload(
    rows: Sequence[LedgerRow], previous: Optional[Mapping[str, object]] = None
) -> Dict[str, object]:
    """The attribute's value: ``{"version": 1, "rows": {key: row}}``, over ``previous`` rows.

    Only strings, integers and lists of integers, so it survives ``save_json`` / ``load_json``.
    """
    merged: Dict[str, object] = dict(_mapping(previous.get("rows")) if previous else {})
    for row in rows:
        merged[row.key] = row.to_dict()
    return {"version": LEDGER_VERSION, "rows": merged}


def ledger_rows_from_payload(payload: Optional[Mapping[str, object]]) -> List[LedgerRow]:
    """The rows of an attribute read back (plain Python containers), in key order."""
    rows = _mapping(payload.get("rows")) if payload is not None else {}
    return [LedgerRow.from_dict(key, _mapping(rows[key])) for key in sorted(rows)]


def name_layers(
    rows: Sequence[LedgerRow], layers: Mapping[Tuple[str, str], str]
) -> List[LedgerRow]:
    """``rows`` with each empty ``layer`` filled from ``layers`` (``(function, label) -> name``).

    The command line knows the model's layers (an ONNX node's name); the library does not.
    """
    return [
        replace(row, layer=layers.get((row.function, row.label), "")) if not row.layer else row
        for row in rows
    ]
