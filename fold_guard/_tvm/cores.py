"""One TVM core per process: apache-tvm beside apache-tvm-tirx, said in one line before it aborts.

apache/tvm's main branch moved TVM's core into apache-tvm-tirx (import name ``tvm_tirx``, no
Relax). Both it and apache-tvm 0.27 (``tvm``) register TVM's global functions in one process-wide
table, so importing the second one aborts the interpreter (rc 134: "Global Function
`device_api.cpu` is already registered"), in either order, with no Python exception to catch.
They also pin apache-tvm-ffi apart: tirx needs >= 0.1.15.post1, fold_guard's Relax adapter
< 0.1.15 (``tvm.ir.save_json`` segfaults on 0.27 with 0.1.15), so one of the two is broken in any
environment that holds both.

This module reads only ``sys.modules`` and installed distributions' metadata (no TVM import), so
the check runs before anything of fold_guard imports ``tvm``:

- ``import fold_guard`` with ``tvm_tirx`` imported: a warning of one line, and the Relax adapter
  is not imported (it would import ``tvm`` and abort);
- ``import fold_guard.relax`` (or ``.relay``) then: :class:`UnsupportedIRError` with that line;
- ``apache-tvm-tirx`` installed beside ``apache-tvm`` but not imported: a warning of one line;
- ``import tvm_tirx`` after fold_guard imported ``tvm``: an ImportError with that line, raised by
  a finder fold_guard puts in front of ``sys.meta_path`` (it answers for ``tvm_tirx`` alone).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import warnings
from typing import Any, Optional, Sequence

from .._core.errors import UnsupportedIRError

__all__ = [
    "TIRX_DISTRIBUTION",
    "TIRX_MODULE",
    "TVMCoreConflictWarning",
    "check_no_second_core",
    "conflict",
    "guard_tirx_import",
    "warn_about_conflict",
]

TIRX_MODULE = "tvm_tirx"
TIRX_DISTRIBUTION = "apache-tvm-tirx"
#: What to do, the same in every message.
_ADVICE = (
    "use separate environments (fold_guard needs apache-tvm 0.27 and apache-tvm-ffi<0.1.15; "
    "pip uninstall apache-tvm-tirx in this one)"
)


class TVMCoreConflictWarning(UserWarning):
    """apache-tvm-tirx is imported or installed beside the apache-tvm fold_guard runs on."""


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def conflict(*, tvm_imported: Optional[bool] = None) -> Optional[str]:
    """The one line saying what conflicts and what to do, or None when nothing does.

    ``tvm_imported`` says whether ``tvm`` (apache-tvm's core) is loaded; by default, whether it is
    in ``sys.modules``.

    >>> conflict() is None  # this environment has no apache-tvm-tirx
    True
    """
    tirx_imported = TIRX_MODULE in sys.modules
    tirx = _version(TIRX_DISTRIBUTION)
    if not tirx_imported and tirx is None:
        return None
    tirx = tirx or "(version unknown)"
    tvm = _version("apache-tvm") or "(not installed)"
    ffi = _version("apache-tvm-ffi") or "(not installed)"
    if tvm_imported is None:
        tvm_imported = "tvm" in sys.modules
    if tirx_imported:
        what = f"tvm_tirx ({TIRX_DISTRIBUTION} {tirx}) is imported in this process"
        why = f"apache-tvm {tvm} cannot load beside it (two TVM cores abort the process)"
    elif tvm_imported:
        what = f"{TIRX_DISTRIBUTION} {tirx} is installed beside apache-tvm {tvm}, which is loaded"
        why = "importing tvm_tirx now would abort the process (two TVM cores)"
    else:
        what = f"{TIRX_DISTRIBUTION} {tirx} is installed beside apache-tvm {tvm}"
        why = (
            "the two cannot share a process and need different apache-tvm-ffi "
            f"(tirx >=0.1.15.post1, fold_guard <0.1.15; installed {ffi})"
        )
    return f"fold_guard: {what}: {why}; {_ADVICE}"


def warn_about_conflict() -> Optional[str]:
    """Warn (one line, :class:`TVMCoreConflictWarning`) if :func:`conflict` finds one; return it."""
    line = conflict()
    if line is not None:
        warnings.warn(line, TVMCoreConflictWarning, stacklevel=3)
    return line


def check_no_second_core() -> None:
    """Raise :class:`UnsupportedIRError` before an adapter imports ``tvm`` next to ``tvm_tirx``."""
    if TIRX_MODULE in sys.modules:
        raise UnsupportedIRError(conflict())


class _TirxImportGuard(importlib.abc.MetaPathFinder):
    """Refuses ``import tvm_tirx`` once apache-tvm's ``tvm`` is loaded (it would abort)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> None:
        if fullname == TIRX_MODULE and "tvm" in sys.modules:
            line = conflict(tvm_imported=True)
            if line is not None:  # else it is not installed: Python's own ModuleNotFoundError
                raise ImportError(line, name=TIRX_MODULE)
        return None


def guard_tirx_import() -> None:
    """Put the finder that refuses ``tvm_tirx`` after ``tvm`` in front of ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _TirxImportGuard) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TirxImportGuard())
