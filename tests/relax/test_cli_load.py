"""How the command reads a model: every format, nothing run by surprise, layer names to trust.

model.onnx + model.onnx.data (any cwd) ──load_model──▶ == from_onnx(onnx.load(...))
program.py (a Python program)          ──load_model──▶ refused; with trust_model: its module
model.tflite / model.pt2               ──load_model──▶ == the frontend called directly
ResNet-50 QDQ                          ──load_model──▶ every conv2d, its weight's dequantize
                                                      and its bias: the ONNX Conv's name

White-box on purpose: it tests a name read through ``_compat``, a private mechanism.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from _common import onnx_models as om
from onnx import numpy_helper

import fold_guard.relax as fgr
from fold_guard.cli._demo import qdq_cnn
from fold_guard.cli._errors import CliError
from fold_guard.cli._load import load_model
from fold_guard.relax._compat import var_name
from fold_guard.relax.frontends import TFLiteOperatorConverter


def _relax_decisions(path: Path):
    """``(label, op, layer, source)`` of every call, as the report gives them."""
    import fold_guard.relax as fgr

    model = load_model(str(path))
    plan = fgr.plan(model.mod)
    return model, [
        (d.label, d.op, model.layers.get(("main", d.label)), model.sources.get(("main", d.label)))
        for d in plan.decisions
    ]


# ONNX external data -----------------------------------------------------------------------------


def test_external_data_is_read_beside_the_model_from_any_directory(tmp_path, monkeypatch):
    model = om.make_qdq_cnn()
    expected = om.import_relax(model)  # before saving: onnx.save moves the data out of `model`
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(
        model,
        str(folder / "cnn.onnx"),
        save_as_external_data=True,
        location="cnn.onnx.data",
        size_threshold=0,
    )
    assert (folder / "cnn.onnx.data").stat().st_size > 5000  # the weights really are outside
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_model("../model/cnn.onnx")
    tvm.ir.assert_structural_equal(loaded.mod, expected)
    (folder / "cnn.onnx.data").rename(folder / "moved.data")
    with pytest.raises(
        CliError, match=r"external data file 'cnn.onnx.data' of tensor '.*' not found"
    ):
        load_model("../model/cnn.onnx")


# TVMScript text, never a program -------------------------------------------------------------------

PROGRAM = """
import pathlib
pathlib.Path(__file__).with_name("ran").write_text("yes")
import numpy as np
from tvm.script import ir as I, relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2,), "float32")):
        with R.dataflow():
            y = R.add(x, R.const(np.ones(2, "float32")))
            R.output(y)
        return y
"""


def test_a_python_program_runs_only_when_trusted(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    with pytest.raises(CliError, match="run only with --trust-model"):
        load_model(str(program))
    assert not (tmp_path / "ran").exists()
    trusted = load_model(str(program), trust_model=True)
    assert (tmp_path / "ran").read_text() == "yes"
    text = tmp_path / "text.py"
    text.write_text(trusted.mod.script(show_meta=True))  # TVMScript text: parsed, nothing runs
    tvm.ir.assert_structural_equal(load_model(str(text)).mod, trusted.mod)


# TFLite and PyTorch ------------------------------------------------------------------------------


def test_tflite_reads_like_the_frontend(tmp_path):
    import tflite
    from _common.tflite_models import make_quantized_tflite_model
    from tvm.relax.frontend.tflite import from_tflite

    buffer = make_quantized_tflite_model(0).buffer
    (tmp_path / "m.tflite").write_bytes(buffer)
    loaded = load_model(str(tmp_path / "m.tflite"))
    assert loaded.format == "tflite"
    model = tflite.Model.GetRootAsModel(buffer, 0)
    tvm.ir.assert_structural_equal(
        loaded.mod, from_tflite(model, op_converter=TFLiteOperatorConverter)
    )


def test_tflite_int8_weights_behind_dequantize_import_and_stay_int8(tmp_path):
    """TVM 0.27's importer fails on this form; the command reads it with fold_guard's converter."""
    from _common.tflite_weights import make_weight_form_model

    path = tmp_path / "w.tflite"
    path.write_bytes(make_weight_form_model("int8-dequantize").buffer)
    loaded = load_model(str(path))
    plan = fgr.plan(loaded.mod, policy="keep-qdq-weights")
    kept = [d for d in plan.decisions if d.rule == "keep-dequantize-of-integer-constant"]
    assert len(kept) >= 3  # conv, depthwise and dense weights


@pytest.mark.slow
def test_a_pt2e_program_reads_with_its_quantized_ops(tmp_path):
    """PT2E's quantize / dequantize ops, which TVM 0.27 rejects, import as Relax Q/DQ."""
    import torch
    from _common.torch_models import quantize_model

    quantized = quantize_model("linear")
    torch.export.save(quantized.exported, str(tmp_path / "q.pt2"))
    loaded = load_model(str(tmp_path / "q.pt2"), trust_model=True)
    plan = fgr.plan(loaded.mod, policy="keep-qdq-weights")
    kept = [d for d in plan.decisions if d.rule == "keep-dequantize-of-integer-constant"]
    assert len(kept) >= 2  # both Linear weights stay dequantize(<int8 constant>)


