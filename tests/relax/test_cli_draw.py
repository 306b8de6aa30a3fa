"""``fold-guard draw`` opened in a real headless Chromium (Debian's, driven by Playwright).

    qdq_cnn.onnx ──draw -o plan.svg──▶ one box per call, coloured by decision, barriers thick
    qdq_cnn.onnx ──draw -o plan.html─▶ run-time chains collapsed; click: details
    resnet50.onnx ──draw -o plan.html─▶ loads without console errors; a search brings a layer into
        view; "kept" shows exactly the kept calls; screenshots of a sane size

The command runs in this process (``support.inprocess.run_cli``): the drawing is what is tested
here, and test_cli.py runs the command as a process. ``scripts/test.sh`` installs ``chromium``
when it is missing; Playwright only drives it (its own browser download, ``playwright install``,
is never used).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections import Counter
from pathlib import Path

import onnx
import pytest
from _common import onnx_models as om
from playwright.sync_api import sync_playwright
from support.chromium import CHROMIUM, CHROMIUM_ARGS
from support.inprocess import run_cli

import fold_guard.relax as fgr
from fold_guard.cli._categories import CATEGORIES, GROUPS, category_of

VIEWPORT = {"width": 1400, "height": 900}


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def browser():
    assert os.path.exists(CHROMIUM), (
        "chromium is missing: scripts/test.sh installs it (apt-get install chromium)"
    )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("draw") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(path))
    return path


def draw(model: Path, out: Path, *policy: str) -> None:
    """``fold-guard draw MODEL -o OUT [-p POLICY ...]``, in this process (the picture is the test)."""
    args = ["draw", str(model), "-o", str(out)]
    for name in policy:
        args += ["-p", name]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr


def open_page(browser, path: Path):
    page = browser.new_page(viewport=VIEWPORT)
    problems = []
    page.on(
        "console",
        lambda message: problems.append(message.text) if message.type == "error" else None,
    )
    page.on("pageerror", lambda error: problems.append(str(error)))
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems, requests


def png_size(path: Path):
    """(width, height) from a PNG's header."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def visible_ids(page, selector: str):
    return page.locator(selector).evaluate_all(
        "nodes => nodes.filter(n => getComputedStyle(n).display !== 'none')"
        ".map(n => n.dataset.id || ('chain ' + n.dataset.members))"
    )


@pytest.mark.slow
def test_svg_has_a_box_per_call_coloured_by_decision(browser, cnn, tmp_path):
    out = tmp_path / "plan.svg"
    draw(cnn, out, "keep-qdq-weights")
    plan = fgr.plan(om.import_relax(onnx.load(str(cnn))), "keep-qdq-weights")
    page, problems, requests = open_page(browser, out)
    boxes = page.locator("g.node")
    assert boxes.count() == len(plan.decisions) == 55
    shown = boxes.evaluate_all(
        "nodes => nodes.map(n => [Number(n.dataset.id), n.dataset.category, "
        "getComputedStyle(n.querySelector('rect')).fill])"
    )
    for node_id, category, fill in shown:
        expected = category_of(plan.decisions[node_id].reason)
        assert category == expected, node_id
        assert fill == _rgb(CATEGORIES[expected][1]), (node_id, fill)
    assert Counter(category for _, category, _ in shown) == {
        "kept_by_rule": 10,
        "kept_with_input": 5,
        "not_constant": 40,
    }
    legend = page.locator("g.legend-item").all_text_contents()
    assert legend == [text for text, _ in CATEGORIES.values()]
    title = page.locator("g.node[data-id='2'] > title").text_content()
    assert title.startswith(
        "main/lv2 = relax.dequantize  [layer conv0: conv0.weight_DequantizeLinear]"
    )
    assert "kept by policy [keep-dequantize-of-integer-constant]" in title
    assert "constant int8[8, 3, 3, 3] (216 B)" in title
    assert problems == [] and all(url.startswith("file://") for url in requests), requests
    page.close()


