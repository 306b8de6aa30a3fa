"""The one error the command turns into exit status 2 and a single line on stderr."""

from __future__ import annotations

from ._parser import closest

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_OK",
    "EXIT_UNFOLDED_UNBUILDABLE",
    "EXIT_USAGE",
    "CliError",
    "closest",
]

EXIT_OK = 0
#: ``fold --check``: the folded module's outputs differ from the original's.
EXIT_CHECK_FAILED = 1
#: Bad input of any kind: a file, a format, a policy name, an output path (argparse uses 2 too).
EXIT_USAGE = 2
#: ``fold --check``: TVM cannot build the *unfolded* module, so there is nothing to compare
#: with; the fold is written all the same (3 is fold_guard's own internal error).
EXIT_UNFOLDED_UNBUILDABLE = 4


class CliError(Exception):
    """A user-facing failure: ``str(err)`` is the whole line printed, naming the file or argument."""
