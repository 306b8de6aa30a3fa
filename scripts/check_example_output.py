"""Run an example as examples/README.md says and report the shown lines it no longer prints.

The tests check every example they run (tests/test_examples.py). Three blocks show runs too large
for CI; check them by hand after a change that could move them, and paste the new output:

    .venv/bin/python scripts/check_example_output.py examples/intree_tables.py
    .venv/bin/python scripts/check_example_output.py examples/lowbit_llm.py
    .venv310/bin/python scripts/check_example_output.py examples/relay_intree_tables.py \\
        --model mobilenet_v2 --model resnet50 --model bert_tiny

Exit status 0 when every shown line is printed (timings aside), 1 otherwise (the lines listed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.example_output import shown_output, stale_lines  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="examples/NAME.py")
    parser.add_argument(
        "--model", action="append", default=[], help="run once per model (relay_intree_tables)"
    )
    args = parser.parse_args()
    script = ROOT / args.script
    runs = [["--model", model] for model in args.model] or [[]]
    printed = []
    for extra in runs:
        result = subprocess.run(
            [sys.executable, str(script), *extra], capture_output=True, text=True, cwd=ROOT
        )
        if result.returncode != 0:
            print(result.stdout + result.stderr)
            return 1
        printed += result.stdout.splitlines()
    stale = stale_lines(shown_output(script.name), printed)
    for line in stale:
        print(f"not printed today: {line}")
    print(f"{script.name}: {'current' if not stale else f'{len(stale)} stale line(s)'}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
