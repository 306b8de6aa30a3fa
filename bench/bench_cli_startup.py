"""How long ``fold-guard --help`` and ``--version`` take, against a command that imports TVM.

Each row is the best of ``--repeat`` fresh processes (wall time, ``time.perf_counter`` around
``subprocess.run``):

- ``fold-guard --version``, ``fold-guard --help``, ``fold-guard fold --help``: the console
  script, whose launcher parses the arguments without importing fold_guard or TVM;
- ``fold-guard inspect m.onnx -p keep-qdq-weigths`` (a policy typo), ``fold-guard fold m.onnx
  -o out.txt`` (an output suffix no command writes), ``fold-guard inspect missing.onnx``: bad
  input, answered (exit 2) before TVM is imported (``cli._parser.check_arguments``); the issue
  asks for under 0.5 s;
- ``python -c pass``: the interpreter alone, the floor under any command;
- ``python -m fold_guard --version``: the package entry point, which imports fold_guard (and so
  TVM) before it parses anything; ``python -c "import tvm"`` for reference.

Run from the repository root with the environment's interpreter:

    .venv/bin/python bench/bench_cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple


def best(argv: List[str], repeat: int, status: int = 0) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True)
        times.append(time.perf_counter() - start)
        if result.returncode != status:
            raise SystemExit(f"{argv}: exit {result.returncode}, expected {status}")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    script = str(Path(sys.executable).with_name("fold-guard"))
    with tempfile.TemporaryDirectory(prefix="fold-guard-bench-") as folder:
        model = os.path.join(folder, "m.onnx")
        Path(model).write_bytes(b"")  # never read: the typos are answered before it is
        rows: List[Tuple[str, List[str], int]] = [
            ("fold-guard --version", [script, "--version"], 0),
            ("fold-guard --help", [script, "--help"], 0),
            ("fold-guard fold --help", [script, "fold", "--help"], 0),
            (
                "inspect m.onnx -p <typo>",
                [script, "inspect", model, "-p", "keep-qdq-weigths"],
                2,
            ),
            ("fold m.onnx -o out.txt", [script, "fold", model, "-o", "out.txt"], 2),
            ("inspect missing.onnx", [script, "inspect", "missing.onnx"], 2),
            ("python -c pass", [sys.executable, "-c", "pass"], 0),
            (
                "python -m fold_guard --version",
                [sys.executable, "-m", "fold_guard", "--version"],
                0,
            ),
            ('python -c "import tvm"', [sys.executable, "-c", "import tvm"], 0),
        ]
        results = [(name, best(argv, options.repeat, status)) for name, argv, status in rows]
    slow = dict(results)["python -m fold_guard --version"]
    print(f"{'command':<34} {'best s':>8} {'vs -m fold_guard':>17}")
    for name, seconds in results:
        print(f"{name:<34} {seconds:>8.3f} {seconds / slow:>16.3f}x")


if __name__ == "__main__":
    main()
