"""``fold-guard draw``: the dataflow graph of a plan as a self-contained SVG or HTML page.

Every call is one box coloured by its decision (:data:`CATEGORIES`); an edge joins a call to each
call it reads. Barriers are drawn as a thick bar-shaped box, allows with a dashed outline; a
call's constant inputs and a folded call's result show their size. Hovering a box shows its
reason, rule, layer and shapes (an SVG ``<title>``, and in the HTML page an info panel).

Nothing is fetched: the styles and the few lines of script are written into the file, so it
opens offline. The layout is a plain layered one (a call sits one row below its deepest input,
in graph order within a row), which is linear in the number of calls and edges.

This module reads the plan and its summary only; it imports no TVM.
"""

from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .._core.graph import Annotation, InputKind
from .._core.planner import FoldPlan
from .._core.reasons import Reason
from .._core.summary import tensor_text

__all__ = ["CATEGORIES", "category_of", "render_html", "render_svg"]

#: Decision category -> (legend text, fill colour). Order is the legend's.
CATEGORIES: Dict[str, Tuple[str, str]] = {
    "folded": ("folded", "#2e7d32"),
    "kept_by_barrier": ("kept by a barrier", "#c62828"),
    "kept_by_rule": ("kept by a rule", "#ef6c00"),
    "kept_with_input": ("kept because an input was kept", "#ffcc80"),
    "not_constant": ("not constant", "#cfd8dc"),
    "unsupported": ("cannot be evaluated (unsupported, impure, dynamic shape, failed)", "#8e24aa"),
}

_BY_REASON = {
    Reason.FOLDED: "folded",
    Reason.KEPT_BY_BARRIER: "kept_by_barrier",
    Reason.KEPT_BY_POLICY: "kept_by_rule",
    Reason.OVER_BUDGET: "kept_by_rule",  # the max_fold_bytes rule
    Reason.KEPT_WITH_INPUT: "kept_with_input",
    Reason.NOT_CONSTANT: "not_constant",
}

_BOX_W, _BOX_H, _GAP_X, _GAP_Y, _MARGIN, _LEGEND_W = 168, 34, 18, 26, 16, 330


def category_of(reason: Reason) -> str:
    """The drawing category of a decision's reason (impure, dynamic shape, ... are "unsupported")."""
    return _BY_REASON.get(reason, "unsupported")


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / 1024 / 1024:.1f} MiB"


def _layout(plan: FoldPlan) -> List[Tuple[int, int]]:
    """(row, column) per node: below all its inputs and just above its first user, columns in order.

    Rows first go one below the deepest input; then, from the end, each call with users moves
    down to just above its nearest user, so a weight's constant chain sits beside the layer that
    reads it rather than at the top of the picture.
    """
    rows: List[int] = []
    for node in plan.graph.nodes:
        depth = [rows[inp.source] + 1 for inp in node.inputs if inp.kind is InputKind.NODE]
        rows.append(max(depth, default=0))
    users = plan.graph.consumers()
    for node in reversed(plan.graph.nodes):
        if users[node.id]:
            rows[node.id] = max(rows[node.id], min(rows[user] for user in users[node.id]) - 1)
    columns: Dict[int, int] = {}
    places = []
    for row in rows:
        places.append((row, columns.get(row, 0)))
        columns[row] = columns.get(row, 0) + 1
    return places


def _hover(plan: FoldPlan, index: int, layer: Optional[str]) -> str:
    node, decision = plan.graph.nodes[index], plan.decisions[index]
    lines = [
        f"{node.function}/{decision.label} = {decision.op}"
        + (f"  [layer {layer}]" if layer else "")
    ]
    lines.append(f"{decision.reason.text}" + (f" [{decision.rule}]" if decision.rule else ""))
    if decision.detail:
        lines.append(decision.detail)
    inputs = (
        f"{inp.kind.value} {'' if inp.label == 'const' else inp.label + ' '}{tensor_text(inp.tensor)}"
        for inp in node.inputs
    )
    lines.append("in: " + ", ".join(inputs))
    lines.append("out: " + ", ".join(tensor_text(out) for out in node.outputs))
    return "\n".join(lines)


def _caption(plan: FoldPlan, index: int, layer: Optional[str]) -> Tuple[str, str]:
    node, decision = plan.graph.nodes[index], plan.decisions[index]
    op = decision.op.rsplit(".", 1)[-1]
    name = layer or decision.label
    top = f"{op} · {name}"
    const = sum(
        inp.tensor.nbytes or 0
        for inp in node.inputs
        if inp.kind is InputKind.CONSTANT and inp.tensor
    )
    result = sum(out.nbytes or 0 for out in node.outputs)
    parts = [tensor_text(node.outputs[0]) if node.outputs else ""]
    if decision.reason is Reason.FOLDED and result:
        parts = [f"→ const {_size(result)}"]
    elif const:
        parts.append(f"const {_size(const)}")
    return (top[:28] + "…" if len(top) > 29 else top), " ".join(p for p in parts if p)[:34]


def render_svg(plan: FoldPlan, layers: Mapping[Tuple[str, str], str], *, title: str = "") -> str:
    """The plan's graph as a standalone SVG document (styles inside, no script)."""
    return _svg(plan, layers, title=title, standalone=True)


