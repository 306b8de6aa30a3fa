"""How many examples a property test draws under the loaded hypothesis profile.

The profiles are registered in the root ``conftest.py`` (pytest's ``--hypothesis-profile NAME``):

- ``full`` (hypothesis's ``max_examples=100``, as plain ``pytest`` outside CI): every test draws
  the count it writes, ``examples(200)`` 200;
- ``ci`` (hypothesis's own CI profile, derandomized, with ``max_examples=25``; loaded when
  ``CI=true`` and by ``scripts/test.sh``): a quarter of it, at least ``min(count, 5)``.

A test writes its full count once; the profile scales it (``count * max_examples / 100``), so a
longer profile (``max_examples=1000``) scales every test up alike.

>>> examples(200, profile_examples=25), examples(15, profile_examples=25), examples(3, 25)
(50, 5, 3)
"""

from __future__ import annotations

from typing import Optional

from hypothesis import settings

__all__ = ["FULL_PROFILE_EXAMPLES", "examples"]

#: The ``max_examples`` of the full profile: a test's count is what it draws there.
FULL_PROFILE_EXAMPLES = 100
#: No test draws fewer than this (or its full count, if smaller) under a lighter profile.
FEWEST = 5


def examples(full: int, profile_examples: Optional[int] = None) -> int:
    """``full`` scaled to the loaded profile (or to one of ``profile_examples`` examples):
    ``full`` under ``full``, a quarter under ``ci``."""
    if profile_examples is None:
        profile_examples = settings().max_examples
    scaled = full * profile_examples // FULL_PROFILE_EXAMPLES
    return max(scaled, min(full, FEWEST))
