"""``fold-guard ARGS`` and the examples run inside the test process, as a fresh process would see them.

A subprocess pays for importing TVM and fold_guard (7 CPU-seconds in the Relax environment, 3 in
the Relay one) before it does any work; the tests that check what a command or an example prints
or writes run it here instead. The tests of what only a real process shows (the console script
entry point, ``--help`` without importing TVM, tracebacks under ``--debug``, the README's command)
keep their subprocesses.

What a run could leave behind for the next test is undone: the current directory, ``sys.path``,
the plugin modules it imported, and the policy registry (``policy_registry_scope``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from fold_guard import policy_registry_scope

__all__ = ["run_cli", "run_example"]


@contextlib.contextmanager
def _isolated(cwd: Optional[Union[str, Path]], *, plugins_from_cwd: bool) -> Iterator[None]:
    """Run in ``cwd``; restore the directory, ``sys.path`` and the registry, and forget the plugin
    modules imported (``--plugin FILE.py``; with ``plugins_from_cwd``, modules found in ``cwd``)."""
    old_cwd, old_path, old_modules = os.getcwd(), list(sys.path), set(sys.modules)
    here = os.path.realpath(cwd if cwd is not None else old_cwd)
    try:
        with policy_registry_scope():
            if cwd is not None:
                os.chdir(cwd)
                importlib.invalidate_caches()  # a directory listing cached for another cwd
            yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for name in set(sys.modules) - old_modules:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if name.startswith("fold_guard_plugin_") or (
                plugins_from_cwd and os.path.dirname(os.path.realpath(origin)) == here
            ):
                del sys.modules[name]


def run_cli(*args: str, cwd: Optional[Union[str, Path]] = None) -> subprocess.CompletedProcess:
    """``python -m fold_guard ARGS`` in this process: its exit status, stdout and stderr."""
    from fold_guard.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        _isolated(cwd, plugins_from_cwd=cwd is not None),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            status = main(list(args))
        except SystemExit as stop:  # argparse: usage errors
            status = stop.code if isinstance(stop.code, int) else 1
    return subprocess.CompletedProcess(
        ["fold-guard", *args], status, out.getvalue(), err.getvalue()
    )


def run_example(path: Union[str, Path], argv: Sequence[str] = ()) -> str:
    """``python PATH ARGV`` in this process, from the repository root: what it prints.

    The example runs as ``__main__`` (``runpy``), so its ``if __name__ == "__main__"`` block and
    everything it does at import run exactly as from the command line.
    """
    path = Path(path)
    out = io.StringIO()
    old_argv = sys.argv
    with (
        _isolated(path.resolve().parents[1], plugins_from_cwd=False),
        contextlib.redirect_stdout(out),
    ):
        sys.argv = [str(path), *argv]
        # As ``python PATH`` does: the script's directory first on the path.
        sys.path.insert(0, str(path.resolve().parent))
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as stop:
            assert stop.code in (None, 0), f"{path.name} exited with {stop.code}:\n{out.getvalue()}"
        finally:
            sys.argv = old_argv
    return out.getvalue()
