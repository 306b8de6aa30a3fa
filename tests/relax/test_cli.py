"""The ``fold-guard`` command on real model files.

    qdq_cnn.onnx ──fold-guard inspect──▶ report (text / JSON against report.schema.json)
                 ──fold-guard fold -o──▶ OUT.json / OUT.py  ==  fgr.fold(...).mod (structurally)
    bad input    ──fold-guard ...──────▶ exit 2, one line on stderr naming it, nothing written

The commands run in this process (``support.inprocess.run_cli``: ``python -m fold_guard``'s
``main`` with stdout and stderr captured), which spares each one the seconds of importing TVM;
what only a real process shows runs as one: the console script (``--version``, ``--help``, bad
input) and the traceback of ``--debug``. Each model is written once per session from
``_common.onnx_models`` (fixed seeds).
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Dict

import jsonschema
import numpy as np
import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli

import fold_guard.relax as fgr
from fold_guard import __version__
from fold_guard.cli import SCHEMA_PATH
from fold_guard.cli._check import compare_outputs
from fold_guard.cli._progress import Progress

MODELS = sorted(om.MODEL_BUILDERS)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_files(tmp_path_factory) -> Dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    paths = {}
    for name, build in om.MODEL_BUILDERS.items():
        paths[name] = folder / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return paths


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m fold_guard ARGS`` in this process, stdout/stderr captured (not a terminal)."""
    return run_cli(*args, cwd=None if cwd == REPO else cwd)


def run_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m fold_guard ARGS`` in a subprocess, stdout/stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "fold_guard", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def imported(path: Path) -> tvm.IRModule:
    return om.import_relax(onnx.load(str(path)))


def load_schema() -> dict:
    with open(SCHEMA_PATH) as handle:
        return json.load(handle)


