"""A fold plan as a person reads it: grouped counts first, every decision on request.

One decision per call makes a 1,000-line report on a real model, most of it "not constant".
This module turns a :class:`FoldPlan` (and, when the module was folded, its
:class:`~fold_guard._core.report.FoldReport` measurements) into

* a plain, JSON-ready dictionary (:func:`summarize`), whose layout is the versioned schema the
  ``fold-guard`` command documents (:data:`SCHEMA_NAME`, :data:`SCHEMA_VERSION`): counts by
  action, reason and op, the calls each rule decided, the largest folds, bytes and times, and
  one record per decision with its layer, shapes and dtypes;
* text (:func:`format_summary`), grouped, with one line per decision only when asked.

Layer names are not part of the IR (Relax's ONNX importer names every binding ``lv<N>``), so the
caller passes what it knows as ``layers``: ``(function, label) -> layer name``.

Invariant: everything here is derived from the plan; nothing decides anything.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict, cast

from .graph import FoldNode, TensorInfo
from .planner import FoldDecision, FoldPlan
from .reasons import Action, Reason

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "LayerNames",
    "decision_record",
    "format_bytes",
    "format_decision",
    "format_summary",
    "summarize",
    "tensor_text",
]

SCHEMA_NAME = "fold-guard-report"
#: Bumped on any change a consumer could notice (a key removed or renamed, a meaning changed);
#: adding a key keeps the version.
SCHEMA_VERSION = 1

#: How many of the largest folds, and how many call names per rule, the summary lists.
TOP_FOLDS = 5
NAMES_PER_RULE = 6

LayerNames = Mapping[Tuple[str, str], str]


def format_bytes(nbytes: int) -> str:
    """A byte count as a person reads it: exact below 1 KiB, else three significant digits.

    >>> format_bytes(900), format_bytes(262144), format_bytes(37171), format_bytes(25972172)
    ('900 B', '256 KiB', '36.3 KiB', '24.8 MiB')
    """
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{nbytes} B"
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f} {unit}".replace(".00 ", " ").replace(".0 ", " ")


def tensor_text(tensor: Optional[TensorInfo]) -> str:
    """``float32[1, 8, 16, 16]``; ``?`` for an unknown dim, the dtype alone when not a tensor.

    >>> tensor_text(TensorInfo.of("int8", (8, None)))
    'int8[8, ?]'
    """
    if tensor is None:
        return "?"
    if tensor.shape is None:
        return tensor.dtype
    dims = ", ".join("?" if dim is None else str(dim) for dim in tensor.shape)
    return f"{tensor.dtype}[{dims}]"


class TensorRecord(TypedDict):
    dtype: str
    shape: Optional[List[Optional[int]]]
    nbytes: Optional[int]


class InputRecord(TypedDict):
    kind: str
    label: str
    node: Optional[int]
    tensor: Optional[TensorRecord]


class DecisionRecord(TypedDict):
    """One item of the schema's ``decisions``."""

    id: int
    function: str
    label: str
    layer: Optional[str]
    op: str
    action: str
    reason: str
    reason_text: str
    rule: str
    detail: str
    root: Optional[int]
    annotation: Optional[str]
    inputs: List[InputRecord]
    outputs: List[Optional[TensorRecord]]


class Counts(TypedDict):
    by_action: Dict[str, int]
    by_reason: Dict[str, int]
    by_op: Dict[str, Dict[str, int]]


class RuleRecord(TypedDict):
    rule: str
    folded: int
    kept: int
    lifted: int
    kept_with_input: int
    calls: List[str]


class FoldRecord(TypedDict):
    id: int
    label: str
    layer: Optional[str]
    op: str
    nbytes: int
    outputs: List[str]


class ConstantBytes(TypedDict):
    before: int
    after: int


class Summary(TypedDict):
    """The schema's dictionary, as :func:`summarize` returns it (a plain ``dict`` at run time)."""

    schema: str
    version: int
    policy: str
    calls: int
    counts: Counts
    rules: List[RuleRecord]
    largest_folds: List[FoldRecord]
    constant_bytes: Optional[ConstantBytes]
    seconds: Dict[str, float]
    decisions: List[DecisionRecord]


def _tensor_record(tensor: Optional[TensorInfo]) -> Optional[TensorRecord]:
    if tensor is None:
        return None
    shape = None if tensor.shape is None else list(tensor.shape)
    return {"dtype": tensor.dtype, "shape": shape, "nbytes": tensor.nbytes}


def _output_bytes(node: FoldNode) -> int:
    return sum(out.nbytes or 0 for out in node.outputs)


