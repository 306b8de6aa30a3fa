"""Every run writes all its outputs, complete, or none: each output combination, each failure point.

    outputs:  fold -o M.json | fold -o M.py --report R.json | fold --annotate -o M.json
              --report R.json | draw -o P.html | draw -o P.svg
    failures: the model does not load | the fold fails (conflicting annotations) | writing a
              temporary file fails | renaming one into place fails | interrupted while renaming
    ==> exit 2 (130 when interrupted), every output path as it was (old content or absent), no
        temporary file left; and with no failure, every output written and complete

Runs in-process on a small Relax module saved as TVM JSON (loading it takes milliseconds). The
file-system failures are injected into ``os.replace`` / the temporary-file writer, the only way to
make a rename fail on demand; the model and fold failures are real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr
from fold_guard.cli import _output, main
from fold_guard.cli._errors import CliError
from fold_guard.cli._output import Outputs

W = np.arange(8, dtype="float32").reshape(2, 4)


@I.ir_module
class Small:
    @R.function
    def main(x: R.Tensor((1, 2), "float32")):
        with R.dataflow():
            w = R.multiply(R.const(W), R.const(2.0, "float32"))  # folds
            y = R.matmul(x, w)  # run-time
            R.output(y)
        return y


@I.ir_module
class Conflicting:
    @R.function
    def main(x: R.Tensor((2,), "float32")):
        with R.dataflow():
            a = R.fold_allow(R.fold_barrier(R.exp(R.const([1.0, 2.0], "float32"))))
            y = R.add(x, a)
            R.output(y)
        return y


#: (name, command arguments after the model, {option: output file name})
COMBINATIONS: List[Tuple[str, List[str], Dict[str, str]]] = [
    ("fold -o json", ["fold", "-o", "{out}/m.json"], {"-o": "m.json"}),
    (
        "fold -o py --report",
        ["fold", "-o", "{out}/m.py", "--report", "{out}/r.json"],
        {"-o": "m.py", "--report": "r.json"},
    ),
    (
        "fold --annotate -o --report",
        ["fold", "--annotate", "-o", "{out}/m.json", "--report", "{out}/r.json"],
        {"-o": "m.json", "--report": "r.json"},
    ),
    ("draw html", ["draw", "-o", "{out}/p.html"], {"-o": "p.html"}),
    ("draw svg", ["draw", "-o", "{out}/p.svg"], {"-o": "p.svg"}),
]
FAILURES = [
    "model does not load",
    "fold fails",
    "temporary write fails",
    "rename fails",
    "interrupted",
]


def _argv(args: List[str], model: Path, out: Path) -> List[str]:
    return [args[0], str(model)] + [a.format(out=out) for a in args[1:]]


def _listing(folder: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def models(tmp_path) -> Dict[str, Path]:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "small.json").write_text(tvm.ir.save_json(Small))
    (folder / "conflicting.json").write_text(tvm.ir.save_json(Conflicting))
    return {"small": folder / "small.json", "conflicting": folder / "conflicting.json"}


def _inject(failure: str, last: str, monkeypatch) -> None:
    """Make writing the run's last output fail (the others are staged, or already in place)."""
    real_replace, real_write = os.replace, _output._write_temporary

    def replace(src: str, dst: str) -> None:
        if os.path.basename(dst) == last:
            raise (
                KeyboardInterrupt()
                if failure == "interrupted"
                else OSError(28, "No space left on device")
            )
        real_replace(src, dst)

    def write(claim, text: str) -> str:
        if os.path.basename(claim.path) == last:
            raise OSError(28, "No space left on device")
        return real_write(claim, text)

    if failure in ("rename fails", "interrupted"):
        monkeypatch.setattr(_output.os, "replace", replace)
    if failure == "temporary write fails":
        monkeypatch.setattr(_output, "_write_temporary", write)


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("combination", COMBINATIONS, ids=[c[0] for c in COMBINATIONS])
def test_a_failed_run_leaves_every_output_as_it_was(
    tmp_path, models, monkeypatch, capsys, combination, failure
):
    _, args, files = combination
    out = tmp_path / "out"
    out.mkdir()
    # One output already exists (its old content must survive), the others do not.
    first = next(iter(files.values()))
    (out / first).write_text("old content")
    before = _listing(out)
    model = models["conflicting" if failure == "fold fails" else "small"]
    if failure == "model does not load":
        model = model.with_name("missing.json")
    _inject(failure, list(files.values())[-1], monkeypatch)
    status = main(_argv(args, model, out))
    err = capsys.readouterr().err
    assert status == (130 if failure == "interrupted" else 2), err
    assert _listing(out) == before, failure  # old content kept, nothing new, no temporary file
    if failure in ("temporary write fails", "rename fails"):
        assert "No space left on device; nothing was written" in err


@pytest.mark.parametrize("combination", COMBINATIONS, ids=[c[0] for c in COMBINATIONS])
def test_a_run_that_succeeds_writes_every_output_complete(tmp_path, models, capsys, combination):
    _, args, files = combination
    out = tmp_path / "out"
    out.mkdir()
    (out / next(iter(files.values()))).write_text("old content")
    assert main(_argv(args, models["small"], out)) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(files.values())
    folded = fgr.fold(Small).mod
    for name in files.values():
        text = (out / name).read_text()
        if name == "r.json":
            assert json.loads(text)["calls"] == 2
        elif name == "m.json" and "--annotate" not in args:
            tvm.ir.assert_structural_equal(tvm.ir.load_json(text), folded)
        elif name == "m.json":
            tvm.ir.assert_structural_equal(tvm.ir.load_json(text), fgr.annotate(Small).mod)
        elif name == "m.py":
            assert text.startswith("# Written by fold-guard") and "R.matmul" in text
        elif name == "p.html":
            assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
        else:
            assert text.startswith("<svg") and text.endswith("</svg>")


def test_outputs_roll_back_replaced_files_when_a_later_rename_fails(tmp_path, monkeypatch):
    """Two outputs, both existing: the first is replaced, the second rename fails ==> both old."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("old a")
    b.write_text("old b")
    outputs = Outputs()
    outputs.claim("-o", str(a))
    outputs.claim("--report", str(b))
    real = os.replace

    def replace(src, dst):
        if dst == str(b):
            raise OSError(13, "Permission denied")
        return real(src, dst)

    monkeypatch.setattr(_output.os, "replace", replace)
    with pytest.raises(CliError, match=r"--report .*b\.json: cannot write: Permission denied"):
        outputs.commit({"-o": "new a", "--report": "new b"})
    assert _listing(tmp_path) == {"a.json": b"old a", "b.json": b"old b"}
    monkeypatch.setattr(_output.os, "replace", real)
    outputs.commit({"-o": "new a", "--report": "new b"})
    assert _listing(tmp_path) == {"a.json": b"new a", "b.json": b"new b"}


def test_outputs_refuse_a_path_claimed_twice_or_through_a_link(tmp_path):
    (tmp_path / "real.json").write_text("x")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    outputs = Outputs()
    outputs.claim("-o", str(tmp_path / "real.json"))
    for other in (tmp_path / "real.json", tmp_path / "link.json", tmp_path / "." / "real.json"):
        with pytest.raises(CliError, match="the same file as -o"):
            outputs.claim("--report", str(other))
    assert _listing(tmp_path) == {"link.json": b"x", "real.json": b"x"}
