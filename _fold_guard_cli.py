"""The ``fold-guard`` console script: arguments first, fold_guard (and so TVM) only to run a command.

Importing any module of the ``fold_guard`` package runs ``fold_guard/__init__.py``, which imports
TVM (seconds) so that the annotation ops are registered. This launcher lives outside the package
and loads the two standard-library-only files the parser needs (``fold_guard/_version.py`` and
``fold_guard/cli/_parser.py``) by path, so ``fold-guard --help``, ``--version`` and a usage error
never import TVM; a command that runs imports ``fold_guard.cli`` and hands it the parsed arguments.
``python -m fold_guard`` does the same from inside the package (``fold_guard/__main__.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["main"]


def _package_file(relative: str, name: str) -> ModuleType:
    """Execute ``fold_guard/<relative>`` as a module ``name``, without importing ``fold_guard``."""
    # find_spec of a top-level name locates the package (installed or editable) without running it.
    spec = importlib.util.find_spec("fold_guard")
    for directory in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(directory, *relative.split("/"))
        file_spec = importlib.util.spec_from_file_location(name, path)
        if os.path.isfile(path) and file_spec is not None and file_spec.loader is not None:
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    raise ImportError(f"fold_guard/{relative} not found: is fold-guard installed?")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then run the command; return its exit status."""
    version = _package_file("_version.py", "_fold_guard_version").__version__
    parsing = _package_file("cli/_parser.py", "_fold_guard_parser")
    args = parsing.build_parser(version).parse_args(argv)  # --help, --version, usage errors exit
    # What can be told without TVM (a missing model, a policy typo, an output suffix) answers now.
    problem = parsing.check_arguments(args)
    if problem is not None:
        print(f"fold-guard: error: {problem}", file=sys.stderr)
        return 2
    from fold_guard.cli import run_parsed

    return run_parsed(args)


if __name__ == "__main__":
    sys.exit(main())
