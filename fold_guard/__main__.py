"""``python -m fold_guard``: the ``fold-guard`` command.

The arguments are parsed first (``cli._parser`` is standard library only; the package's
``__init__`` skips its TVM import under ``-m``), so ``--help``, ``--version`` and a usage error
answer in a few hundredths of a second; TVM is imported only for a command that runs.
"""

import sys

from . import _register_available_adapters
from ._version import __version__
from .cli import EXIT_USAGE, run_parsed
from .cli._parser import build_parser, check_arguments


def main() -> int:
    """Parse ``sys.argv[1:]``, register the adapters (imports TVM), run the command."""
    args = build_parser(__version__).parse_args()  # --help, --version, usage errors exit here
    problem = check_arguments(args)  # what shows without TVM: before it is imported
    if problem is not None:
        print(f"fold-guard: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    _register_available_adapters()
    return run_parsed(args)


# Guarded so that importing this module (pytest's --doctest-modules does) runs nothing.
if __name__ == "__main__":
    sys.exit(main())
