"""``fold-guard draw MODEL -o decisions.json``: Model Explorer node data (default lane).

Every file is read by Model Explorer's own node-data dataclasses (``model_explorer.
node_data_builder``: they import without the 504 MB adapter, which only the built-in adapters
load; scripts/test.sh installs ``ai-edge-model-explorer`` with ``--no-deps``) through
``support.model_explorer_ids.rebuild``, and checked against the schema written from them
(``fold_guard/cli/model_explorer_node_data.schema.json``, what the wheel ships). The ids are
fold_guard's reading of the adapters' schemes; the ``model_explorer`` lane
(``tests/relax/test_model_explorer.py``) checks them against the real adapters.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import onnx
import pytest
import tvm
from _common import onnx_models as om
from _common.tflite_models import make_quantized_tflite_model
from onnx import TensorProto, helper
from support.inprocess import run_cli
from support.model_explorer_ids import rebuild

from fold_guard.cli._categories import CATEGORIES
from fold_guard.cli._node_data import LABELS, onnx_explorer_ids

SCHEMA = Path(__file__).resolve().parents[2] / "fold_guard/cli/model_explorer_node_data.schema.json"
KEEP_DQ = {
    "value": "kept: rule keep-dequantize-of-integer-constant",
    "bgColor": CATEGORIES["kept_by_rule"][1],
    "textColor": "#ffffff",
}
#: The GraphNodeData fields to_json_string() writes although our file leaves them out (defaults)
DEFAULTS = {
    "thresholds": [],
    "gradient": [],
    "hideInAggregatedStatsTable": False,
    "hideInChildrenStatsTable": False,
    "showExpandedSummaryOnGroupNode": False,
    "showLabelCountColumnsInChildrenStatsTable": False,
}


def validate(data: dict) -> None:
    """``data`` is what Model Explorer's dataclasses read and write back, and matches the schema."""
    ndb = pytest.importorskip(
        "model_explorer.node_data_builder",
        reason="pip install --no-deps ai-edge-model-explorer==0.1.34 (scripts/test.sh does)",
    )
    rebuilt = rebuild(data, ndb)
    graphs = [(data, rebuilt)] if "results" in data else [(data[k], rebuilt[k]) for k in data]
    assert set(rebuilt) == set(data) or "results" in data
    for ours, theirs in graphs:
        assert theirs == {**DEFAULTS, **ours}
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))


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
    validate(data)
    model = onnx.load(str(cnn_path))
    graph_id, ids = onnx_explorer_ids(model.graph.name, [n.name for n in model.graph.node])
    assert list(data) == [graph_id] == ["fold_guard_qdq_cnn"]
    results = data[graph_id]["results"]
    # every node the importer turned into calls has a value: all of them here
    ops = {key for key in results if not key.startswith("[value] ")}
    assert ops == set(ids)
    weights = [
        n.name
        for n in model.graph.node
        if n.name.endswith(("weight_DequantizeLinear", "bias_DequantizeLinear"))
    ]
    assert len(weights) == 10
    for name in weights:
        assert results[name] == KEEP_DQ
    assert results["conv0"]["value"] == LABELS["not_constant"]
    # the initializers those dequantize read (int8 weight, scale, zero point) ship as they are,
    # decided where they meet run-time code: a conv weight's dequantize, kept by the rule; a conv
    # bias's reshape after it, kept because its input was. The activations' scales feed
    # run-time calls, about which nothing was decided.
    readers = {n.name: n.input for n in model.graph.node}
    expected = {f"[value] {name}": node for node in weights for name in readers[node]}
    assert len(expected) == 30
    assert {key for key in results if key.startswith("[value] ")} == set(expected)
    input_kept = {
        "value": "kept: input kept by keep-dequantize-of-integer-constant",
        "bgColor": CATEGORIES["kept_with_input"][1],
        "textColor": "#000000",
    }
    for key, node in expected.items():
        layer = node.split(".")[0]
        if layer != "fc":
            assert results[key] == (input_kept if "bias" in node else KEEP_DQ), key
    colours = {entry["bgColor"] for entry in results.values()}
    assert colours == {
        CATEGORIES["kept_by_rule"][1],
        CATEGORIES["kept_with_input"][1],
        CATEGORIES["not_constant"][1],
    }


def test_default_policy_colours_the_weights_folded(cnn_path, tmp_path):
    out = tmp_path / "d.json"
    assert _draw(cnn_path, out).returncode == 0
    data = json.loads(out.read_text())
    validate(data)
    results = data["fold_guard_qdq_cnn"]["results"]
    for key in ("conv0.weight_DequantizeLinear", "[value] conv0.weight_quantized"):
        assert results[key]["value"] == "folded"
        assert results[key]["bgColor"] == CATEGORIES["folded"][1]


