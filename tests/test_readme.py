"""README.md runs as written: every ```python block, and the command's output it shows.

    README.md ──each ```python block──▶ block.py, run as __main__ in a process of its own
                                        ==> exit 0 within the time budget
    README.md ──the `fold-guard demo` lines it shows──▶ each appears, in order, in what
                                                `fold-guard demo` prints today (timings aside)

The blocks run as ``support.codeblocks`` runs a page's blocks: each a program of its own, in a
directory holding ``model.onnx`` (the demo's QDQ CNN). Whatever blocks the README has are run: a
block added tomorrow is tested tomorrow. The site's pages are run the same way
(``tests/test_docs.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest
from support.codeblocks import code_blocks, run_blocks

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = code_blocks(README, "python")


def test_the_readme_has_python_blocks():
    # Guards the extraction itself: a broken pattern would make the test below run nothing.
    assert len(BLOCKS) >= 1 and all("import" in block for block in BLOCKS)


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory) -> Dict[int, Tuple[int, str]]:
    """Every block run once: index -> (exit status, what it printed)."""
    return run_blocks(BLOCKS, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs_as_written(block_runs, index):
    status, printed = block_runs[index]
    assert status == 0, f"README block {index}:\n{BLOCKS[index]}\n{printed}"


@pytest.mark.slow
def test_the_command_line_section_shows_todays_output():
    (shown,) = [block for block in code_blocks(README, "text") if "keep-qdq-weights" in block]
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    printed = iter(line for line in result.stdout.splitlines() if not line.startswith("time: "))
    for line in shown.splitlines():
        assert any(line == out for out in printed), f"README line not in `fold-guard demo`: {line}"