@pytest.mark.parametrize("suffix, package", [(".tflite", "tflite"), (".pt2", "torch")])
def test_a_missing_frontend_package_is_one_clear_line(tmp_path, monkeypatch, suffix, package):
    path = tmp_path / f"m{suffix}"
    path.write_bytes(b"\x00\x00\x00\x00TFL3")
    monkeypatch.setitem(sys.modules, package, None)  # import now raises ImportError
    with pytest.raises(CliError, match=rf"needs (the {package} package|torch) \(pip install"):
        load_model(str(path), trust_model=True)


@pytest.mark.slow
def test_exported_program_reads_like_the_frontend(tmp_path):
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    torch.manual_seed(0)
    program = torch.export.export(Net().eval(), (torch.randn(1, 3, 8, 8),))
    torch.export.save(program, str(tmp_path / "net.pt2"))
    with pytest.raises(CliError, match="pass --trust-model"):
        load_model(str(tmp_path / "net.pt2"))
    loaded = load_model(str(tmp_path / "net.pt2"), trust_model=True)
    assert loaded.format == "exported_program"
    expected = from_exported_program(torch.export.load(str(tmp_path / "net.pt2")))
    tvm.ir.assert_structural_equal(loaded.mod, expected)


# layer names --------------------------------------------------------------------------------------


def test_demo_labels_each_call_with_its_layer(tmp_path):
    """qdq_cnn: conv0..conv3 (weight and bias DQ), fc (Gemm: weight DQ, transpose, bias DQ).

    The fc weight's permute_dims is built by the Gemm converter: source and layer ``fc``;
    the weight's and the bias' dequantize come from their DequantizeLinear nodes and belong to
    the layer that reads them.
    """
    onnx.save(qdq_cnn(), str(tmp_path / "demo.onnx"))
    _, calls = _relax_decisions(tmp_path / "demo.onnx")
    constants = [
        (op, layer, source)
        for _, op, layer, source in calls
        if layer and source and layer != source
    ]
    expected = []
    for layer in ("conv0", "conv1", "conv2", "conv3", "fc"):
        for kind in ("weight", "bias"):
            expected.append(("relax.dequantize", layer, f"{layer}.{kind}.dequantize"))
    assert sorted(constants) == sorted(expected)
    by_op = {(op, layer) for _, op, layer, source in calls if layer == source}
    assert {("relax.nn.conv2d", f"conv{i}") for i in range(4)} <= by_op
    assert {("relax.permute_dims", "fc"), ("relax.matmul", "fc"), ("relax.add", "fc")} <= by_op
    assert all(layer for _, _, layer, _ in calls)


@pytest.mark.slow
def test_resnet50_conv_weight_and_bias_carry_their_conv_name(tmp_path):
    """Every Conv of the ONNX graph, by the initializers it reads:

        W_int8 -> DequantizeLinear -> Conv <- DequantizeLinear <- B_int32
    ==> its conv2d, its weight's dequantize and its bias' dequantize and reshape are labelled
        with the Conv's name, and the conv2d reads that very dequantize.
    """
    from support.resnet50 import write_resnet50

    path = write_resnet50(tmp_path)
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    initial = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    model, calls = _relax_decisions(path)
    assert len(calls) == 437
    by_label = {label: (op, layer, source) for label, op, layer, source in calls}
    bindings = {
        var_name(b.var): b.value for block in model.mod["main"].body.blocks for b in block.bindings
    }
    convs = [node for node in graph.node if node.op_type == "Conv"]
    assert len(convs) == 53
    seen = set()
    for conv in convs:
        weight_dq, bias_dq = producer[conv.input[1]], producer[conv.input[2]]
        weight = initial[weight_dq.input[0]]
        # The conv2d whose weight is the dequantize coming from this Conv's weight node.
        (label,) = [
            lbl
            for lbl, (op, _, _) in by_label.items()
            if op == "relax.nn.conv2d"
            and by_label[var_name(bindings[lbl].args[1])][2] == weight_dq.name
        ]
        conv2d = bindings[label]
        assert [int(d) for d in conv2d.ty.shape][1] == weight.shape[0]
        assert by_label[label][1:] == (conv.name, conv.name)
        assert by_label[var_name(conv2d.args[1])][1] == conv.name
        bias = [lbl for lbl, (_, _, source) in by_label.items() if source == bias_dq.name]
        assert len(bias) == 1 and by_label[bias[0]][1] == conv.name
        reshape = [
            lbl
            for lbl, value in bindings.items()
            if by_label.get(lbl, ("",))[0] == "relax.reshape" and var_name(value.args[0]) == bias[0]
        ]
        assert len(reshape) == 1 and by_label[reshape[0]][1:] == (conv.name, conv.name)
        seen.add(label)
    assert len(seen) == 53  # one conv2d per Conv, no name used twice
    assert np.unique([by_label[lbl][1] for lbl in seen]).size == 53
