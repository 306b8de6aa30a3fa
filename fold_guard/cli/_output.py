"""Writing results: all or nothing, so a failed run never leaves a half-written file at OUT."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping

from ._errors import CliError

__all__ = ["MODULE_SUFFIXES", "check_writable", "module_text", "write_atomically", "write_json"]

#: What ``fold -o OUT`` can write, by suffix.
MODULE_SUFFIXES = (".json", ".py")

# A .py file that runs on its own (``python OUT.py``, or ``fold-guard inspect OUT.py``): the
# printed module refers to ``tvm`` for its metadata and to R.fold_barrier / R.fold_allow, which
# exist once fold_guard is imported.
_TVMSCRIPT_HEADER = """# Written by fold-guard. Importing fold_guard registers R.fold_barrier / R.fold_allow.
import tvm
import fold_guard  # noqa: F401
from tvm.script import ir as I
from tvm.script import relax as R

"""


def check_writable(path: str, what: str) -> None:
    """Fail before any work when ``path``'s directory cannot take a new file."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{what} {path}: is a directory")
    if not os.path.isdir(directory):
        raise CliError(f"{what} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise CliError(f"{what} {path}: directory {directory} is not writable")


def write_atomically(path: str, text: str, what: str = "output") -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``.

    A rename within one directory is atomic, so ``path`` holds either its old content or all of
    the new one, whatever fails (a full disk, an interrupt).
    """
    check_writable(path, what)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        handle, tmp = tempfile.mkstemp(prefix=".fold-guard-", suffix=".tmp", dir=directory)
    except OSError as err:
        raise CliError(f"{what} {path}: cannot write: {err.strerror}") from err
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        # mkstemp makes the file private (0600); give it the mode any new file would get.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as err:
        raise CliError(f"{what} {path}: cannot write: {err.strerror}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: str, data: Mapping[str, Any], what: str = "output") -> None:
    write_atomically(path, json.dumps(data) + "\n", what)


def module_text(mod: Any, path: str, ir: str) -> str:
    """``mod`` as the file ``path`` asks for: TVM JSON (``.json``) or TVMScript (``.py``)."""
    import tvm

    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".json":
        return tvm.ir.save_json(mod)
    if suffix == ".py" and ir == "relax":
        return _TVMSCRIPT_HEADER + mod.script(show_meta=True)
    if suffix == ".py":
        raise CliError(
            f"-o {path}: TVMScript output is for Relax modules; write a Relay module as .json"
        )
    raise CliError(
        f"-o {path}: unknown output format; use .json (tvm.ir.save_json) or .py (TVMScript)"
    )
