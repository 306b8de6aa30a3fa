"""``fold-guard draw -o plan.html``: the interactive page around :mod:`._draw`'s graph.

A headline with the plan's counts, filters by decision group and category, search, zoom, pan and
a details panel, in one self-contained file: styles, script and data are written into it, so it
opens offline and fetches nothing.
"""

from __future__ import annotations

import html
import json
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .._core.planner import FoldPlan
from .._core.summary import format_bytes
from ._categories import CATEGORIES, GROUPS, category_of
from ._draw import Overlay, call_details, svg_graph, svg_style

__all__ = ["render_html"]


def _counts(report: Mapping[str, Any]) -> Dict[str, int]:
    counts = {key: 0 for key in CATEGORIES}
    for record in report["decisions"]:
        counts[record["category"]] += 1
    return counts


def render_html(
    plan: FoldPlan,
    report: Mapping[str, Any],
    *,
    title: str,
    overlay: Optional[Overlay] = None,
    overlay_legend: Sequence[Tuple[str, str]] = (),
) -> str:
    """The interactive page: headline, filters, search, zoomable graph and a details panel.

    With an ``overlay`` (``draw --backend``) every call shows on its own and those of the
    overlay show their offload (``overlay_legend`` says how)."""
    report = {
        **report,
        "decisions": [
            {**record, "category": category_of(decision.reason)}
            for record, decision in zip(report["decisions"], plan.decisions)
        ],
    }
    svg, _, _ = svg_graph(
        plan, report, title=title, collapse=True, standalone=False, overlay=overlay
    )
    counts = _counts(report)
    groups = {group: sum(counts[c] for c in members) for group, members in GROUPS.items()}
    constants = ""
    if report.get("constant_bytes"):
        cb = report["constant_bytes"]
        constants = (
            f" · constants {format_bytes(cb['before'])} before, {format_bytes(cb['after'])} after"
        )
    headline = (
        f"{report['calls']} calls under policy {report['policy']!r}: {groups['folded']} folded, "
        f"{groups['kept']} kept, {groups['not_constant']} not constant{constants}"
    )
    filters = "".join(
        f'<button class="filter" data-filter="{group}" id="filter-{group.replace("_", "-")}">'
        f"{html.escape(group.replace('_', ' '))} ({groups[group]})</button>"
        for group in GROUPS
    )
    legend = "".join(
        f'<button class="filter legend-item" data-filter="{key}" data-category="{key}">'
        f'<span class="swatch" style="background:{fill}"></span>{html.escape(text)} ({counts[key]})</button>'
        for key, (text, fill) in CATEGORIES.items()
    ) + "".join(
        f'<span class="legend-item"><span class="swatch" style="background:{fill}"></span>'
        f"{html.escape(text)}</span>"
        for text, fill in overlay_legend
    )
    details = [call_details(plan, report, index) for index in range(len(plan.decisions))]
    return _PAGE.format(
        title=html.escape(title),
        headline=html.escape(headline),
        filters=filters,
        legend=legend,
        style=svg_style(),
        svg=svg,
        data=_json_for_html({"calls": details, "groups": GROUPS}),
        summary=_json_for_html({k: v for k, v in report.items() if k != "decisions"}),
    )


def _json_for_html(data: Any) -> str:
    # "</" would end the script element early; JSON allows the escaped form.
    return json.dumps(data).replace("</", "<\\/")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
