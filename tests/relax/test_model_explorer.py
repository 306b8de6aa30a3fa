"""``fold-guard draw -o nodes.json`` against Google's Model Explorer itself (the ``model_explorer`` lane).

Model Explorer is installed into a venv of its own (``ai-edge-model-explorer`` pulls its 128 MB
adapter wheel, 504 MB unpacked, and Flask; ``model-explorer-onnx``; Pillow to read pixels):
``$FOLD_GUARD_MODEL_EXPLORER_VENV``, else ``.venv-model-explorer`` in the repository, made once
and reused while it holds these pins. Run the lane with ``bash scripts/test.sh model-explorer``
(or ``.venv/bin/python -m pytest -m model_explorer tests/relax/test_model_explorer.py``); the
full lane leaves it out.

qdq_cnn.onnx / resnet50.onnx / int8.tflite ──draw -p keep-qdq-weights -o nodes.json──▶ nodes.json
  ──the real adapter (model_explorer_onnx; the built-in C++ TFLite adapter)──▶ its node ids:
    every key of nodes.json is one, every decided node has one
resnet50.onnx + nodes.json ──model-explorer --no_open_in_browser──▶ headless Chromium:
    Model Explorer's own per-label counts equal the file's, and the screenshot of the expanded
    graph shows each colour the file uses
"""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from _common import onnx_models as om
from _common.tflite_models import make_quantized_tflite_model
from playwright.sync_api import sync_playwright
from support.chromium import CHROMIUM, CHROMIUM_ARGS
from support.inprocess import run_cli
from support.resnet50 import write_resnet50

pytestmark = [pytest.mark.model_explorer, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support" / "model_explorer_ids.py"
PINS = {
    "ai-edge-model-explorer": "0.1.34",
    "ai-edge-model-explorer-adapter": "0.2.1",
    "model-explorer-onnx": "0.4.2",
    "pillow": "12.3.0",
}
VIEWPORT = {"width": 1600, "height": 1000}
#: What the adapters add beside the model's own nodes: graph inputs and outputs
IO_LABELS = {"Input", "Output", "GraphInputs", "GraphOutputs"}


def _venv() -> Path:
    return Path(os.environ.get("FOLD_GUARD_MODEL_EXPLORER_VENV", ROOT / ".venv-model-explorer"))


def _has_pins(python: Path) -> bool:
    if not python.exists():
        return False
    check = (
        "import importlib.metadata as m, sys; "
        f"sys.exit(any(m.version(n) != v for n, v in {PINS!r}.items()))"
    )
    return subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def explorer() -> Path:
    """The Model Explorer venv's bin directory (made and installed once: about a minute)."""
    venv = _venv()
    python = venv / "bin" / "python"
    if not _has_pins(python):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pins = [f"{name}=={version}" for name, version in PINS.items()]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True, timeout=1800)
        assert _has_pins(python)
    return venv / "bin"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("model-explorer")
    cnn = folder / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(cnn))
    tflite = folder / "int8.tflite"
    tflite.write_bytes(make_quantized_tflite_model(0).buffer)
    return {"qdq_cnn": cnn, "resnet50": write_resnet50(folder), "tflite": tflite}