def decision_record(node: FoldNode, decision: FoldDecision, layer: Optional[str]) -> DecisionRecord:
    """One decision as a JSON-ready dictionary (the ``decisions`` items of the schema)."""
    return {
        "id": decision.node,
        "function": node.function,
        "label": decision.label,
        "layer": layer,
        "op": decision.op,
        "action": decision.action.value,
        "reason": decision.reason.name.lower(),
        "reason_text": decision.reason.text,
        "rule": decision.rule,
        "detail": decision.detail,
        "root": decision.root,
        "annotation": node.annotation.value if node.annotation.value != "none" else None,
        "inputs": [
            {
                "kind": inp.kind.value,
                "label": inp.label,
                "node": inp.node,
                "tensor": _tensor_record(inp.tensor),
            }
            for inp in node.inputs
        ],
        "outputs": [_tensor_record(out) for out in node.outputs],
    }


def summarize(
    plan: FoldPlan,
    *,
    layers: Optional[LayerNames] = None,
    constant_bytes: Optional[Tuple[int, int]] = None,
    seconds: Optional[Mapping[str, float]] = None,
) -> Summary:
    """The plan as the schema's dictionary.

    Parameters
    ----------
    plan : FoldPlan
        The decisions to summarise.
    layers : mapping, optional
        ``(function, label) -> layer name`` for the calls whose layer is known.
    constant_bytes : (int, int), optional
        Bytes of tensor constants before and after folding, when the module was folded.
    seconds : mapping, optional
        Wall time per step of the fold.

    Returns
    -------
    dict
        JSON-ready: ``schema``, ``version``, ``policy``, ``calls``, ``counts`` (``by_action``,
        ``by_reason`` keyed by reason name, ``by_op``), ``rules``, ``largest_folds``,
        ``constant_bytes``, ``seconds`` and ``decisions``.

    Examples
    --------
    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput
    >>> from fold_guard._core.planner import plan_folds
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> t = TensorInfo.of("float32", (4,))
    >>> g = FoldGraph((FoldNode(0, "relax.exp", "e", "main", (NodeInput(InputKind.CONSTANT, "c", t),), (t,)),))
    >>> summarize(plan_folds(g, DEFAULT_POLICY))["counts"]["by_reason"]
    {'folded': 1}
    """
    layers = layers or {}
    nodes = plan.graph.nodes
    layer_of = [layers.get((node.function, node.label)) for node in nodes]
    by_op: Dict[str, Dict[str, int]] = {}
    for decision in plan.decisions:
        ops = by_op.setdefault(decision.op, {})
        key = decision.reason.name.lower()
        ops[key] = ops.get(key, 0) + 1

    def by_size(decision: FoldDecision) -> Tuple[int, int]:
        return -_output_bytes(nodes[decision.node]), decision.node

    def by_count(item: Tuple[str, Dict[str, int]]) -> Tuple[int, str]:
        return -sum(item[1].values()), item[0]

    largest = sorted(plan.folded, key=by_size)[:TOP_FOLDS]
    return {
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "policy": plan.policy_name,
        "calls": len(plan.decisions),
        "counts": {
            "by_action": {
                action.value: sum(d.action is action for d in plan.decisions) for action in Action
            },
            "by_reason": {reason.name.lower(): n for reason, n in plan.count_by_reason().items()},
            "by_op": dict(sorted(by_op.items(), key=by_count)),
        },
        "rules": _rules(plan, layer_of),
        "largest_folds": [
            {
                "id": d.node,
                "label": d.label,
                "layer": layer_of[d.node],
                "op": d.op,
                "nbytes": _output_bytes(nodes[d.node]),
                "outputs": [tensor_text(out) for out in nodes[d.node].outputs],
            }
            for d in largest
        ],
        "constant_bytes": None
        if constant_bytes is None
        else {"before": constant_bytes[0], "after": constant_bytes[1]},
        "seconds": dict(seconds or {}),
        "decisions": [decision_record(n, d, layer_of[n.id]) for n, d in zip(nodes, plan.decisions)],
    }


def _rules(plan: FoldPlan, layer_of: Sequence[Optional[str]]) -> List[RuleRecord]:
    """Per rule (in first-use order): what it folded or kept itself, and what followed from it."""
    rules: Dict[str, RuleRecord] = {}
    for decision in plan.decisions:
        if not decision.rule:
            continue
        entry = rules.setdefault(
            decision.rule,
            {
                "rule": decision.rule,
                "folded": 0,
                "kept": 0,
                "lifted": 0,
                "kept_with_input": 0,
                "calls": [],
            },
        )
        if decision.reason is Reason.KEPT_WITH_INPUT or (
            decision.reason is Reason.KEPT_BY_BARRIER and decision.root is not None
        ):
            # Not this rule's own verdict: a consequence of one upstream.
            entry["kept_with_input"] += 1
            continue
        if decision.action is Action.FOLD:
            entry["folded"] += 1
        elif decision.action is Action.LIFT:
            entry["lifted"] += 1
        else:
            entry["kept"] += 1
        entry["calls"].append(layer_of[decision.node] or decision.label)
    return list(rules.values())


