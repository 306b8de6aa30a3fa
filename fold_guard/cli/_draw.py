"""``fold-guard draw``: the dataflow graph of a plan as a self-contained HTML page or SVG.

Every call is a box coloured by its decision (:data:`._categories.CATEGORIES`); an edge joins a
call to each call it reads. Barriers are drawn with a thick outline, allows with a dashed one; a
call with constant inputs shows their size, a folded call the size of its result (never cut).

The HTML page (:mod:`._page`) is for a real model (ResNet-50: 437 calls, 275 of them run-time only):

- a *run-time chain* (calls that read only run-time values, each the only user of the one
  before, with the weights of one layer at most) is one box: ResNet-50's 275 run-time calls
  become 69 boxes, about one per layer, each with its weights beside it;
- search by layer, node, variable or op (Enter goes to the next match), zoom (wheel, buttons),
  pan (drag), "fit";
- a filter by decision (the headline's groups and the legend's categories);
- details of a call, or of a chain's calls, on click.

The SVG is the static picture: one box per call, details in each box's ``<title>``.

Nothing is fetched: styles and script are written into the file, so it opens offline. The layout
is layered (a box sits one row below its deepest input; constant chains move down to just above
their first user, beside the layer that reads them), linear in the number of calls and edges.

This module reads the plan and its summary only; it imports no TVM.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._core.graph import SOURCE_KINDS, Annotation, InputKind
from .._core.planner import FoldPlan
from .._core.summary import format_bytes, tensor_text
from ._categories import CATEGORIES, category_of

__all__ = ["Overlay", "call_details", "render_svg", "svg_graph", "svg_style"]

_BOX_H, _GAP_X, _GAP_Y, _MARGIN = 34, 18, 28, 16
_MIN_BOX_W = 120
#: Width of one character of the 11 px sans-serif caption, a little generous so nothing overflows.
_CHAR_W = 6.8


@dataclass
class _Box:
    """One drawn box: a call, or a run-time chain of several."""

    members: List[int]
    title: str
    subtitle: str
    category: str
    annotation: str = ""
    row: int = 0
    x: float = 0.0
    y: float = 0.0
    width: float = _MIN_BOX_W

    @property
    def is_chain(self) -> bool:
        return len(self.members) > 1


def _layer(report: Mapping[str, Any], node_id: int) -> str:
    record = report["decisions"][node_id]
    return record["layer"] or record["label"]


def _call_caption(plan: FoldPlan, report: Mapping[str, Any], index: int) -> Tuple[str, str]:
    node, decision = plan.graph.nodes[index], plan.decisions[index]
    title = f"{decision.op.rsplit('.', 1)[-1]} · {_layer(report, index)}"
    const = sum(
        inp.tensor.nbytes or 0
        for inp in node.inputs
        if inp.kind is InputKind.CONSTANT and inp.tensor
    )
    result = sum(out.nbytes or 0 for out in node.outputs)
    parts = [tensor_text(node.outputs[0]) if node.outputs else ""]
    if category_of(decision.reason) == "folded" and result:
        parts = [f"→ const {format_bytes(result)}"]
    elif const:
        parts.append(f"const {format_bytes(const)}")
    return title, " ".join(part for part in parts if part)


def _chains(plan: FoldPlan, report: Mapping[str, Any]) -> List[List[int]]:
    """Calls grouped into run-time chains (a call alone is a chain of one), in graph order.

    A chain continues while each call is the only user of the one before and reads no other
    run-time value; it holds the constant inputs (weights, biases) of one layer at most, so each
    layer's weights still point at a box of their own.
    """
    nodes = plan.graph.nodes
    users = plan.graph.consumers()
    runtime = [category_of(d.reason) == "not_constant" for d in plan.decisions]

    def node_inputs(index: int, from_runtime: bool) -> List[int]:
        return [
            inp.source
            for inp in nodes[index].inputs
            if inp.kind in SOURCE_KINDS and runtime[inp.source] is from_runtime
        ]

    def weights_layer(index: int) -> Optional[str]:
        return _layer(report, index) if node_inputs(index, False) else None

    chain_of: Dict[int, int] = {}
    chains: List[List[int]] = []
    chain_layer: List[Optional[str]] = []
    for node in nodes:
        before = node_inputs(node.id, True)
        layer = weights_layer(node.id) if runtime[node.id] else None
        if (
            runtime[node.id]
            and len(before) == 1
            and list(users[before[0]]) == [node.id]
            and nodes[before[0]].function == node.function
            and (layer is None or chain_layer[chain_of[before[0]]] in (None, layer))
        ):
            index = chain_of[before[0]]
            chains[index].append(node.id)
            chain_layer[index] = chain_layer[index] or layer
        else:
            index = len(chains)
            chains.append([node.id])
            chain_layer.append(layer)
        chain_of[node.id] = index
    return chains


#: ``draw --backend``: node id -> (fill colour, caption, hover note) of each call a table could
#: take (``._offload.offload_overlay``); the box shows its offload instead of its decision.
Overlay = Mapping[int, Tuple[str, str, str]]


def _boxes(
    plan: FoldPlan, report: Mapping[str, Any], *, collapse: bool, overlay: Optional[Overlay] = None
) -> List[_Box]:
    groups = _chains(plan, report) if collapse else [[node.id] for node in plan.graph.nodes]
    boxes = []
    for members in groups:
        if len(members) == 1:
            index = members[0]
            title, subtitle = _call_caption(plan, report, index)
            if overlay and index in overlay:
                subtitle = overlay[index][1]
            annotation = plan.graph.nodes[index].annotation
            boxes.append(
                _Box(
                    members,
                    title,
                    subtitle,
                    category_of(plan.decisions[index].reason),
                    {Annotation.BARRIER: "barrier", Annotation.ALLOW: "allow"}.get(annotation, ""),
                )
            )
        else:
            first, last = _layer(report, members[0]), _layer(report, members[-1])
            title = first if first == last else f"{first} → {last}"
            ops = [plan.decisions[i].op.rsplit(".", 1)[-1] for i in members]
            boxes.append(
                _Box(
                    members,
                    title,
                    f"{len(members)} run-time calls: {ops[0]} … {ops[-1]}",
                    "not_constant",
                )
            )
    for box in boxes:
        box.width = max(_MIN_BOX_W, 12 + _CHAR_W * max(len(box.title), len(box.subtitle)))
    return boxes


def _layout(plan: FoldPlan, boxes: List[_Box]) -> List[Tuple[int, int]]:
    """Place the boxes (rows, then x within a row); return the edges between boxes."""
    box_of = {member: b for b, box in enumerate(boxes) for member in box.members}
    edges = sorted(
        {
            (box_of[inp.source], box_of[node.id])
            for node in plan.graph.nodes
            for inp in node.inputs
            if inp.kind in SOURCE_KINDS and box_of[inp.source] != box_of[node.id]
        }
    )
    inputs: List[List[int]] = [[] for _ in boxes]
    users: List[List[int]] = [[] for _ in boxes]
    for source, target in edges:
        inputs[target].append(source)
        users[source].append(target)
    # Boxes are in graph order, so every input comes before its users.
    for b, box in enumerate(boxes):
        box.row = max((boxes[i].row + 1 for i in inputs[b]), default=0)
    for b in reversed(range(len(boxes))):
        if users[b]:
            boxes[b].row = max(boxes[b].row, min(boxes[u].row for u in users[b]) - 1)
    next_x: Dict[int, float] = {}
    for box in boxes:
        box.x = next_x.get(box.row, _MARGIN)
        box.y = _MARGIN + box.row * (_BOX_H + _GAP_Y)
        next_x[box.row] = box.x + box.width + _GAP_X
    return edges


def call_details(plan: FoldPlan, report: Mapping[str, Any], index: int) -> Dict[str, Any]:
    """Everything the page shows about one call, sizes in full."""
    node, decision = plan.graph.nodes[index], plan.decisions[index]
    record = report["decisions"][index]

    def tensor(info: Any) -> str:
        size = f" ({format_bytes(info.nbytes)})" if info is not None and info.nbytes else ""
        return tensor_text(info) + size

    return {
        "id": index,
        "call": f"{node.function}/{decision.label} = {decision.op}",
        "layer": record["layer"],
        "source": record.get("source"),
        "category": category_of(decision.reason),
        "reason": decision.reason.text,
        "rule": decision.rule,
        "detail": decision.detail,
        "inputs": [
            f"{inp.kind.value} {'' if inp.label == 'const' else inp.label + ' '}{tensor(inp.tensor)}"
            for inp in node.inputs
        ],
        "outputs": [tensor(out) for out in node.outputs],
    }


def _hover(info: Mapping[str, Any]) -> str:
    where = info["layer"] or ""
    if info["source"] and info["source"] != info["layer"]:
        where = f"{where}: {info['source']}"
    rule = f" [{info['rule']}]" if info["rule"] else ""
    lines = [info["call"] + (f"  [layer {where}]" if where else ""), info["reason"] + rule]
    if info["detail"]:
        lines.append(info["detail"])
    lines.append("in: " + ", ".join(info["inputs"]))
    lines.append("out: " + ", ".join(info["outputs"]))
    return "\n".join(lines)


def _search_text(plan: FoldPlan, report: Mapping[str, Any], members: Sequence[int]) -> str:
    words = []
    for index in members:
        record = report["decisions"][index]
        words += [record["label"], record["op"], record["layer"] or "", record.get("source") or ""]
    return " ".join(word.lower() for word in words if word)


def svg_graph(
    plan: FoldPlan,
    report: Mapping[str, Any],
    *,
    title: str,
    collapse: bool,
    standalone: bool,
    overlay: Optional[Overlay] = None,
) -> Tuple[str, float, float]:
    overlay = overlay or {}
    boxes = _boxes(plan, report, collapse=collapse and not overlay, overlay=overlay)
    edges = _layout(plan, boxes)
    width = max((box.x + box.width for box in boxes), default=0) + _MARGIN
    height = max((box.y + _BOX_H for box in boxes), default=0) + _MARGIN
    infos = [call_details(plan, report, index) for index in range(len(plan.decisions))]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="plan" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="11">',
        f"<style>{svg_style()}</style>" if standalone else "",
        f"<title>{html.escape(title)}</title>" if title else "",
        '<g id="viewport"><g class="edges">',
    ]
    for source, target in edges:
        start, end = boxes[source], boxes[target]
        out.append(
            f'<line class="edge" data-from="{source}" data-to="{target}" '
            f'x1="{start.x + start.width / 2:.0f}" y1="{start.y + _BOX_H:.0f}" '
            f'x2="{end.x + end.width / 2:.0f}" y2="{end.y:.0f}"/>'
        )
    out.append('</g><g class="nodes">')
    for b, box in enumerate(boxes):
        members = ",".join(map(str, box.members))
        if box.is_chain:
            hover = f"{len(box.members)} run-time calls (click for each one):\n" + "\n".join(
                infos[i]["call"] + f"  [{_layer(report, i)}]" for i in box.members
            )
            ident = f'class="node chain not_constant" data-members="{members}"'
        else:
            hover = _hover(infos[box.members[0]])
            if box.members[0] in overlay:
                hover = overlay[box.members[0]][2] + "\n" + hover
            ident = (
                f'class="node {box.category}{" " + box.annotation if box.annotation else ""}" '
                f'data-id="{box.members[0]}"'
            )
        fill = CATEGORIES[box.category][1]
        if not box.is_chain and box.members[0] in overlay:
            fill = overlay[box.members[0]][0]
        out.append(
            f'<g {ident} data-box="{b}" data-category="{box.category}" '
            f'data-search="{html.escape(_search_text(plan, report, box.members))}" '
            f'data-x="{box.x:.0f}" data-y="{box.y:.0f}" data-w="{box.width:.0f}">'
            f"<title>{html.escape(hover)}</title>"
            f'<rect x="{box.x:.0f}" y="{box.y:.0f}" width="{box.width:.0f}" height="{_BOX_H}" '
            f'rx="{2 if box.annotation else 5}" fill="{fill}"/>'
            f'<text x="{box.x + 6:.0f}" y="{box.y + 14:.0f}">{html.escape(box.title)}</text>'
            f'<text class="sub" x="{box.x + 6:.0f}" y="{box.y + 27:.0f}">{html.escape(box.subtitle)}</text></g>'
        )
    out.append("</g></g></svg>")
    return "".join(part for part in out if part), width, height


def render_svg(
    plan: FoldPlan,
    report: Mapping[str, Any],
    *,
    title: str = "",
    overlay: Optional[Overlay] = None,
    overlay_legend: Sequence[Tuple[str, str]] = (),
) -> str:
    """The plan's graph as a standalone SVG document: one box per call, no script. With an
    ``overlay`` (``draw --backend``) its calls show their offload, ``overlay_legend`` says how."""
    svg, width, height = svg_graph(
        plan, report, title=title, collapse=False, standalone=False, overlay=overlay
    )
    legend_h = 24 + 20 * (len(CATEGORIES) + 2 + len(overlay_legend))
    total_w, total_h = max(width, 340), height + legend_h
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
        f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="sans-serif" font-size="11">'
        f"<style>{svg_style()}</style>"
        + (f"<title>{html.escape(title)}</title>" if title else "")
        + _legend(overlay_legend)
        + f'<svg y="{legend_h}" width="{width:.0f}" height="{height:.0f}">'
        + svg.split(">", 1)[1]
        + "</svg>"
    )


def _legend(extra: Sequence[Tuple[str, str]] = ()) -> str:
    items = ['<g class="legend"><text class="legend-title" x="16" y="18">decision</text>']
    y = 28
    for key, (text, fill) in [*(("offload", entry) for entry in extra), *CATEGORIES.items()]:
        items.append(
            f'<g class="legend-item" data-category="{key}"><rect x="16" y="{y}" width="14" height="14" '
            f'fill="{fill}"/><text x="36" y="{y + 11}">{html.escape(text)}</text></g>'
        )
        y += 20
    items.append(
        f'<rect class="barrier-key" x="16" y="{y}" width="14" height="14" fill="none"/>'
        f'<text x="36" y="{y + 11}">fold_barrier (thick outline)</text>'
    )
    y += 20
    items.append(
        f'<rect class="allow-key" x="16" y="{y}" width="14" height="14" fill="none"/>'
        f'<text x="36" y="{y + 11}">fold_allow (dashed outline)</text></g>'
    )
    return "".join(items)


def svg_style() -> str:
    dark = ("folded", "kept_by_barrier", "unsupported")
    return (
        ".edge{stroke:#78909c;stroke-width:1}"
        ".node rect{stroke:#37474f;stroke-width:1}"
        ".node text{fill:#102027}"
        + "".join(f".node.{key} text{{fill:#fff}}" for key in dark)
        + ".node .sub{font-size:10px;opacity:.85}"
        ".node.chain rect{stroke-dasharray:2 2}"
        ".node.barrier rect,.barrier-key{stroke:#000;stroke-width:4}"
        ".node.allow rect,.allow-key{stroke:#000;stroke-width:2;stroke-dasharray:5 3}"
        ".node:hover rect{stroke:#1565c0;stroke-width:3}"
        ".node.hit rect{stroke:#d50000;stroke-width:4}"
        ".node.out,.edge.out{display:none}"
        ".legend-title{font-weight:bold;font-size:12px}"
    )
