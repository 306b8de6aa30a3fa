"""The one error the command turns into exit status 2 and a single line on stderr."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["EXIT_CHECK_FAILED", "EXIT_OK", "EXIT_USAGE", "CliError", "closest"]

EXIT_OK = 0
#: ``fold --check``: the folded module's outputs differ from the original's.
EXIT_CHECK_FAILED = 1
#: Bad input of any kind: a file, a format, a policy name, an output path (argparse uses 2 too).
EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing failure: ``str(err)`` is the whole line printed, naming the file or argument."""


def closest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the nearest ``choices``, or an empty string.

    >>> closest("keep-qdq-weight", ["default", "keep-qdq-weights", "size-guard"])
    " (did you mean 'keep-qdq-weights'?)"
    """
    matches = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(match) for match in matches) + "?)"
