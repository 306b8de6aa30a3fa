"""The command line as a new user meets it (issue 39): no misleading answer, no wasted wait.

fold-guard inspect m.onnx -p keep-qdq-weigths   ──▶ exit 2 before TVM is imported
fold-guard fold m.onnx --annotate -o a.json     ──▶ annotate()'s default policy, "placed N"
fold-guard fold m.onnx -o out.py; inspect out.py ──▶ reads its own output
fold --check [--inputs x.npz]                   ──▶ token ids in [0, rows); the given inputs
fold --check, unfolded module unbuildable       ──▶ says so, writes the fold, exit 4
inspect q.pt2 --trust-model (a fresh process)   ──▶ PT2E's ops registered, no torch noise
fgr.fold(<onnx.ModelProto>)                     ──▶ the hint names from_onnx
the Python report with from_onnx_with_layers    ──▶ the names the command prints

White-box on purpose: it tests the command against the core's built-in policy list
(``_core.builtin_policies``), a private mechanism.
"""

from __future__ import annotations

import inspect as pyinspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from _common import onnx_models as om
from support.inprocess import run_cli
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import UnsupportedIRError
from fold_guard._core.builtin_policies import BUILTIN_POLICIES
from fold_guard.cli import _check, _parser

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flows") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(path))
    return path


