"""``fold-guard fold --ledger`` writes the precision ledger into the module; ``inspect`` on the saved
module prints it (text and ``--json``, which validates against report.schema.json).

qdq_cnn.onnx ──fold -p keep-qdq-weights --ledger -o saved.json──▶ saved.json
saved.json ──inspect──▶ "ledger in the module: 10 weights", one line per weight with its layer
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli
from tvm import relax

import fold_guard.relax as fgr

SCHEMA = Path(__file__).resolve().parents[2] / "fold_guard/cli/report.schema.json"
LAYERS = ["conv0", "conv1", "conv2", "conv3", "fc"]

#: The module attribute the ledger is written to, as ``fold(..., ledger=True)`` documents it.
LEDGER_ATTR = "fold_guard.ledger"


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ledger-cli") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(path))
    return path


def _ledger_lines(stdout: str):
    lines = stdout.splitlines()
    start = lines.index("ledger in the module: 10 weights")
    return lines[start + 1 :]


def test_fold_writes_the_ledger_and_inspect_prints_it(cnn_path, tmp_path):
    saved = tmp_path / "saved.json"
    result = run_cli("fold", str(cnn_path), "-p", "keep-qdq-weights", "-o", str(saved), "--ledger")
    assert result.returncode == 0, result.stderr
    assert "with its precision ledger: 10 weights" in result.stdout
    rows = fgr.ledger(tvm.ir.load_json(saved.read_text()))
    # the command names each row's source layer (the library cannot: it never saw the ONNX file)
    assert sorted({row.layer for row in rows}) == LAYERS
    shown = run_cli("inspect", str(saved))
    assert shown.returncode == 0, shown.stderr
    lines = _ledger_lines(shown.stdout)
    assert len(lines) == 10
    # in binding order: each layer's weight, then its bias
    assert [line.split()[0] for line in lines] == [layer for layer in LAYERS for _ in (0, 1)]
    for line in lines:
        assert re.fullmatch(
            r"  \w+ \(lv\d+\): kept int(8|32)\[[\d, ]+\] -> int(8|32)\[[\d, ]+\], \d+ -> \d+ B "
            r"\[keep-dequantize-of-integer-constant\] sha256:[0-9a-f]{16}",
            line,
        ), line
    assert {line.rsplit(" ", 1)[1] for line in lines} == {row.key for row in rows}


def test_inspect_json_carries_the_rows(cnn_path, tmp_path):
    saved = tmp_path / "saved.json"
    assert run_cli("fold", str(cnn_path), "-o", str(saved), "--ledger", "-q").returncode == 0
    result = run_cli("inspect", str(saved), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    rows = fgr.ledger(tvm.ir.load_json(saved.read_text()))
    assert report["ledger"] == [row.to_dict() for row in rows]
    # under default every weight was folded back to fp32, and the rows say so
    assert {(r["action"], r["rule"], r["dtype_after"]) for r in report["ledger"]} == {
        ("folded", "default", "float32")
    }


def test_no_ledger_unless_asked(cnn_path, tmp_path):
    saved = tmp_path / "plain.json"
    assert run_cli("fold", str(cnn_path), "-o", str(saved), "-q").returncode == 0
    mod = tvm.ir.load_json(saved.read_text())
    assert mod.attrs is None or LEDGER_ATTR not in mod.attrs
    shown = run_cli("inspect", str(saved))
    assert shown.returncode == 0 and "ledger in the module" not in shown.stdout
    assert "ledger" not in json.loads(run_cli("inspect", str(saved), "--json").stdout)


@pytest.mark.slow
def test_an_annotated_module_keeps_its_rows_through_the_zero_pipeline(cnn_path, tmp_path):
    saved = tmp_path / "annotated.json"
    args = ["-p", "keep-qdq-weights", "-o", str(saved), "--annotate", "--ledger", "-q"]
    assert run_cli("fold", str(cnn_path), *args).returncode == 0
    mod = tvm.ir.load_json(saved.read_text())
    rows = fgr.ledger(mod)
    assert len(rows) == 10 and {row.action for row in rows} == {"kept"}
    with tvm.target.Target("llvm"):
        built = relax.get_pipeline("zero")(mod)
    assert fgr.ledger(built) == rows
