"""The ``fold-guard`` contract, run in-process through the console script's launcher.

    bad input (a table) ──fold-guard ...──▶ exit 2, one stderr line naming it, stdout empty,
                                            no file created or changed anywhere under the run's
                                            directory (outputs, temporaries)
    --plugin FILE.py / module in the current directory, --max-fold-bytes 1KiB, -v --only kept
                        ──▶ what the library's own calls give

The launcher parses the arguments without importing fold_guard; ``--help`` and ``--version`` are
checked to import neither fold_guard nor TVM (in a fresh interpreter).

White-box on purpose: it tests a policy with a budget (``_core.registry.with_budget``), a private
mechanism.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import onnx
import pytest
import tvm
from _common import onnx_models as om
from tvm.script import ir as I
from tvm.script import relax as R

import _fold_guard_cli
import fold_guard.relax as fgr
from fold_guard import __version__, policy_registry_scope
from fold_guard._core.registry import with_budget
from fold_guard.cli._categories import category_of, selected

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(), str(path))
    return path


@pytest.fixture(autouse=True)
def registry():
    with policy_registry_scope():
        yield


def _distinct_constant_bytes(path: Path) -> int:
    """Bytes of the distinct constants of ``path`` imported as the command imports it."""
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    found: Dict[int, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            found[expr.__hash__()] = expr.value.numpy().nbytes

    mod = from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    relax.analysis.post_order_visit(mod["main"], visit)
    return sum(found.values())


def invoke(capsys, *argv: str) -> Tuple[int, str, str]:
    """``fold-guard ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = _fold_guard_cli.main(list(argv))
    except SystemExit as stop:  # argparse: --help, --version, usage errors
        status = stop.code if isinstance(stop.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def snapshot(folder: Path) -> Dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes() if path.is_file() else b"<dir>"
        for path in sorted(folder.rglob("*"))
    }


# bad input ---------------------------------------------------------------------------------------


def _write_inputs(tmp: Path) -> None:
    (tmp / "garbage.onnx").write_bytes(b"\x00not a model")
    (tmp / "garbage.json").write_text('{"not": "tvm"}')
    (tmp / "model.txt").write_text("hello")
    (tmp / "existing_dir").mkdir()
    (tmp / "old.json").write_text("old content")
    # A Python program that builds a module: valid Python, not TVMScript text. It would leave a
    # marker if it ran.
    (tmp / "program.py").write_text(
        "import pathlib\n"
        "pathlib.Path(__file__).with_name('program_ran').write_text('ran')\n"
        "from tvm.script import ir as I, relax as R\n"
        "@I.ir_module\nclass Module:\n    @R.function\n"
        "    def main(x: R.Tensor((2,), 'float32')):\n        return x\n"
    )
    (tmp / "model.pt2").write_bytes(b"PK\x03\x04 not looked at")
    (tmp / "plugin_import_error.py").write_text("import no_such_module_for_fold_guard\n")
    (tmp / "plugin_syntax_error.py").write_text("def broken(:\n")
    (tmp / "plugin_duplicate.py").write_text(
        "from fold_guard import FoldPolicy, register_policy\n"
        "register_policy(FoldPolicy('default', 'a second default'))\n"
    )
    external = onnx.load_from_string(om.make_qdq_cnn().SerializeToString())
    onnx.save(
        external,
        str(tmp / "external.onnx"),
        save_as_external_data=True,
        location="external.onnx.data",
        size_threshold=0,
    )
    (tmp / "external.onnx.data").unlink()
    # A model whose external data points out of its directory (at a file that exists).
    outside = onnx.load(str(tmp / "external.onnx"), load_external_data=False)
    for tensor in outside.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../" + tmp.name + "/old.json"
    (tmp / "existing_dir" / "outside.onnx").write_bytes(outside.SerializeToString())