def _ids_model(path: Path) -> Path:
    """``main(ids: int64[1, 4]) = take(table[10, 3], where(ids < 0, ids + 10, ids))`` (ONNX
    Gather's import) written as TVM JSON: an embedding lookup on token ids."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
    table = relax.const(np.arange(30, dtype="float32").reshape(10, 3))
    with bb.function("main", [ids]):
        with bb.dataflow():
            negative = bb.emit(relax.op.less(ids, relax.const(0, "int64")))
            wrapped = bb.emit(relax.op.add(ids, relax.const(10, "int64")))
            index = bb.emit(relax.op.where(negative, wrapped, ids))
            out = bb.emit_output(relax.op.take(table, index, axis=0))
        bb.emit_func_output(out)
    path.write_text(tvm.ir.save_json(bb.get()))
    return path


# checked before TVM ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "{cnn}", "-p", "keep-qdq-weigths"], "unknown policy (did you mean"),
        (["fold", "{cnn}", "-o", "out.txt"], "-o out.txt: unknown output format"),
        (["draw", "{cnn}", "-o", "plan.png"], "unknown output format; use .html or .svg"),
        (["inspect", "missing.onnx"], "missing.onnx: no such file"),
        (["fold", "{cnn}", "-o", "o.json", "--inputs", "x.npz"], "--inputs: the inputs are for"),
    ],
)
def test_a_typo_answers_before_tvm_is_imported(cnn, tmp_path, argv, message):
    probe = (
        "import sys, _fold_guard_cli\n"
        f"status = _fold_guard_cli.main({[a.format(cnn=cnn) for a in argv]!r})\n"
        "print('exit', status)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'fold_guard')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    lines = result.stdout.strip().splitlines()
    assert lines[-2:] == ["exit 2", "[]"], result.stdout + result.stderr
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("fold-guard: error: ") and message in error, error
    assert list(tmp_path.iterdir()) == []


def test_the_parser_knows_the_builtin_policies_and_annotates_default():
    assert sorted(_parser.BUILTIN_POLICY_NAMES) == sorted(p.name for p in BUILTIN_POLICIES)
    for annotate in (fgr.annotate,):
        default = pyinspect.signature(annotate).parameters["policy"].default
        assert default == _parser.ANNOTATE_POLICY


# annotate: one default -----------------------------------------------------------------------


def test_fold_annotate_without_a_policy_annotates_for_annotates_default(cnn, tmp_path):
    out = tmp_path / "annotated.json"
    result = run_cli("fold", str(cnn), "--annotate", "-o", str(out))
    assert result.returncode == 0, result.stderr
    placed = "placed 10 annotations for policy 'qdq-accelerator': 0 fold_allow, 10 fold_barrier"
    assert placed in result.stdout
    python = fgr.annotate(om.import_relax(onnx.load(str(cnn))))  # the same default in Python
    assert python.explain().splitlines()[0] == placed
    none = run_cli("fold", str(cnn), "--annotate", "-p", "default", "-o", str(out))
    assert "placed 0 annotations for policy 'default'" in none.stdout


# fold -o OUT.py is read back ------------------------------------------------------------------


def test_inspect_reads_what_fold_writes_as_tvmscript(cnn, tmp_path):
    out = tmp_path / "folded.py"
    assert run_cli("fold", str(cnn), "-p", "keep-qdq-weights", "-o", str(out)).returncode == 0
    result = run_cli("inspect", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{out} (tvmscript, relax)")
    # what it read is what was written
    written = tvm.ir.load_json(
        tvm.ir.save_json(
            fgr.fold(om.import_relax(onnx.load(str(cnn))), policy="keep-qdq-weights").mod
        )
    )
    from fold_guard.cli._load import load_model

    tvm.ir.assert_structural_equal(load_model(str(out)).mod, written)


# --check: inputs ------------------------------------------------------------------------------


def test_token_ids_are_drawn_in_the_tables_range(tmp_path):
    model = _ids_model(tmp_path / "ids.json")
    mod = tvm.ir.load_json(model.read_text())
    assert _check.index_bounds(mod, "relax") == {"ids": 10}
    signature = _check.relax_signature(mod)
    (ids,) = _check.random_inputs(signature, 0, _check.index_bounds(mod, "relax"))
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 10
    result = run_cli("fold", str(model), "-o", str(tmp_path / "out.json"), "--check")
    assert result.returncode == 0 and "same outputs" in result.stdout, result.stderr


def test_check_takes_inputs_by_name(tmp_path):
    model = _ids_model(tmp_path / "ids.json")
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, ids=np.array([[9, 0, 3, 9]], dtype="int64"))
    report = tmp_path / "report.json"
    argv = ["fold", str(model), "-o", str(tmp_path / "o.json"), "--check", "--inputs", str(inputs)]
    result = run_cli(*argv, "--report", str(report))
    assert result.returncode == 0, result.stderr
    assert json.loads(report.read_text())["check"]["inputs"] == str(inputs)
    np.savez(inputs, token_ids=np.zeros((1, 4), "int64"))
    wrong = run_cli(*argv)
    assert wrong.returncode == 2 and "main has no input 'token_ids'" in wrong.stderr
    np.savez(inputs, ids=np.zeros((1, 5), "int64"))
    wrong = run_cli(*argv)
    assert wrong.returncode == 2 and "ids is int64[1, 5], main takes int64[1, 4]" in wrong.stderr


def test_an_unbuildable_unfolded_module_is_reported_and_the_fold_still_written(
    cnn, tmp_path, monkeypatch
):
    """TVM failing on the module as loaded is not the fold's fault: exit 4, the fold written.

    The build is TVM's; this stands in for a model TVM cannot build (the first run, before the
    fold) by raising where ``tvm.compile`` would, and runs the folded module for real.
    """
    real = _check.run_relax
    runs = []

    def first_fails(mod, inputs):
        runs.append(mod)
        if len(runs) == 1:
            raise tvm.error.InternalError("Check failed: cannot build this op")
        return real(mod, inputs)

    monkeypatch.setattr(_check, "run_relax", first_fails)
    out = tmp_path / "folded.json"
    result = run_cli("fold", str(cnn), "-o", str(out), "--check")
    from fold_guard.cli._errors import EXIT_UNFOLDED_UNBUILDABLE

    assert result.returncode == EXIT_UNFOLDED_UNBUILDABLE == 4, result.stderr
    assert "TVM cannot build the unfolded module" in result.stderr
    assert "the folded module was written unchecked" in result.stderr
    assert "internal error" not in result.stderr
    tvm.ir.load_json(out.read_text())  # written, and whole


# .pt2: PT2E's operators ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_pt2e_program_loads_in_a_fresh_process(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from _common import torch_models

    path = tmp_path / "q.pt2"
    torch.export.save(torch_models.quantize_model("linear").exported, str(path))
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run(
        [str(script), "inspect", str(path), "--trust-model", "-p", "keep-qdq-weights"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "keep-dequantize-of-integer-constant: kept 2" in result.stdout
    assert "SerializeError" not in result.stderr and "W1" not in result.stderr


@pytest.mark.slow
def test_an_unregistered_operator_is_one_line_naming_the_plugin(tmp_path):
    torch = pytest.importorskip("torch")
    saver = (
        "import torch\n"
        "lib = torch.library.Library('fold_guard_test', 'DEF')\n"
        "lib.define('twice(Tensor x) -> Tensor')\n"
        "lib.impl('twice', lambda x: x * 2, 'CompositeExplicitAutograd')\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.ops.fold_guard_test.twice(x)\n"
        f"torch.export.save(torch.export.export(M(), (torch.ones(2),)), {str(tmp_path / 'op.pt2')!r})\n"
    )
    subprocess.run([sys.executable, "-c", saver], check=True, timeout=300)
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run(
        [str(script), "inspect", str(tmp_path / "op.pt2"), "--trust-model"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "torch.ops.fold_guard_test.twice" in line and "--plugin MODULE" in line, line
    del torch


# the library's own hints and names ------------------------------------------------------------


def test_an_onnx_model_passed_to_fold_gets_the_importer_as_hint():
    model = om.make_qdq_cnn()
    with pytest.raises(UnsupportedIRError, match=r"got ModelProto; hint: .*from_onnx\(model"):
        fgr.fold(model)


def test_the_python_report_names_what_the_command_prints(cnn):
    from fold_guard.relax.frontends import from_onnx_with_layers

    mod, layers = from_onnx_with_layers(onnx.load(str(cnn)), keep_params_in_input=False)
    python = fgr.fold(mod, policy="keep-qdq-weights").report.summary(layers=layers)
    command = run_cli("inspect", str(cnn), "-p", "keep-qdq-weights").stdout
    rules = [line for line in python.splitlines() if line.startswith("  keep-")]
    assert rules and all(line in command for line in rules), (rules, command)
    assert "conv0" in rules[0] and "lv" not in rules[0]