def _svg(
    plan: FoldPlan, layers: Mapping[Tuple[str, str], str], *, title: str, standalone: bool
) -> str:
    places = _layout(plan)
    n_rows = 1 + max((row for row, _ in places), default=0)
    n_cols = 1 + max((col for _, col in places), default=0)
    legend_h = 28 + 20 * (len(CATEGORIES) + 2)
    width = _MARGIN * 2 + max(n_cols * (_BOX_W + _GAP_X), _LEGEND_W)
    top = _MARGIN + legend_h + 10
    height = top + n_rows * (_BOX_H + _GAP_Y) + _MARGIN

    def xy(index: int) -> Tuple[int, int]:
        row, col = places[index]
        return _MARGIN + col * (_BOX_W + _GAP_X), top + row * (_BOX_H + _GAP_Y)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<style>{_svg_style()}</style>" if standalone else "",
        f"<title>{html.escape(title)}</title>" if title else "",
        _legend(),
        '<g class="edges">',
    ]
    for node in plan.graph.nodes:
        x2, y2 = xy(node.id)
        for inp in node.inputs:
            if inp.kind is InputKind.NODE:
                x1, y1 = xy(inp.source)
                out.append(
                    f'<line class="edge" data-from="{inp.source}" data-to="{node.id}" '
                    f'x1="{x1 + _BOX_W // 2}" y1="{y1 + _BOX_H}" x2="{x2 + _BOX_W // 2}" y2="{y2}"/>'
                )
    out.append('</g><g class="nodes">')
    for node, decision in zip(plan.graph.nodes, plan.decisions):
        x, y = xy(node.id)
        layer = layers.get((node.function, node.label))
        category = category_of(decision.reason)
        shape = {Annotation.BARRIER: " barrier", Annotation.ALLOW: " allow"}.get(
            node.annotation, ""
        )
        first, second = _caption(plan, node.id, layer)
        fill = CATEGORIES[category][1]
        out.append(
            f'<g class="node {category}{shape}" data-id="{node.id}" data-category="{category}" '
            f'data-reason="{decision.reason.name.lower()}" data-hover="{html.escape(_hover(plan, node.id, layer))}">'
            f"<title>{html.escape(_hover(plan, node.id, layer))}</title>"
            f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="{2 if shape else 5}" fill="{fill}"/>'
            f'<text x="{x + 6}" y="{y + 14}">{html.escape(first)}</text>'
            f'<text class="sub" x="{x + 6}" y="{y + 27}">{html.escape(second)}</text></g>'
        )
    out.append("</g></svg>")
    return "".join(part for part in out if part)


def _legend() -> str:
    items = ['<g class="legend"><text class="legend-title" x="16" y="30">decision</text>']
    y = 42
    for key, (text, fill) in CATEGORIES.items():
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


def _svg_style() -> str:
    dark = ("folded", "kept_by_barrier", "unsupported")
    return (
        ".edge{stroke:#78909c;stroke-width:1}"
        ".node rect{stroke:#37474f;stroke-width:1}"
        ".node text{fill:#102027}"
        + "".join(f".node.{key} text{{fill:#fff}}" for key in dark)
        + ".node .sub{font-size:10px;opacity:.85}"
        ".node.barrier rect,.barrier-key{stroke:#000;stroke-width:4}"
        ".node.allow rect,.allow-key{stroke:#000;stroke-width:2;stroke-dasharray:5 3}"
        ".node:hover rect{stroke:#1565c0;stroke-width:3}"
        ".legend-title{font-weight:bold;font-size:12px}"
    )


def render_html(
    plan: FoldPlan,
    layers: Mapping[Tuple[str, str], str],
    summary: Mapping[str, Any],
    *,
    title: str,
) -> str:
    """A page with the counts, the SVG and an info panel following the pointer's box."""
    counts = ", ".join(
        f"{n} {key.replace('_', ' ')}" for key, n in summary["counts"]["by_reason"].items()
    )
    head = f"{summary['calls']} calls under policy {summary['policy']!r}: {counts}"
    bytes_line = ""
    if summary.get("constant_bytes"):
        cb = summary["constant_bytes"]
        bytes_line = f" · constants {cb['before']} bytes before, {cb['after']} after"
    svg = _svg(plan, layers, title=title, standalone=False)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{margin:0;font-family:sans-serif;font-size:13px;color:#102027}}
header{{position:sticky;top:0;background:#eceff1;padding:8px 16px;border-bottom:1px solid #b0bec5;z-index:1}}
#info{{position:fixed;right:12px;top:48px;max-width:460px;white-space:pre-wrap;background:#fff;
border:1px solid #90a4ae;padding:8px;font-family:monospace;font-size:12px;display:none;z-index:2}}
{_svg_style()}
</style></head>
<body><header><b>{html.escape(title)}</b> · {html.escape(head)}{html.escape(bytes_line)}</header>
<div id="info"></div>
<main>{svg}</main>
<script>
// The panel repeats the box's hover text, which a <title> tooltip shows only after a delay.
(function () {{
  var info = document.getElementById("info");
  document.querySelectorAll("g.node").forEach(function (node) {{
    node.addEventListener("mouseenter", function () {{
      info.textContent = node.getAttribute("data-hover");
      info.style.display = "block";
    }});
    node.addEventListener("mouseleave", function () {{ info.style.display = "none"; }});
  }});
}})();
</script>
<script type="application/json" id="fold-guard-summary">{_json_for_html(summary)}</script>
</body></html>
"""


def _json_for_html(summary: Mapping[str, Any]) -> str:
    # "</" would end the script element early; JSON allows the escaped form.
    light = {key: value for key, value in summary.items() if key != "decisions"}
    return json.dumps(light).replace("</", "<\\/")
