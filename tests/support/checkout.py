"""A copy of this checkout's source, as a clean clone has it, for the tests that build from it.

Building in the checkout itself would write ``build/`` and ``*.egg-info`` into the working tree
(and a stale ``build/lib`` would end up in the wheel and hide what the tests check).
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["ROOT", "copy_checkout"]

ROOT = Path(__file__).resolve().parents[2]

#: Never copied: environments, caches and earlier build output.
_NOT_SOURCE = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "*.onnx",
    "_build",
)


def copy_checkout(destination: Path) -> Path:
    """Copy the checkout's source files to ``destination`` (which must not exist); return it."""
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    return destination
