"""``fold-guard --ir relay`` in the Relay environment (hhb-tvm 3.2.3 = TVM 0.16).

qdq_cnn.onnx ──relay.frontend.from_onnx [──FakeQuantizationToInteger]──▶ Relay module
             ──fold-guard fold --ir relay --fq2i -o OUT.json──▶ == fold_guard.relay.fold(...)

The commands whose output is the test run in this process (``support.inprocess.run_cli``); the
missing-Relax error runs as a real process, exit status and stderr as a user sees them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli
from tvm import relay

import fold_guard.relay as fgr

# Every test here imports, folds or builds a whole model (seconds each): full lane only.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("relay_cli") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(float_weights=True), str(path))
    return path


def run_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fold_guard", *args], capture_output=True, text=True, timeout=600
    )


def test_inspect_relay_names_layers_from_spans(cnn):
    result = run_cli("inspect", str(cnn), "--ir", "relay", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["model"]["ir"] == "relay"
    plan = fgr.plan(om.import_relay(onnx.load(str(cnn))))
    assert [(d["label"], d["op"], d["reason"]) for d in report["decisions"]] == [
        (d.label, d.op, d.reason.name.lower()) for d in plan.decisions
    ]
    layers = {d["layer"] for d in report["decisions"]}
    assert "conv0.weight_QuantizeLinear" in layers and "conv0" in layers


def test_fold_fq2i_writes_what_the_library_returns(cnn, tmp_path):
    out = tmp_path / "folded.json"
    result = run_cli(
        "fold",
        str(cnn),
        "--ir",
        "relay",
        "--fq2i",
        "-p",
        "qdq-accelerator",
        "-o",
        str(out),
        "--check",
    )
    assert result.returncode == 0, result.stderr
    assert "check: same outputs" in result.stdout
    mod = relay.transform.FakeQuantizationToInteger()(om.import_relay(onnx.load(str(cnn))))
    expected = fgr.fold(mod, policy="qdq-accelerator").mod
    tvm.ir.assert_structural_equal(tvm.ir.load_json(out.read_text())["main"], expected["main"])


def test_relax_path_says_what_is_missing(cnn):
    result = run_process("inspect", str(cnn))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "fold-guard: error: --ir relax: fold_guard.relax supports apache-tvm 0.27"
    )
    assert "--ir relay" in result.stderr and "Traceback" not in result.stderr