# inspect ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_inspect_json_matches_the_schema_and_the_library(model_files, name):
    result = run("inspect", str(model_files[name]), "--policy", "keep-qdq-weights", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    report = json.loads(result.stdout)
    jsonschema.validate(report, load_schema())
    plan = fgr.fold(imported(model_files[name]), policy="keep-qdq-weights").plan
    assert report["calls"] == len(plan.decisions) == len(report["decisions"])
    assert [(d["label"], d["op"], d["reason"]) for d in report["decisions"]] == [
        (d.label, d.op, d.reason.name.lower()) for d in plan.decisions
    ]
    assert report["counts"]["by_reason"] == {
        r.name.lower(): n for r, n in plan.count_by_reason().items()
    }
    # The weights and biases are kept by the rule; what reads them only because they were kept
    # has the distinct reason, pointing at a kept dequantize.
    decisions = report["decisions"]
    inherited = [d for d in decisions if d["reason"] == "kept_with_input"]
    assert inherited and all(decisions[d["root"]]["reason"] == "kept_by_policy" for d in inherited)
    assert all(d["layer"] for d in decisions), [d["label"] for d in decisions if not d["layer"]]


@pytest.mark.slow
def test_inspect_text_is_grouped_and_names_onnx_layers(model_files):
    result = run("inspect", str(model_files["qdq_cnn"]), "-p", "keep-qdq-weights")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "policy 'keep-qdq-weights': 55 calls: 0 folded, 15 kept, 40 not constant" in out
    assert "by reason: 10 kept by policy, 5 kept because an input was kept, 40 not constant" in out
    assert (
        "keep-dequantize-of-integer-constant: kept 10 (+5 kept because an input was): "
        "conv0, conv1, conv2, conv3, fc" in out
    )
    assert "constants: 9.81 KiB before, 9.81 KiB after" in out
    assert "input input" not in out
    assert len(out.splitlines()) < 25  # grouped: not one line per call

    verbose = run(
        "inspect", str(model_files["qdq_cnn"]), "-p", "keep-qdq-weights", "--verbose"
    ).stdout
    assert "main/lv6 [conv0] = relax.add -> float32[1, 8, 16, 16]: not constant" in verbose
    assert (
        "main/lv [input_QuantizeLinear] = relax.quantize -> uint8[1, 3, 16, 16]: "
        "not constant: 'input' is a run-time input" in verbose
    )
    assert (
        "main/lv2 [conv0: conv0.weight_DequantizeLinear] = relax.dequantize -> "
        "float32[8, 3, 3, 3]: kept by policy" in verbose
    )
    assert (
        "main/lv5 [conv0] = relax.reshape -> float32[1, 8, 1, 1]: kept because an input was kept"
        in verbose
    )


@pytest.mark.slow
def test_inspect_reads_tvm_json_and_tvmscript(model_files, tmp_path):
    mod = imported(model_files["qdq_cnn"])
    (tmp_path / "m.json").write_text(tvm.ir.save_json(mod))
    (tmp_path / "m.py").write_text(mod.script(show_meta=True))  # bare TVMScript, as printed
    expected = fgr.plan(mod, "keep-qdq-weights").count_by_reason()
    for path in (tmp_path / "m.json", tmp_path / "m.py"):
        result = run("inspect", str(path), "-p", "keep-qdq-weights", "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["model"]["format"] == ("json" if path.suffix == ".json" else "tvmscript")
        assert report["counts"]["by_reason"] == {r.name.lower(): n for r, n in expected.items()}


@pytest.mark.slow
def test_policies_compose_in_order(model_files):
    result = run(
        "inspect",
        str(model_files["qdq_cnn"]),
        "-p",
        "keep-qdq-weights",
        "-p",
        "size-guard",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    plan = fgr.plan(imported(model_files["qdq_cnn"]), ["keep-qdq-weights", "size-guard"])
    assert json.loads(result.stdout)["policy"] == plan.policy_name


# fold ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_fold_writes_what_the_library_returns(model_files, tmp_path, name):
    out_json, out_py, report = (
        tmp_path / "folded.json",
        tmp_path / "folded.py",
        tmp_path / "report.json",
    )
    result = run(
        "fold",
        str(model_files[name]),
        "-p",
        "qdq-accelerator",
        "-o",
        str(out_json),
        "--report",
        str(report),
    )
    assert result.returncode == 0, result.stderr
    expected = fgr.fold(imported(model_files[name]), policy="qdq-accelerator").mod
    tvm.ir.assert_structural_equal(tvm.ir.load_json(out_json.read_text()), expected)
    jsonschema.validate(json.loads(report.read_text()), load_schema())

    result = run("fold", str(model_files[name]), "-p", "qdq-accelerator", "-o", str(out_py), "-q")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    namespace = runpy.run_path(str(out_py))  # the written file runs on its own
    tvm.ir.assert_structural_equal(namespace["Module"], expected)


@pytest.mark.slow
def test_fold_annotate_writes_the_annotated_module(model_files, tmp_path):
    out = tmp_path / "annotated.json"
    result = run(
        "fold", str(model_files["qdq_cnn"]), "-p", "qdq-accelerator", "--annotate", "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    expected = fgr.annotate(imported(model_files["qdq_cnn"]), policy="qdq-accelerator")
    tvm.ir.assert_structural_equal(tvm.ir.load_json(out.read_text()), expected.mod)
    assert (
        "placed 10 annotations for policy 'qdq-accelerator': 0 fold_allow, 10 fold_barrier"
        in result.stdout
    )
    # The annotated file keeps the decisions through a plain default fold.
    again = run("inspect", str(out), "--json")
    assert json.loads(again.stdout)["counts"]["by_reason"]["kept_by_barrier"] == 25


@pytest.mark.slow
def test_fold_check_builds_and_compares(model_files, tmp_path):
    out = tmp_path / "checked.json"
    result = run(
        "fold",
        str(model_files["residual_cnn"]),
        "-p",
        "keep-qdq-weights",
        "-o",
        str(out),
        "--check",
    )
    assert result.returncode == 0, result.stderr
    assert "check: same outputs" in result.stdout and out.exists()


def test_compare_outputs_sees_a_difference():
    same = compare_outputs([np.ones(3)], [np.ones(3)], 0.0)
    differ = compare_outputs([np.ones(3)], [np.array([1.0, 1.0, 1.5])], 0.1)
    assert same.ok and not differ.ok and differ.max_abs_diff == 0.5
    assert not compare_outputs([np.ones(3)], [np.ones(4)], 1.0).ok


# policies, plugins, demo, help -----------------------------------------------------------------


PLUGIN = """
from fold_guard import Action, FoldPolicy, Rule, register_policy
register_policy(FoldPolicy("test-npu", "a test backend", (
    Rule("keep-every-dequantize", Action.KEEP, "keeps dequantize", lambda call: call.op == "relax.dequantize"),
)))
"""


@pytest.mark.slow
def test_policies_lists_builtins_and_plugins(tmp_path):
    listing = run("policies", "--json")
    assert listing.returncode == 0, listing.stderr
    names = [p["name"] for p in json.loads(listing.stdout)["policies"]]
    assert names == sorted(names) and "test-npu" not in names
    assert {"default", "fold-qnn", "keep-qdq-weights", "keep-requantize"} <= set(names)
    (tmp_path / "my_npu_plugin.py").write_text(PLUGIN)
    listing = run("policies", "--plugin", "my_npu_plugin", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert (
        "test-npu: a test backend" in listing.stdout and "keep-every-dequantize" in listing.stdout
    )


@pytest.mark.slow
def test_a_plugin_policy_can_be_used(model_files, tmp_path):
    (tmp_path / "my_npu_plugin.py").write_text(PLUGIN)
    result = run(
        "inspect",
        str(model_files["qdq_cnn"]),
        "--plugin",
        "my_npu_plugin",
        "-p",
        "test-npu",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"]["by_reason"]["kept_by_policy"] == 10


def test_version_and_help():
    """Through the console script, which answers these without importing TVM (a fraction of a
    second each; ``bench/bench_cli_startup.py`` times them)."""
    script = Path(sys.executable).with_name("fold-guard")

    def console(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60)

    assert console("--version").stdout.strip() == f"fold-guard {__version__}"
    for command in ("inspect", "fold", "draw", "policies", "demo"):
        result = console(command, "--help")
        assert result.returncode == 0 and f"usage: fold-guard {command}" in result.stdout


@pytest.mark.slow
def test_console_script_entry_point():
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == f"fold-guard {__version__}"


@pytest.mark.slow
def test_demo_runs():
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert "$ fold-guard inspect qdq_cnn.onnx --policy keep-qdq-weights" in result.stdout
    assert "10 kept by policy" in result.stdout


# errors ----------------------------------------------------------------------------------------


def _qoperator_model(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value), name)

    inits = [
        const("xs", np.float32(0.1)),
        const("xz", np.uint8(0)),
        const("w", np.ones((2, 1, 3, 3), np.int8)),
        const("ws", np.float32(0.1)),
        const("wz", np.int8(0)),
        const("ys", np.float32(0.2)),
        const("yz", np.uint8(0)),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="qconv"
    )
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 2, 2, 2])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.mark.slow
def test_bad_input_from_the_console_script_is_one_line(tmp_path):
    """The in-process table (test_cli_contract.py) through the real console script, once."""
    _qoperator_model(tmp_path / "qlinear.onnx")
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run(
        [str(script), "inspect", str(tmp_path / "qlinear.onnx")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("fold-guard: error: ") and "QLinearConv" in line
    assert "QOperator-format models" in line


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    result = run_process("inspect", str(tmp_path / "missing.onnx"), "--debug")
    assert (
        result.returncode != 0 and "Traceback" in result.stderr and "no such file" in result.stderr
    )


def test_progress_only_on_a_terminal():
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    for quiet, shown in ((False, True), (True, False)):
        terminal = Terminal()
        with Progress(["import", "fold"], quiet=quiet, stream=terminal) as progress:
            progress.step("importing model.onnx")
        assert ("importing model.onnx" in terminal.text) is shown
    assert not Progress(["import"], stream=open(os.devnull, "w")).enabled


# weights as parameters ---------------------------------------------------------------------------


@pytest.mark.slow
def test_inspect_weights_as_params_says_what_is_lifted(tmp_path):
    path = tmp_path / "cnn_float_weights.onnx"
    onnx.save(om.make_qdq_cnn(0, float_weights=True), str(path))
    result = run("inspect", str(path), "-p", "keep-qdq-weights", "--weights-as-params", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, load_schema())
    lifted = [d for d in report["decisions"] if d["action"] == "lift"]
    assert report["counts"]["by_action"]["lift"] == len(lifted) == 5  # the five weight quantizes
    assert {d["op"] for d in lifted} == {"relax.quantize"}
    assert {d["layer"] for d in lifted} == {"conv0", "conv1", "conv2", "conv3", "fc"}
    assert any(i["kind"] == "parameter" for d in lifted for i in d["inputs"])
    kept = [d for d in report["decisions"] if d["reason"] == "kept_by_policy"]
    assert len(kept) == 10 and {d["op"] for d in kept} == {"relax.dequantize"}
    refused = run("fold", str(path), "--weights-as-params", "-o", str(tmp_path / "out.json"))
    assert refused.returncode == 2 and "inspect and draw" in refused.stderr
    assert not (tmp_path / "out.json").exists()