def _bad_inputs(tmp: Path, cnn: str) -> List[Tuple[str, List[str], str]]:
    out = str(tmp / "out.json")
    return [
        (
            "atol negative",
            ["fold", cnn, "-o", out, "--check", "--atol", "-1"],
            "--atol: must be a finite",
        ),
        ("atol nan", ["fold", cnn, "-o", out, "--atol", "nan"], "--atol: must be a finite"),
        ("atol inf", ["fold", cnn, "-o", out, "--atol", "inf"], "--atol: must be a finite"),
        ("atol text", ["fold", cnn, "-o", out, "--atol", "small"], "--atol: must be a finite"),
        ("size unit", ["inspect", cnn, "--max-fold-bytes", "64XB"], "not a byte size: '64XB'"),
        ("size sign", ["inspect", cnn, "--max-fold-bytes=-1MiB"], "not a byte size"),
        ("only", ["inspect", cnn, "--only", "kept-ish"], "argument --only: invalid choice"),
        ("unknown option", ["inspect", cnn, "--polcy", "x"], "unrecognized arguments"),
        ("no output", ["fold", cnn], "the following arguments are required: -o/--output"),
        (
            "unknown policy",
            ["inspect", cnn, "-p", "keep-qdq-weight"],
            "--policy keep-qdq-weight: unknown policy (did you mean 'keep-qdq-weights'",
        ),
        ("plugin module", ["inspect", cnn, "--plugin", "no_such_plugin"], "no module named"),
        (
            "plugin file",
            ["inspect", cnn, "--plugin", str(tmp / "nope.py")],
            "nope.py: no such file",
        ),
        (
            "plugin import error",
            ["inspect", cnn, "--plugin", str(tmp / "plugin_import_error.py")],
            "importing it failed: ModuleNotFoundError",
        ),
        (
            "plugin syntax error",
            ["inspect", cnn, "--plugin", str(tmp / "plugin_syntax_error.py")],
            "importing it failed: SyntaxError",
        ),
        (
            "plugin registers a taken name",
            ["policies", "--plugin", str(tmp / "plugin_duplicate.py")],
            "importing it failed: PreconditionError",
        ),
        ("same path twice", ["fold", cnn, "-o", out, "--report", out], "the same file as -o"),
        (
            "same file, other spelling",
            ["fold", cnn, "-o", out, "--report", str(tmp / "existing_dir" / ".." / "out.json")],
            "the same file as -o",
        ),
        (
            "report in /proc",
            ["fold", cnn, "-o", out, "--report", "/proc/r.json"],
            "cannot write in /proc",
        ),
        (
            "missing directory",
            ["fold", cnn, "-o", str(tmp / "nowhere" / "o.json")],
            "does not exist",
        ),
        ("output is a directory", ["fold", cnn, "-o", str(tmp / "existing_dir")], "is a directory"),
        ("output format", ["fold", cnn, "-o", str(tmp / "out.txt")], "unknown output format"),
        (
            "report format",
            ["fold", cnn, "-o", out, "--report", str(tmp / "r.txt")],
            "unknown output format",
        ),
        ("draw format", ["draw", cnn, "-o", str(tmp / "plan.png")], "use .html or .svg"),
        ("missing model", ["inspect", str(tmp / "missing.onnx")], "missing.onnx: no such file"),
        ("model is a directory", ["inspect", str(tmp / "existing_dir")], "is a directory"),
        ("model format", ["inspect", str(tmp / "model.txt")], "unknown model format"),
        ("not ONNX", ["inspect", str(tmp / "garbage.onnx")], "not an ONNX model"),
        ("not TVM JSON", ["inspect", str(tmp / "garbage.json")], "not a TVM JSON file"),
        ("python program", ["inspect", str(tmp / "program.py")], "run only with --trust-model"),
        ("pickled program", ["inspect", str(tmp / "model.pt2")], "pass --trust-model"),
        (
            "external data missing",
            ["inspect", str(tmp / "external.onnx")],
            "external data file 'external.onnx.data' of tensor",
        ),
        (
            "external data outside the model's directory",
            ["inspect", str(tmp / "existing_dir" / "outside.onnx")],
            "is outside the model's directory",
        ),
        ("no Relay", ["inspect", cnn, "--ir", "relay"], "--ir relay: the installed TVM"),
        ("fq2i without Relay", ["inspect", cnn, "--fq2i"], "--fq2i: FakeQuantizationToInteger"),
        (
            "failed fold: conflicting annotations",
            ["fold", str(tmp / "conflict.json"), "-o", out],
            "conflicting annotations in main: a = fold_allow(lv1)",
        ),
    ]