@pytest.mark.slow
def test_barriers_and_folds_are_drawn(browser, cnn, tmp_path):
    """An annotated module: every barrier is a thick-outlined red box; default folds show sizes."""
    annotated = tmp_path / "annotated.json"
    result = run_cli(
        "fold", str(cnn), "-p", "qdq-accelerator", "--annotate", "-o", str(annotated), "-q"
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "annotated.svg"
    draw(annotated, out)
    page, problems, _ = open_page(browser, out)
    barriers = page.locator("g.node.barrier")
    assert barriers.count() == 10
    widths = barriers.evaluate_all(
        "nodes => nodes.map(n => getComputedStyle(n.querySelector('rect')).strokeWidth)"
    )
    assert set(widths) == {"4px"}
    assert set(barriers.evaluate_all("nodes => nodes.map(n => n.dataset.category)")) == {
        "kept_by_barrier"
    }
    assert page.locator("g.node").count() == 65 and problems == []
    page.close()

    folded = tmp_path / "default.svg"
    draw(cnn, folded, "default")
    page, problems, _ = open_page(browser, folded)
    assert page.locator("g.node.folded").count() == 15 and problems == []
    # A 16x8x3x3 fp32 weight, its size in full.
    assert "→ const 4.50 KiB" in page.locator("g.node[data-id='12']").text_content()
    page.close()


@pytest.mark.slow
def test_html_collapses_runtime_chains_and_shows_details_on_click(browser, cnn, tmp_path):
    out = tmp_path / "plan.html"
    draw(cnn, out, "keep-qdq-weights")
    plan = fgr.plan(om.import_relax(onnx.load(str(cnn))), "keep-qdq-weights")
    page, problems, requests = open_page(browser, out)
    singles = page.locator("g.node:not(.chain)")
    chains = page.locator("g.node.chain")
    members = chains.evaluate_all(
        "nodes => nodes.map(n => n.dataset.members.split(',').map(Number))"
    )
    ids = singles.evaluate_all("nodes => nodes.map(n => Number(n.dataset.id))")
    # Every call is drawn exactly once; chains hold only run-time calls, each the one user of
    # the call before it.
    assert sorted(ids + [i for chain in members for i in chain]) == list(range(55))
    assert all(len(chain) > 1 for chain in members) and len(members) < 15
    for chain in members:
        assert {category_of(plan.decisions[i].reason) for i in chain} == {"not_constant"}
    page.click("g.node[data-id='2']")
    details = page.locator("#details")
    assert details.is_visible()
    text = details.inner_text()
    assert (
        "main/lv2 = relax.dequantize" in text
        and "layer conv0: conv0.weight_DequantizeLinear" in text
    )
    assert "kept by policy [keep-dequantize-of-integer-constant]" in text
    page.locator("g.node.chain").first.click()
    assert "run-time calls:" in details.inner_text()
    assert problems == [] and all(url.startswith("file://") for url in requests), requests
    page.close()


@pytest.mark.slow
def test_resnet50_page_search_filter_and_screenshots(browser, tmp_path):
    from support.resnet50 import write_resnet50

    model = write_resnet50(tmp_path)
    out = tmp_path / "resnet50.html"
    draw(model, out, "keep-qdq-weights")
    page, problems, requests = open_page(browser, out)
    data = json.loads(page.locator("#fold-guard-calls").text_content())
    calls = data["calls"]
    assert len(calls) == 437
    page.screenshot(path=str(tmp_path / "fit.png"))

    # A search for a layer brings its boxes into view and opens its details.
    page.fill("#search", "conv116")
    hits = page.locator("g.node.hit")
    assert hits.count() == 4  # the weight and bias dequantize, the bias reshape, the chain
    canvas = page.locator("#canvas").bounding_box()
    first = page.locator("g.node.hit rect").first.bounding_box()
    for box in (first,):
        assert canvas["x"] <= box["x"] and box["x"] + box["width"] <= canvas["x"] + canvas["width"]
        assert (
            canvas["y"] <= box["y"] and box["y"] + box["height"] <= canvas["y"] + canvas["height"]
        )
        assert box["width"] >= 100  # zoomed so that it can be read
    assert "conv116" in page.locator("#details").inner_text()
    assert page.locator("#matches").inner_text() == "1 of 4"
    page.screenshot(path=str(tmp_path / "search.png"))

    # "kept" shows exactly the kept calls: every one of them, and nothing else.
    page.click("#filter-kept")
    kept = sorted(c["id"] for c in calls if c["category"] in GROUPS["kept"])
    assert len(kept) == 162
    assert sorted(int(i) for i in visible_ids(page, "g.node")) == kept
    # An edge is drawn only between two shown boxes.
    assert page.locator("line.edge").evaluate_all(
        "lines => lines.filter(l => getComputedStyle(l).display !== 'none').every(l => "
        "[l.dataset.from, l.dataset.to].every(b => getComputedStyle("
        "document.querySelector(`g.node[data-box='${b}']`)).display !== 'none'))"
    )
    page.click("#fit")
    page.screenshot(path=str(tmp_path / "kept.png"))
    page.click("#filter-all")
    assert len(visible_ids(page, "g.node")) == page.locator("g.node").count()

    # Zoom changes the scale; sizes are written in full.
    before = page.locator("#viewport").get_attribute("transform")
    page.click("#zoom-in")
    assert page.locator("#viewport").get_attribute("transform") != before
    subtitles = page.locator("g.node text.sub").all_text_contents()
    sizes = [text.split("const ", 1)[1] for text in subtitles if "const " in text]
    assert len(sizes) == 108  # every kept weight and bias dequantize shows its constant bytes
    assert all(re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB)", size) for size in sizes), sizes
    # A 1024x256 int8 weight (256 KiB) with its per-channel scale and zero point: once "const 261".
    assert "261 KiB" in sizes

    for name in ("fit.png", "search.png", "kept.png"):
        shot = tmp_path / name
        assert png_size(shot) == (VIEWPORT["width"], VIEWPORT["height"])
        assert 20_000 < shot.stat().st_size < 5_000_000, (name, shot.stat().st_size)
    assert problems == [] and all(url.startswith("file://") for url in requests), requests
    page.close()
