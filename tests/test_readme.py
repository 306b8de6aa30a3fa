"""README.md runs as written: every ```python block, and the command's output it shows.

    README.md ──each ```python block──▶ block.py, run as __main__ in a process of its own
                                        ==> exit 0 within the time budget
    README.md ──the `fold-guard demo` lines it shows──▶ each appears, in order, in what
                                                `fold-guard demo` prints today (timings aside)

The blocks run in one interpreter that imports what they import from TVM, NumPy and ONNX once,
then forks a child per block: each block still starts without fold_guard imported (so without
``R.fold_barrier``, a policy registered or anything another block did), in a directory of its
own holding ``model.onnx`` (the demo's QDQ CNN, the file a block that loads "your model" opens),
as a fresh interpreter would; only the import time is shared. Whatever blocks the README has are
run: a block added tomorrow is tested tomorrow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import onnx
import pytest

from fold_guard.cli._demo import qdq_cnn

README = Path(__file__).resolve().parents[1] / "README.md"
#: Per block: an import of TVM, a compile or two of a small model.
BLOCK_SECONDS = 300


def code_blocks(language: str) -> List[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


BLOCKS = code_blocks("python")


def test_the_readme_has_python_blocks():
    # Guards the extraction itself: a broken pattern would make the test below run nothing.
    assert len(BLOCKS) >= 3 and all("import" in block for block in BLOCKS)


#: Runs each block file given as __main__ in a forked child, in the block's directory, its
#: output to ``<block>.out``; prints one "<index> <exit status>" line per block.
_FORKING_RUNNER = """
import os, runpy, sys, traceback
import numpy, onnx, tvm, tvm.relax, tvm.relax.frontend.onnx, tvm.script  # shared by the blocks

for index, path in enumerate(sys.argv[1:]):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.chdir(os.path.dirname(path))
        out = os.open(path + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        status = 0
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    print(index, os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory) -> Dict[int, Tuple[int, str]]:
    """Every block run once: index -> (exit status, what it printed)."""
    paths = []
    for index, block in enumerate(BLOCKS):
        folder = tmp_path_factory.mktemp(f"readme_block_{index}")
        onnx.save(qdq_cnn(), str(folder / "model.onnx"))
        # A file, as a user saves it: TVMScript's decorators read the source of what they parse.
        paths.append(folder / f"readme_block_{index}.py")
        paths[-1].write_text(block)
    result = subprocess.run(
        [sys.executable, "-c", _FORKING_RUNNER, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=BLOCK_SECONDS * len(BLOCKS),
    )
    statuses = dict(map(int, line.split()) for line in result.stdout.splitlines())
    assert result.returncode == 0 and len(statuses) == len(BLOCKS), result.stderr
    return {
        index: (status, Path(f"{paths[index]}.out").read_text())
        for index, status in statuses.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs_as_written(block_runs, index):
    status, printed = block_runs[index]
    assert status == 0, f"README block {index}:\n{BLOCKS[index]}\n{printed}"


@pytest.mark.slow
def test_the_command_line_section_shows_todays_output():
    (shown,) = [block for block in code_blocks("text") if "keep-qdq-weights" in block]
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    printed = iter(line for line in result.stdout.splitlines() if not line.startswith("time: "))
    for line in shown.splitlines():
        assert any(line == out for out in printed), f"README line not in `fold-guard demo`: {line}"
