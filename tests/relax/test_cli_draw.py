"""``fold-guard draw`` opened in a real headless Chromium (Debian's, driven by Playwright).

    qdq_cnn.onnx ──draw -p keep-qdq-weights──▶ plan.html ──Chromium──▶ 55 boxes, one per call,
        10 orange (kept by a rule), 5 light orange (kept because an input was kept), 40 grey

``scripts/test.sh`` installs ``chromium`` when it is missing; Playwright only drives it (its own
browser download, ``playwright install``, is never used).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest
from _common import onnx_models as om
from playwright.sync_api import sync_playwright

import fold_guard.relax as fgr
from fold_guard.cli._draw import CATEGORIES, category_of

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


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
    args = [sys.executable, "-m", "fold_guard", "draw", str(model), "-o", str(out)]
    for name in policy:
        args += ["-p", name]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def open_page(browser, path: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
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


@pytest.mark.slow
def test_html_plan_in_chromium(browser, cnn, tmp_path):
    out = tmp_path / "plan.html"
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
    # Hover: the panel shows the call's reason, rule, layer and shapes.
    page.hover("g.node[data-id='2']")
    info = page.locator("#info")
    assert info.is_visible()
    text = info.inner_text()
    assert "kept by policy [keep-dequantize-of-integer-constant]" in text
    assert "conv0.weight_DequantizeLinear" in text and "float32[8, 3, 3, 3]" in text
    assert (
        page.locator("g.node[data-id='2'] > title")
        .text_content()
        .startswith("main/lv2 = relax.dequantize")
    )
    page.screenshot(path=str(tmp_path / "plan.png"))
    assert problems == []
    assert all(url.startswith("file://") for url in requests), requests  # nothing from the network
    page.close()


@pytest.mark.slow
def test_barriers_and_folds_are_drawn(browser, cnn, tmp_path):
    """An annotated module: every barrier is a thick-outlined red box; default folds show sizes."""
    annotated = tmp_path / "annotated.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fold_guard",
            "fold",
            str(cnn),
            "-p",
            "qdq-accelerator",
            "--annotate",
            "-o",
            str(annotated),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
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
    green = page.locator("g.node.folded")
    assert green.count() == 15 and problems == []
    assert (
        "→ const 4.5 KiB" in page.locator("g.node[data-id='12']").text_content()
    )  # a 16x8x3x3 fp32 weight
    page.close()