def _conflicting_module() -> tvm.IRModule:
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2,), "float32")):
            with R.dataflow():
                a = R.fold_allow(R.fold_barrier(R.exp(R.const([1.0, 2.0], "float32"))))
                y = R.add(x, a)
                R.output(y)
            return y

    return Module


def test_bad_input_exits_2_with_one_line_and_writes_nothing(capsys, tmp_path, cnn, monkeypatch):
    _write_inputs(tmp_path)
    (tmp_path / "conflict.json").write_text(tvm.ir.save_json(_conflicting_module()))
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    for name, argv, message in _bad_inputs(tmp_path, str(cnn)):
        status, out, err = invoke(capsys, *argv)
        lines = err.strip().splitlines()
        assert status == 2, (name, err)
        assert len(lines) == 1 and lines[0].startswith("fold-guard"), (name, err)
        assert "error: " in lines[0] and message in lines[0], (name, lines[0])
        assert out == "", name
        assert snapshot(tmp_path) == before, name
    assert not (tmp_path / "program_ran").exists()  # the .py was parsed, never run


def test_a_failed_check_exits_1_and_writes_nothing(capsys, tmp_path, cnn, monkeypatch):
    """The check's comparison itself is tested on arrays (test_cli.py); here its verdict."""
    from fold_guard.cli import _commands
    from fold_guard.cli._check import CheckResult

    monkeypatch.setattr(_commands, "_run_check", lambda *args: CheckResult(0.5, 1e-5, 1))
    (tmp_path / "out.json").write_text("old")
    status, out, err = invoke(
        capsys, "fold", str(cnn), "-o", str(tmp_path / "out.json"), "--report",
        str(tmp_path / "r.json"), "--check",
    )  # fmt: skip
    assert status == 1 and out == "" and "OUTPUTS DIFFER" in err and "nothing was written" in err
    assert snapshot(tmp_path) == {"out.json": b"old"}


# what the options do ----------------------------------------------------------------------------

PLUGIN = """
from fold_guard import Action, FoldPolicy, Rule, register_policy
register_policy(FoldPolicy("test-npu", "a test backend", (
    Rule("keep-every-dequantize", Action.KEEP, "keeps dequantize", lambda call: call.op == "relax.dequantize"),
)))
"""


