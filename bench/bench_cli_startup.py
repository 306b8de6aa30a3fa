"""How long ``fold-guard --help`` and ``--version`` take, against a command that imports TVM.

Each row is the best of ``--repeat`` fresh processes (wall time, ``time.perf_counter`` around
``subprocess.run``):

- ``fold-guard --version``, ``fold-guard --help``, ``fold-guard fold --help``: the console
  script, whose launcher parses the arguments without importing fold_guard or TVM;
- ``python -c pass``: the interpreter alone, the floor under any command;
- ``python -m fold_guard --version``: the package entry point, which imports fold_guard (and so
  TVM) before it parses anything; ``python -c "import tvm"`` for reference.

Run from the repository root with the environment's interpreter:

    .venv/bin/python bench/bench_cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple


def best(argv: List[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    script = str(Path(sys.executable).with_name("fold-guard"))
    rows: List[Tuple[str, List[str]]] = [
        ("fold-guard --version", [script, "--version"]),
        ("fold-guard --help", [script, "--help"]),
        ("fold-guard fold --help", [script, "fold", "--help"]),
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -m fold_guard --version", [sys.executable, "-m", "fold_guard", "--version"]),
        ('python -c "import tvm"', [sys.executable, "-c", "import tvm"]),
    ]
    results = [(name, best(argv, options.repeat)) for name, argv in rows]
    slow = dict(results)["python -m fold_guard --version"]
    print(f"{'command':<34} {'best s':>8} {'vs -m fold_guard':>17}")
    for name, seconds in results:
        print(f"{name:<34} {seconds:>8.3f} {seconds / slow:>16.3f}x")


if __name__ == "__main__":
    main()
