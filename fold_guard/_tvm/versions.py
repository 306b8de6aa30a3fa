"""Release numbers, for the adapters' checks of which TVM they run on (no TVM import here)."""

from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["major_minor"]


def major_minor(version: str) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` of a version string, or None when it does not start with two numbers.

    >>> major_minor("0.16.dev0"), major_minor("0.27.0.post1"), major_minor("unknown")
    ((0, 16), (0, 27), None)
    """
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None