@pytest.mark.parametrize("form", ["file", "module in the current directory"])
def test_plugins_by_file_or_module(capsys, tmp_path, cnn, monkeypatch, form):
    (tmp_path / "my_npu_plugin.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    plugin = str(tmp_path / "my_npu_plugin.py") if form == "file" else "my_npu_plugin"
    status, out, err = invoke(
        capsys, "inspect", str(cnn), "--plugin", plugin, "-p", "test-npu", "--json"
    )
    assert status == 0, err
    assert json.loads(out)["counts"]["by_reason"]["kept_by_policy"] == 10
    sys.modules.pop("my_npu_plugin", None)
    sys.modules.pop("fold_guard_plugin_my_npu_plugin", None)


def test_max_fold_bytes_takes_human_sizes(capsys, cnn):
    status, out, err = invoke(capsys, "inspect", str(cnn), "--max-fold-bytes", "1KiB", "--json")
    assert status == 0, err
    report = json.loads(out)
    expected = fgr.plan(om.import_relax(onnx.load(str(cnn))), with_budget("default", 1024))
    assert report["counts"]["by_reason"] == {
        r.name.lower(): n for r, n in expected.count_by_reason().items()
    }
    assert report["counts"]["by_reason"]["over_budget"] > 0  # the 2 KiB+ weights stay


@pytest.mark.parametrize(
    "only", [["kept"], ["folded"], ["not-constant"], ["kept-with-input", "folded"]]
)
def test_verbose_only_lists_the_selected_decisions(capsys, cnn, only):
    argv = ["inspect", str(cnn), "-p", "keep-qdq-weights"] + [
        a for o in only for a in ("--only", o)
    ]
    status, out, err = invoke(capsys, *argv)
    assert status == 0, err
    plan = fgr.plan(om.import_relax(onnx.load(str(cnn))), "keep-qdq-weights")
    wanted = selected(only)
    expected = [d.label for d in plan.decisions if category_of(d.reason) in wanted]
    listed = out.split("decisions (", 1)[1].splitlines()[1:]
    assert [line.split()[0].split("/")[1] for line in listed] == expected
    assert f"decisions ({', '.join(only)}: {len(expected)}):" in out


def test_headline_and_sizes_are_read_as_a_person_reads_them(capsys, cnn):
    status, out, _ = invoke(capsys, "inspect", str(cnn), "-p", "keep-qdq-weights")
    assert status == 0
    assert "policy 'keep-qdq-weights': 55 calls: 0 folded, 15 kept, 40 not constant" in out
    # each constant once: the bytes of the imported module's distinct constants (the figure
    # depends on onnxruntime's quantizer, which differs between Pythons: 9.81 KiB on 1.32)
    size = f"{_distinct_constant_bytes(cnn) / 1024:.2f} KiB"
    assert f"constants: {size} before, {size} after" in out
    status, out, _ = invoke(capsys, "inspect", str(cnn))
    assert "largest folds:\n  conv3 = relax.dequantize -> float32[32, 16, 3, 3] (18 KiB)" in out


def test_help_and_version_import_neither_fold_guard_nor_tvm():
    probe = (
        "import sys, _fold_guard_cli\n"
        "for argv in (['--version'], ['--help'], ['fold', '--help'], ['inspect', 'm.onnx', '--atol']):\n"
        "    try:\n"
        "        _fold_guard_cli.main(argv)\n"
        "    except SystemExit as stop:\n"
        "        print('exit', stop.code)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'fold_guard', 'numpy')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]", result.stdout + result.stderr
    assert (
        f"fold-guard {__version__}" in lines[0] and lines.count("exit 0") == 3 and "exit 2" in lines
    )


def test_python_m_help_version_and_usage_error_do_not_import_tvm():
    # `python -m fold_guard` imports the package first; its __init__ skips the adapters under -m
    # and __main__ registers them only once the arguments parse (a command that runs).
    probe = (
        "import runpy, sys\n"
        "for argv in (['--version'], ['--help'], ['fold', '--help'], ['inspect', 'm.onnx', '--atol']):\n"
        "    sys.argv = ['-m', *argv]\n"
        "    for name in [m for m in sys.modules if m.split('.')[0] == 'fold_guard']:\n"
        "        del sys.modules[name]\n"
        "    try:\n"
        "        runpy.run_module('fold_guard', run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as stop:\n"
        "        print('exit', stop.code)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tvm'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]", result.stdout + result.stderr
    assert (
        f"fold-guard {__version__}" in lines[0] and lines.count("exit 0") == 3 and "exit 2" in lines
    )
    # A command that runs still gets the Relax adapter (and so TVM).
    result = subprocess.run(
        [sys.executable, "-m", "fold_guard", "policies"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0 and "keep-qdq-weights" in result.stdout, result.stderr
