"""README.md runs as written: every ```python block, and the command's output it shows.

    README.md ──each ```python block──▶ python block.py (fresh interpreter, Relax environment)
                                        ==> exit 0 within the time budget
    README.md ──the `fold-guard demo` lines it shows──▶ each appears, in order, in what
                                                `fold-guard demo` prints today (timings aside)

Blocks run one by one, each in its own process and in a directory holding ``model.onnx`` (the
demo's QDQ CNN), the file a block that loads "your model" opens. Whatever blocks the README has
are run: a block added tomorrow is tested tomorrow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

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


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs_as_written(tmp_path, index):
    onnx.save(qdq_cnn(), str(tmp_path / "model.onnx"))
    # A file, as a user saves it: TVMScript's decorators read the source of what they parse.
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(BLOCKS[index])
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=BLOCK_SECONDS,
    )
    assert result.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{result.stderr}"


@pytest.mark.slow
def test_the_command_line_section_shows_todays_output():
    (shown,) = [block for block in code_blocks("text") if "keep-qdq-weights" in block]
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    printed = iter(line for line in result.stdout.splitlines() if not line.startswith("time: "))
    for line in shown.splitlines():
        assert any(line == out for out in printed), f"README line not in `fold-guard demo`: {line}"