def test_numeric_view_gives_the_bytes_a_fold_adds(cnn_path, tmp_path):
    out = tmp_path / "bytes.json"
    assert _draw(cnn_path, out, "--numeric").returncode == 0
    data = json.loads(out.read_text())
    validate(data)
    graph = data["fold_guard_qdq_cnn"]
    # conv0's int8[8, 3, 3, 3] weight (216 B) and its fp32[8] scale and int8[8] zero point
    # (40 B) fold to fp32 (864 B)
    assert graph["results"]["conv0.weight_DequantizeLinear"]["value"] == 864 - 216 - 40
    assert [t["value"] for t in graph["thresholds"]] == sorted(
        t["value"] for t in graph["thresholds"]
    )
    assert "conv0_out_QuantizeLinear" not in graph["results"]  # nothing there folds
    assert not [key for key in graph["results"] if key.startswith("[value] ")]  # calls only


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
    validate(data)
    # an unnamed graph's id is "": the file is that one graph's data alone
    assert data["results"] == {
        "node": {"value": "folded", "bgColor": CATEGORIES["folded"][1], "textColor": "#ffffff"},
        "add": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
        "node_1": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
        "add_1": {"value": "not constant", "bgColor": "#cfd8dc", "textColor": "#000000"},
        # the initializer the folded Exp read
        "[value] w": {
            "value": "folded",
            "bgColor": CATEGORIES["folded"][1],
            "textColor": "#ffffff",
        },
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


def test_the_schema_is_written_from_the_dataclasses():
    """Each of the schema's $defs has its dataclass's fields, the ones without a default required."""
    ndb = pytest.importorskip(
        "model_explorer.node_data_builder",
        reason="pip install --no-deps ai-edge-model-explorer==0.1.34 (scripts/test.sh does)",
    )
    defs = json.loads(SCHEMA.read_text())["$defs"]
    for name in ("GraphNodeData", "NodeDataResult", "ThresholdItem", "GradientItem"):
        fields = dataclasses.fields(getattr(ndb, name))
        assert set(defs[name]["properties"]) == {f.name for f in fields}, name
        required = {
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert set(defs[name].get("required", [])) == required, name
    assert [f.name for f in dataclasses.fields(ndb.ModelNodeData)] == ["graphsData"]


# ----------------------------------------------------------------------------------- TFLite


@pytest.fixture(scope="module")
def tflite_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("node-data-tflite") / "int8.tflite"
    path.write_bytes(make_quantized_tflite_model(0).buffer)
    return path


def test_tflite_nodes_get_the_builtin_adapters_ids(tflite_path, tmp_path):
    """QUANTIZE, CONV_2D, RESHAPE, FULLY_CONNECTED, DEQUANTIZE are nodes "0".."4"; then
    GraphInputs "5" and the constant tensors in the order operators read them: conv/weight "6",
    conv/bias "7", flatten/shape "8" (a static shape: no constant in Relax), fc/weight "9",
    fc/bias "10". The weights' dequantize calls belong to their operators' conversions."""
    out = tmp_path / "d.json"
    result = _draw(tflite_path, out, "-p", "keep-qdq-weights")
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    validate(data)
    results = data["main"]["results"]
    assert set(results) == {"0", "1", "2", "3", "4", "6", "7", "9", "10"}
    # each operator's result (a requantize, the reshape, the output dequantize) runs at run time
    assert {results[op]["value"] for op in "01234"} == {LABELS["not_constant"]}
    # the weights ship as int8 behind their kept dequantize (fc/weight's transpose folded first)
    assert all(results[const] == KEEP_DQ for const in ("6", "7", "9", "10"))
    assert _draw(tflite_path, out).returncode == 0  # default folds every weight to fp32
    folded = json.loads(out.read_text())["main"]["results"]
    assert {folded[const]["value"] for const in ("6", "7", "9", "10")} == {"folded"}


def test_tflite_recording_import_is_the_plain_import():
    """The command's noting op converter imports exactly what TVM's importer with fold_guard's
    converter does, and names each call's layer by its operator's output tensor."""
    import tflite
    from tvm.relax.frontend.tflite import from_tflite

    from fold_guard.cli._explorer import TFLiteRecording, tflite_converter, tflite_layers
    from fold_guard.relax.frontends import TFLiteOperatorConverter

    data = make_quantized_tflite_model(0).buffer
    plain = from_tflite(tflite.Model.GetRootAsModel(data, 0), op_converter=TFLiteOperatorConverter)
    recording = TFLiteRecording()
    model = tflite.Model.GetRootAsModel(data, 0)
    noted = from_tflite(model, op_converter=tflite_converter(recording))
    tvm.ir.assert_structural_equal(noted, plain)
    assert [index for index, _ in recording.results] == [0, 1, 2, 3, 4]
    assert sorted({name for _, name, _ in recording.constants}) == [
        "conv/bias",
        "conv/weight",
        "fc/bias",
        "fc/weight",
    ]
    layers, _ = tflite_layers(model, noted, recording)
    assert set(layers.values()) == {"input_int8", "conv", "flatten", "fc", "output"}


@pytest.mark.parametrize("suffix", [".pt2"])
def test_other_formats_are_refused_before_any_work(tmp_path, suffix):
    module = tmp_path / f"model{suffix}"
    module.write_bytes(b"not read")
    out = tmp_path / "d.json"
    result = _draw(module, out)
    assert result.returncode == 2
    assert "written for .onnx and .tflite models" in result.stderr
    assert not out.exists()


def test_weights_as_parameters_colour_the_lifted_weights(cnn_path, tmp_path):
    """--weights-as-params: the initializers are main's parameters; default lifts every weight's
    dequantize (LiftTransformParams computes it), and each initializer it reads says so."""
    out = tmp_path / "lifted.json"
    assert _draw(cnn_path, out, "--weights-as-params").returncode == 0
    data = json.loads(out.read_text())
    validate(data)
    results = data["fold_guard_qdq_cnn"]["results"]
    initializers = {key: r["value"] for key, r in results.items() if key.startswith("[value] ")}
    assert len(initializers) == 30 and set(initializers.values()) == {"lifted"}
    assert results["conv0.weight_DequantizeLinear"]["bgColor"] == CATEGORIES["lifted"][1]
