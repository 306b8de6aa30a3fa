"""``fold-guard draw MODEL -o decisions.json``: Model Explorer node data (default lane).

The file is checked against the schema written from Model Explorer's own node-data dataclasses
(``fold_guard/cli/model_explorer_node_data.schema.json``; ``model_explorer`` itself imports its
504 MB adapter, so the real dataclasses are the ``model_explorer`` lane's:
``tests/relax/test_model_explorer.py``), and against the ONNX graph it colours.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import onnx
import pytest
from _common import onnx_models as om
from onnx import TensorProto, helper
from support.inprocess import run_cli

from fold_guard.cli._categories import CATEGORIES
from fold_guard.cli._node_data import LABELS, onnx_explorer_ids

SCHEMA = Path(__file__).resolve().parents[2] / "fold_guard/cli/model_explorer_node_data.schema.json"


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("node-data") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(path))
    return path


def _draw(model: Path, out: Path, *extra: str):
    return run_cli("draw", str(model), "-o", str(out), "-q", *extra)


def test_decisions_validate_and_colour_every_converted_node(cnn_path, tmp_path):
    out = tmp_path / "decisions.json"
    result = _draw(cnn_path, out, "-p", "keep-qdq-weights")
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    model = onnx.load(str(cnn_path))
    graph_id, ids = onnx_explorer_ids(model.graph.name, [n.name for n in model.graph.node])
    assert list(data) == [graph_id] == ["fold_guard_qdq_cnn"]
    results = data[graph_id]["results"]
    assert set(results) <= set(ids)
    # every node the importer turned into calls has a value: all but none here
    assert set(results) == set(ids)
    weights = [
        n.name
        for n in model.graph.node
        if n.name.endswith(("weight_DequantizeLinear", "bias_DequantizeLinear"))
    ]
    assert len(weights) == 10
    for name in weights:
        assert results[name] == {
            "value": "kept: rule keep-dequantize-of-integer-constant",
            "bgColor": CATEGORIES["kept_by_rule"][1],
            "textColor": "#ffffff",
        }
    assert results["conv0"]["value"] == LABELS["not_constant"]
    colours = {entry["bgColor"] for entry in results.values()}
    assert colours == {CATEGORIES["kept_by_rule"][1], CATEGORIES["not_constant"][1]}


def test_default_policy_colours_the_weights_folded(cnn_path, tmp_path):
    out = tmp_path / "d.json"
    assert _draw(cnn_path, out).returncode == 0
    results = json.loads(out.read_text())["fold_guard_qdq_cnn"]["results"]
    assert results["conv0.weight_DequantizeLinear"]["value"] == "folded"
    assert results["conv0.weight_DequantizeLinear"]["bgColor"] == CATEGORIES["folded"][1]


def test_numeric_view_gives_the_bytes_a_fold_adds(cnn_path, tmp_path):
    out = tmp_path / "bytes.json"
    assert _draw(cnn_path, out, "--numeric").returncode == 0
    data = json.loads(out.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    graph = data["fold_guard_qdq_cnn"]
    # conv0's int8[8, 3, 3, 3] weight (216 B) and its fp32[8] scale and int8[8] zero point
    # (40 B) fold to fp32 (864 B)
    assert graph["results"]["conv0.weight_DequantizeLinear"]["value"] == 864 - 216 - 40
    assert [t["value"] for t in graph["thresholds"]] == sorted(
        t["value"] for t in graph["thresholds"]
    )
    assert "conv0_out_QuantizeLinear" not in graph["results"]  # nothing there folds


def _unnamed_model() -> onnx.ModelProto:
    """Two unnamed nodes and a name used twice: onnx-ir's NameFixPass renames all three."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    nodes = [
        helper.make_node("Exp", ["w"], ["e"]),
        helper.make_node("Add", ["x", "e"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Add", ["r", "e"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unnamed_and_duplicate_nodes_get_the_adapters_ids(tmp_path):
    path = tmp_path / "unnamed.onnx"
    onnx.save(_unnamed_model(), str(path))
    out = tmp_path / "d.json"
    assert _draw(path, out).returncode == 0
    data = json.loads(out.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    # an unnamed graph's id is "": the file is that one graph's data alone
    assert data["results"] == {
        "node": {"value": "folded", "bgColor": CATEGORIES["folded"][1], "textColor": "#ffffff"},
        "add": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
        "node_1": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
        "add_1": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
    }


@pytest.mark.parametrize("suffix", [".json", ".py"])
def test_a_tvm_module_has_no_model_explorer_graph(tmp_path, suffix):
    module = tmp_path / f"mod{suffix}"
    module.write_text("{}" if suffix == ".json" else "")
    out = tmp_path / "d.json"
    result = _draw(module, out)
    assert result.returncode == 2
    assert "TVM module: it has no Model Explorer graph" in result.stderr
    assert not out.exists()


def test_a_failed_draw_writes_nothing(cnn_path, tmp_path):
    out = tmp_path / "d.json"
    result = _draw(cnn_path, out, "-p", "no-such-policy")
    assert result.returncode == 2 and not out.exists()
    result = _draw(cnn_path, tmp_path / "d.html", "--numeric")
    assert result.returncode == 2 and "--numeric" in result.stderr
    assert list(tmp_path.iterdir()) == []
