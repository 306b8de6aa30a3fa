"""Progress on stderr while a command works, only for a person watching a terminal.

A pipe or a file (CI logs, ``2> err.txt``, the tests) gets nothing: progress bars there are
noise, and ``--quiet`` turns them off on a terminal too. ``tqdm`` is imported only when a bar is
shown, so a non-interactive run does not pay for it.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

__all__ = ["Progress"]


class Progress:
    """Named steps of one command, shown as one bar: ``with Progress(steps) as p: p.step("plan")``."""

    def __init__(self, steps: Sequence[str], *, quiet: bool = False, stream: Any = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._steps = list(steps)
        self._enabled = not quiet and bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar: Optional[Any] = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def __enter__(self) -> Progress:
        if self._enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=len(self._steps),
                file=self._stream,
                leave=False,
                unit="step",
                bar_format="{desc:<24} {bar} {n_fmt}/{total_fmt} [{elapsed}]",
            )
        return self

    def step(self, name: str) -> None:
        """Start step ``name``; the previous step counts as done."""
        if self._bar is not None:
            if self._bar.desc:
                self._bar.update(1)
            self._bar.set_description_str(name)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