def format_decision(node: FoldNode, decision: FoldDecision, layer: Optional[str] = None) -> str:
    """One verbose line: ``main/lv3 [conv0] = relax.nn.conv2d -> float32[1, 8, 16, 16]: <reason>``."""
    where = f"{node.function}/{decision.label}" if node.function else decision.label
    named = f" [{layer}]" if layer and layer != decision.label else ""
    outputs = ", ".join(tensor_text(out) for out in node.outputs)
    rule = f" [{decision.rule}]" if decision.rule else ""
    detail = f": {decision.detail}" if decision.detail else ""
    return f"{where}{named} = {decision.op} -> {outputs}: {decision.reason.text}{rule}{detail}"


def _names(names: Sequence[str]) -> str:
    # A layer's weight and bias are two calls of one name: name it once.
    unique: List[str] = []
    for name in names:
        if name not in unique:
            unique.append(name)
    names = unique
    shown = ", ".join(names[:NAMES_PER_RULE])
    more = len(names) - NAMES_PER_RULE
    return shown + (f", ... ({more} more)" if more > 0 else "")


def format_summary(plan: FoldPlan, report: Mapping[str, object], *, verbose: bool = False) -> str:
    """The grouped text of :func:`summarize`'s ``summary`` of ``plan``; ``verbose`` adds every decision.

    >>> from fold_guard._core.graph import FoldGraph, FoldNode, InputKind, NodeInput
    >>> from fold_guard._core.planner import plan_folds
    >>> from fold_guard._core.builtin_policies import DEFAULT_POLICY
    >>> t = TensorInfo.of("float32", (4,))
    >>> x = NodeInput(InputKind.RUNTIME, "input", t)
    >>> plan = plan_folds(FoldGraph((FoldNode(0, "relax.exp", "e", "main", (x,), (t,)),)), DEFAULT_POLICY)
    >>> print(format_summary(plan, summarize(plan), verbose=True))
    policy 'default': 1 call: 0 folded, 0 kept, 1 not constant
      by reason: 1 not constant
      by op:     relax.exp 1 (1 not constant)
    decisions:
      main/e = relax.exp -> float32[4]: not constant: 'input' is a run-time input
    """
    # Any mapping in the schema's layout: the command adds its own keys to the dictionary.
    summary = cast(Summary, report)
    counts = summary["counts"]
    calls = summary["calls"]
    # "kept" counts only calls a policy could have folded: those reading a run-time value are
    # their own group (on a real model most calls), not decisions anybody made.
    not_constant = counts["by_reason"].get(Reason.NOT_CONSTANT.name.lower(), 0)
    lifted = counts["by_action"].get("lift", 0)
    lines = [
        f"policy {summary['policy']!r}: {calls} call{'' if calls == 1 else 's'}: "
        f"{counts['by_action']['fold']} folded, {counts['by_action']['keep'] - not_constant} kept, "
        f"{not_constant} not constant"
        + (f", {lifted} lifted ahead of run time (from weight parameters)" if lifted else "")
    ]
    texts = {reason.name.lower(): reason.text for reason in Reason}
    lines.append(
        "  by reason: " + ", ".join(f"{n} {texts[key]}" for key, n in counts["by_reason"].items())
    )
    for index, (op, reasons) in enumerate(counts["by_op"].items()):
        parts = ", ".join(f"{n} {texts[key]}" for key, n in reasons.items())
        lines.append(
            f"  {'by op:' if index == 0 else '':10} {op} {sum(reasons.values())} ({parts})"
        )
    if summary["constant_bytes"] is not None:
        before, after = summary["constant_bytes"]["before"], summary["constant_bytes"]["after"]
        lines.append(f"constants: {format_bytes(before)} before, {format_bytes(after)} after")
    if summary["rules"]:
        lines.append("rules:")
        for rule in summary["rules"]:
            own = (
                ", ".join(
                    f"{verb} {n}"
                    for verb, n in (
                        ("folded", rule["folded"]),
                        ("kept", rule["kept"]),
                        ("lifted", rule["lifted"]),
                    )
                    if n
                )
                or "none itself"
            )
            follow = (
                f" (+{rule['kept_with_input']} kept because an input was)"
                if rule["kept_with_input"]
                else ""
            )
            names = f": {_names(rule['calls'])}" if rule["calls"] else ""
            lines.append(f"  {rule['rule']}: {own}{follow}{names}")
    if summary["largest_folds"]:
        lines.append("largest folds:")
        for fold in summary["largest_folds"]:
            name = fold["layer"] or fold["label"]
            lines.append(
                f"  {name} = {fold['op']} -> {', '.join(fold['outputs'])} ({format_bytes(fold['nbytes'])})"
            )
    if summary["seconds"]:
        steps = ", ".join(
            f"{step} {secs * 1000:.0f} ms" for step, secs in summary["seconds"].items()
        )
        lines.append(f"time: {sum(summary['seconds'].values()) * 1000:.0f} ms ({steps})")
    if verbose:
        lines.append("decisions:")
        layer_of = {record["id"]: record["layer"] for record in summary["decisions"]}
        for node, decision in zip(plan.graph.nodes, plan.decisions):
            lines.append("  " + format_decision(node, decision, layer_of.get(node.id)))
    return "\n".join(lines)