def _draw(model: Path, *policy: str) -> dict:
    out = model.with_suffix(".nodes.json")
    result = run_cli("draw", str(model), "-o", str(out), "-q", *policy)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def _adapter_view(explorer: Path, model: Path) -> dict:
    out = model.with_suffix(".nodes.json")
    result = subprocess.run(
        [str(explorer / "python"), str(SUPPORT), str(model), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", ["qdq_cnn", "resnet50", "tflite"])
@pytest.mark.parametrize("policy", ["keep-qdq-weights", "default"])
def test_every_key_is_a_node_of_the_real_adapters_graph(explorer, models, name, policy):
    data = _draw(models[name], "-p", policy)
    view = _adapter_view(explorer, models[name])
    graphs = view["graphs"]
    assert len(data) == 1 and set(data) <= set(graphs)
    (graph_id,) = data
    nodes = {node["id"]: node for node in graphs[graph_id]}
    results = data[graph_id]["results"]
    # every key of our file is a node id of the adapter's graph
    assert set(results) <= set(nodes), sorted(set(results) - set(nodes))[:10]
    # every decided node has a key: each operator (every one of these models' operators
    # converts to Relax calls), and each constant the Relax module holds as the file does
    operators = {i for i, n in nodes.items() if n["label"] not in IO_LABELS | _CONSTANT_LABELS}
    assert {key for key in results if nodes[key]["label"] not in _CONSTANT_LABELS} == operators
    constants = {key for key in results if nodes[key]["label"] in _CONSTANT_LABELS}
    if name == "tflite":
        # the four weight and bias tensors; flatten/shape is a static shape, no constant in Relax
        assert sorted(nodes[key]["tensors"][0] for key in constants) == [
            "conv/bias",
            "conv/weight",
            "fc/bias",
            "fc/weight",
        ]
    else:
        # the initializers of each DequantizeLinear of a constant (weight, scale, zero point)
        graph = onnx.load(str(models[name]), load_external_data=False).graph
        inits = {init.name for init in graph.initializer}
        expected = {
            f"[value] {i}"
            for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits
            for i in n.input
            if i in inits
        }
        assert constants == expected and len(expected) % 3 == 0
    # Model Explorer's own dataclasses read the file back unchanged
    for field, value in data[graph_id].items():
        assert view["roundtrip"][graph_id][field] == value


#: The labels the adapters give constant nodes (ONNX initializers, TFLite constant tensors)
_CONSTANT_LABELS = {"Initializer", "pseudo_const"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(explorer: Path, model: Path, nodes: Path, log: Path) -> tuple:
    """Start Model Explorer's server on the model and its node data; return it and its URL."""
    command = [
        str(explorer / "model-explorer"),
        str(model),
        "--extensions=model_explorer_onnx",
        f"--node_data_paths={nodes}",
        "--no_open_in_browser",
        "--host=127.0.0.1",
        f"--port={_free_port()}",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if line.startswith("http://127.")]
        if lines:
            return server, lines[0]
        if server.poll() is not None:
            break
        time.sleep(0.5)
    server.terminate()
    raise AssertionError(f"Model Explorer's server did not start:\n{log.read_text()}")


#: The side panel's "Root-level nodes stats": header cells and rows of the table whose headers
#: are the label counts ("#<label>", after the node-data source's index)
_STATS = """() => {
  for (const table of document.querySelectorAll('table')) {
    const heads = [...table.querySelectorAll('th')].map(th => th.innerText.trim());
    if (heads.some(h => h.includes('#'))) {
      const rows = [...table.querySelectorAll('tr')]
        .map(tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))
        .filter(cells => cells.length);
      return {heads, rows};
    }
  }
  return null;
}"""


def test_model_explorer_shows_every_decided_node_coloured(explorer, models, tmp_path):
    """The Done-when: ``draw resnet50.onnx -p keep-qdq-weights -o nodes.json`` opened in Model
    Explorer. Its side panel counts, per label, the nodes it coloured: the file's counts (so every
    key met its node); the screenshot of the expanded graph holds each colour the file uses."""
    model = models["resnet50"]
    data = _draw(model, "-p", "keep-qdq-weights")
    nodes = model.with_suffix(".nodes.json")
    results = data["resnet50"]["results"]
    wanted = collections.Counter(result["value"] for result in results.values())
    colours = sorted({result["bgColor"] for result in results.values()})
    assert len(colours) == 3  # kept by the rule, kept because an input was, not constant
    server, url = _serve(explorer, model, nodes, tmp_path / "server.log")
    shot = tmp_path / "model_explorer.png"
    try:
        assert os.path.exists(CHROMIUM), "scripts/test.sh installs chromium (apt)"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url)
            page.wait_for_selector(".expand-all", timeout=120_000)
            page.wait_for_function(_STATS, timeout=120_000)
            stats = page.evaluate(_STATS)
            page.click(".expand-all")
            page.wait_for_timeout(3000)
            box = page.locator("canvas").first.bounding_box()
            # zoom in on the top of the graph until its nodes are tens of pixels wide
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 110)
            for _ in range(4):
                page.keyboard.down("Control")
                page.mouse.wheel(0, -100)
                page.keyboard.up("Control")
                page.wait_for_timeout(200)
            page.wait_for_timeout(2000)
            page.screenshot(path=str(shot), clip=box)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    counts = _label_counts(stats, "resnet50")
    assert counts == dict(wanted), (counts, dict(wanted))
    seen = subprocess.run(
        [str(explorer / "python"), str(SUPPORT), "--colours", str(shot), *colours],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0, seen.stderr
    pixels = json.loads(seen.stdout)
    # each colour fills at least a few nodes of the graph (the side panel is outside the clip)
    assert all(n >= 500 for n in pixels.values()), (pixels, shot)


def _label_counts(stats: dict, group: str) -> dict:
    """``{label: count}`` of ``group``'s row in the side panel's stats table."""
    assert stats is not None, "Model Explorer showed no node-data stats"
    heads = stats["heads"]
    # a count column is headed "<source index>\n#<label>"; the row-index column "#" and arrows
    labels = {
        i: m.group(1).strip()
        for i, head in enumerate(heads)
        if (m := re.fullmatch(r"\d+\s*#(.+)", head, re.S))
    }
    (row,) = [cells for cells in stats["rows"] if group in cells]
    offset = len(heads) - len(row)  # a header cell without a data cell (the row index)
    return {label: int(row[i - offset]) for i, label in labels.items() if int(row[i - offset])}
