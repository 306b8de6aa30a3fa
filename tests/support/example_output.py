"""The output examples/README.md shows for a script, checked against what it prints today.

Each output block there follows a line ``<!-- output: examples/NAME.py [args] -->``. A shown line
must appear in the printed output, in order; times are masked (``1530 ms``, ``0.02 s``: they vary
run to run) and so is the alignment around them, and a shown line ending in ``...`` matches any
printed line it begins (the README cuts long rule descriptions). The examples' tests call
:func:`assert_shown_output_is_current` on what they ran; ``scripts/check_example_output.py`` runs
the examples too large for CI (their blocks show a bigger run) and reports the same.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Sequence

__all__ = ["README", "assert_shown_output_is_current", "shown_output", "stale_lines"]

README = Path(__file__).resolve().parents[2] / "examples" / "README.md"
_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b")


def shown_output(script: str) -> str:
    """The block after ``<!-- output: examples/<script> ...-->``."""
    match = re.search(
        rf"^<!-- output: examples/{re.escape(script)}\b.*?-->\n```[a-z]*\n(.*?)^```",
        README.read_text(),
        re.S | re.M,
    )
    assert match, f"examples/README.md shows no output of {script}"
    return match.group(1)


def _normal(line: str) -> str:
    # Times masked, and runs of spaces made one: a column right-aligns a time of another width.
    return re.sub(r"\s+", " ", _TIME.sub("<time>", line)).strip()


def stale_lines(shown: str, printed: Sequence[str]) -> List[str]:
    """The shown lines that are not in ``printed`` (in order); [] when the block is current."""
    remaining = iter([_normal(line) for line in printed])
    stale = []
    for line in shown.splitlines():
        want = _normal(line)
        if not want:  # a blank line only spaces the block (one run per model prints none)
            continue
        if want.endswith("..."):
            found = any(out.startswith(want[:-3]) for out in remaining)
        else:
            found = any(out == want for out in remaining)
        if not found:
            stale.append(line)
            remaining = iter([_normal(line) for line in printed])  # look for the rest afresh
    return stale


def assert_shown_output_is_current(script: str, printed: str) -> None:
    stale = stale_lines(shown_output(script), printed.splitlines())
    assert stale == [], (
        f"examples/README.md shows lines {script} no longer prints (rerun it and update the "
        f"block): {stale}\n--- printed today:\n{printed}"
    )
