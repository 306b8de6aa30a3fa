"""The ```python blocks of a Markdown page, run as a reader pastes them: each a program of its own.

The blocks run in one interpreter that imports what the blocks import from TVM, NumPy and ONNX
once, then forks a child per block: each block still starts without fold_guard imported (so
without ``R.fold_barrier``, a policy registered or anything another block did), in a directory of
its own holding ``model.onnx`` (the demo's QDQ CNN, the file a block that loads "your model"
opens), as a fresh interpreter would; only the import time is shared.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

__all__ = ["code_blocks", "run_blocks"]

#: Per block: an import of TVM, a compile or two of a small model.
BLOCK_SECONDS = 300


def code_blocks(page: Path, language: str) -> List[str]:
    """The fenced blocks of ``language`` in ``page``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.S | re.M)


#: Runs each block file given as __main__ in a forked child, in the block's directory, its
#: output to ``<block>.out``; prints one "<index> <exit status>" line per block.
_FORKING_RUNNER = """
import os, runpy, sys, traceback
import importlib
for name in os.environ["FOLD_GUARD_PRELOAD"].split():   # shared by the blocks
    importlib.import_module(name)

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

#: What the Relax environment's blocks import (the Relay environment passes its own list).
RELAX_PRELOAD = ("numpy", "onnx", "tvm", "tvm.relax", "tvm.relax.frontend.onnx", "tvm.script")


def run_blocks(
    blocks: Sequence[str],
    tmp_path_factory: pytest.TempPathFactory,
    preload: Sequence[str] = RELAX_PRELOAD,
) -> Dict[int, Tuple[int, str]]:
    """Every block run once: index -> (exit status, what it printed)."""
    import os

    import onnx

    from fold_guard.cli._demo import qdq_cnn

    paths = []
    for index, block in enumerate(blocks):
        folder = tmp_path_factory.mktemp(f"block_{index}")
        onnx.save(qdq_cnn(), str(folder / "model.onnx"))
        # A file, as a user saves it: TVMScript's decorators read the source of what they parse.
        paths.append(folder / f"block_{index}.py")
        paths[-1].write_text(block)
    result = subprocess.run(
        [sys.executable, "-c", _FORKING_RUNNER, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=BLOCK_SECONDS * max(len(blocks), 1),
        env={**os.environ, "FOLD_GUARD_PRELOAD": " ".join(preload)},
    )
    statuses = dict(map(int, line.split()) for line in result.stdout.splitlines())
    assert result.returncode == 0 and len(statuses) == len(blocks), result.stderr
    return {
        index: (status, Path(f"{paths[index]}.out").read_text())
        for index, status in statuses.items()
    }