html,body{{margin:0;height:100%;font-family:sans-serif;font-size:13px;color:#102027}}
body{{display:flex;flex-direction:column}}
header{{background:#eceff1;padding:6px 12px;border-bottom:1px solid #b0bec5}}
header .row{{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin-top:4px}}
button{{font:inherit;padding:2px 8px;border:1px solid #90a4ae;background:#fff;border-radius:3px;cursor:pointer}}
button.active{{background:#1565c0;color:#fff;border-color:#0d47a1}}
.swatch{{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;border:1px solid #37474f}}
#search{{width:260px;padding:2px 6px;font:inherit}}
#matches{{color:#455a64}}
#stage{{flex:1;display:flex;min-height:0}}
#canvas{{flex:1;overflow:hidden;cursor:grab;background:#fafafa}}
#canvas.dragging{{cursor:grabbing}}
#canvas svg{{width:100%;height:100%;display:block}}
#details{{width:420px;overflow:auto;border-left:1px solid #b0bec5;padding:8px 10px;background:#fff;
font-family:monospace;font-size:12px;white-space:pre-wrap;display:none}}
#details.open{{display:block}}
#details a{{color:#1565c0;cursor:pointer;text-decoration:underline}}
{style}
</style></head>
<body>
<header><b>{title}</b> · <span id="headline">{headline}</span>
<div class="row">
<input id="search" type="search" placeholder="find a layer, node, variable or op (Enter: next)">
<span id="matches"></span>
<button id="zoom-in" title="zoom in">+</button><button id="zoom-out" title="zoom out">&#8722;</button>
<button id="fit" title="whole graph">fit</button>
<span>show:</span><button class="filter active" data-filter="all" id="filter-all">all</button>{filters}
</div>
<div class="row">{legend}</div>
</header>
<div id="stage"><div id="canvas">{svg}</div><div id="details"></div></div>
<script type="application/json" id="fold-guard-calls">{data}</script>
<script type="application/json" id="fold-guard-summary">{summary}</script>
<script>
(function () {{
  "use strict";
  var data = JSON.parse(document.getElementById("fold-guard-calls").textContent);
  var svg = document.getElementById("plan");
  var viewport = document.getElementById("viewport");
  var canvas = document.getElementById("canvas");
  var details = document.getElementById("details");
  var boxes = Array.prototype.slice.call(document.querySelectorAll("g.node"));
  var edges = Array.prototype.slice.call(document.querySelectorAll("line.edge"));
  var full = {{w: +svg.getAttribute("width"), h: +svg.getAttribute("height")}};
  svg.removeAttribute("width"); svg.removeAttribute("height"); svg.removeAttribute("viewBox");
  var view = {{x: 0, y: 0, k: 1}};
  function apply() {{
    viewport.setAttribute("transform", "translate(" + view.x + "," + view.y + ") scale(" + view.k + ")");
  }}
  function fit() {{
    var w = canvas.clientWidth, h = canvas.clientHeight;
    view.k = Math.min(w / full.w, h / full.h, 1);
    view.x = (w - full.w * view.k) / 2; view.y = 0; apply();
  }}
  function zoomAt(factor, cx, cy) {{
    var k = Math.max(0.02, Math.min(4, view.k * factor));
    view.x = cx - (cx - view.x) * k / view.k; view.y = cy - (cy - view.y) * k / view.k; view.k = k; apply();
  }}
  function box(el) {{
    return {{x: +el.dataset.x, y: +el.dataset.y, w: +el.dataset.w, h: 34}};
  }}
  function focus(el) {{
    var b = box(el), w = canvas.clientWidth, h = canvas.clientHeight;
    view.k = Math.max(view.k, 1);
    view.x = w / 2 - (b.x + b.w / 2) * view.k; view.y = h / 2 - (b.y + b.h / 2) * view.k; apply();
  }}
  canvas.addEventListener("wheel", function (e) {{
    e.preventDefault();
    var r = canvas.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.2 : 1 / 1.2, e.clientX - r.left, e.clientY - r.top);
  }}, {{passive: false}});
  var drag = null;
  canvas.addEventListener("mousedown", function (e) {{
    drag = {{x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false}};
    canvas.classList.add("dragging");
  }});
  window.addEventListener("mousemove", function (e) {{
    if (!drag) return;
    var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    view.x = drag.vx + dx; view.y = drag.vy + dy; apply();
  }});
  window.addEventListener("mouseup", function () {{
    canvas.classList.remove("dragging");
    setTimeout(function () {{ drag = null; }}, 0);
  }});
  function zoomCentre(factor) {{ zoomAt(factor, canvas.clientWidth / 2, canvas.clientHeight / 2); }}
  document.getElementById("zoom-in").onclick = function () {{ zoomCentre(1.5); }};
  document.getElementById("zoom-out").onclick = function () {{ zoomCentre(1 / 1.5); }};
  document.getElementById("fit").onclick = fit;

  function text(call) {{
    var where = call.layer || "";
    if (call.source && call.source !== call.layer) where += ": " + call.source;
    return call.call + (where ? "\\n  layer " + where : "") + "\\n  " + call.reason +
      (call.rule ? " [" + call.rule + "]" : "") + (call.detail ? "\\n  " + call.detail : "") +
      "\\n  in:  " + call.inputs.join("\\n       ") + "\\n  out: " + call.outputs.join(", ");
  }}
  function show(el) {{
    details.textContent = "";
    var members = el.dataset.members ? el.dataset.members.split(",") : [el.dataset.id];
    if (members.length > 1) {{
      details.appendChild(document.createTextNode(members.length + " run-time calls:\\n\\n"));
    }}
    members.forEach(function (id) {{
      details.appendChild(document.createTextNode(text(data.calls[+id]) + "\\n\\n"));
    }});
    details.classList.add("open");
  }}
  boxes.forEach(function (el) {{
    el.addEventListener("click", function () {{ if (!drag || !drag.moved) show(el); }});
  }});

  var filters = Array.prototype.slice.call(document.querySelectorAll("button.filter"));
  function filter(name) {{
    var wanted = name === "all" ? null : (data.groups[name] || [name]);
    var shown = {{}};
    boxes.forEach(function (el) {{
      var visible = !wanted || wanted.indexOf(el.dataset.category) >= 0;
      el.classList.toggle("out", !visible);
      if (visible) shown[el.dataset.box] = true;
    }});
    edges.forEach(function (line) {{
      line.classList.toggle("out", !(shown[line.dataset.from] && shown[line.dataset.to]));
    }});
    filters.forEach(function (b) {{ b.classList.toggle("active", b.dataset.filter === name); }});
  }}
  filters.forEach(function (b) {{ b.addEventListener("click", function () {{ filter(b.dataset.filter); }}); }});

  var search = document.getElementById("search"), matches = document.getElementById("matches");
  var hits = [], at = -1;
  function find(next) {{
    var q = search.value.trim().toLowerCase();
    boxes.forEach(function (el) {{ el.classList.remove("hit"); }});
    if (!q) {{ hits = []; matches.textContent = ""; return; }}
    if (!next) {{
      // Whole-word matches first: "conv1" finds conv1 before conv10..conv19.
      var exact = boxes.filter(function (el) {{
        return (" " + el.dataset.search + " ").indexOf(" " + q + " ") >= 0;
      }});
      var partial = boxes.filter(function (el) {{
        return exact.indexOf(el) < 0 && el.dataset.search.indexOf(q) >= 0;
      }});
      hits = exact.concat(partial); at = -1;
    }}
    if (!hits.length) {{ matches.textContent = "no match"; return; }}
    at = (at + 1) % hits.length;
    hits.forEach(function (el) {{ el.classList.add("hit"); }});
    if (hits[at].classList.contains("out")) filter("all");
    focus(hits[at]); show(hits[at]);
    matches.textContent = (at + 1) + " of " + hits.length;
  }}
  search.addEventListener("input", function () {{ find(false); }});
  search.addEventListener("keydown", function (e) {{ if (e.key === "Enter") find(true); }});
  fit();
}})();
</script>
</body></html>
"""
