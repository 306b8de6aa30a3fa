"""``fold-guard``: the command line of fold_guard (also ``python -m fold_guard``).

One module per job: :mod:`._parser` (arguments; standard library only, so the console script's
launcher ``_fold_guard_cli`` answers ``--help`` without importing TVM), :mod:`._load` (model
files, with the frontend node each call comes from: ``fold_guard.relax.frontends._layers``),
:mod:`._commands` (what each subcommand does with the library), :mod:`._output` (all-or-nothing writes), :mod:`._check`
(``fold --check``), :mod:`._categories` (how decisions are grouped), :mod:`._draw` (the
picture), :mod:`._offload` (``offload`` and ``draw --backend``), :mod:`._progress` (the progress
bar). ``report.schema.json`` beside them is the JSON Schema of ``inspect --json``,
``offload.schema.json`` that of ``offload --json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence, TextIO

from .._core.errors import FoldGuardError
from ._errors import EXIT_OK, EXIT_USAGE, CliError

__all__ = ["EXIT_INTERNAL", "EXIT_USAGE", "SCHEMA_PATH", "main", "run_parsed"]

#: An error that is fold_guard's or TVM's, not the user's.
EXIT_INTERNAL = 3
SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "report.schema.json")


def main(argv: Optional[Sequence[str]] = None, *, out: Optional[TextIO] = None) -> int:
    """Run ``fold-guard`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    from ._parser import build_parser, check_arguments

    args = build_parser().parse_args(argv)
    problem = check_arguments(args)
    if problem is not None:
        print(f"fold-guard: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return run_parsed(args, out=out)


def run_parsed(args: argparse.Namespace, *, out: Optional[TextIO] = None) -> int:
    """Run the command ``args`` describes (from :func:`._parser.build_parser`); the exit status."""
    from ._commands import run_command

    try:
        return run_command(args, out or sys.stdout)
    except (CliError, FoldGuardError) as err:
        # A library error here is bad input too (a module that does not type-check, a conflict
        # of annotations): one line that names it, the traceback only on request.
        if args.debug:
            raise
        print(f"fold-guard: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (``| head``); what is left of the output has nowhere to go.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("fold-guard: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            raise
        print(
            f"fold-guard: internal error: {type(err).__name__}: {_one_line(err)} (rerun with --debug)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 600 else text[:597] + "..."
