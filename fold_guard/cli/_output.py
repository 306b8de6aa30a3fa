"""Writing results: every output of a run, complete, or none of them.

A command *claims* its outputs before any work (:meth:`Outputs.claim`: the path is new to this
run, its directory exists and takes a file), and writes them only once every step succeeded
(:meth:`Outputs.commit`): each text goes to a temporary file beside its target first, and only
when all are written are they renamed into place. A rename within a directory is atomic; if one
of several fails, the targets already replaced get their old content back (kept as a hard link,
or a copy, until the commit ends), so a failed run leaves every path as it found it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._errors import CliError
from ._parser import MODULE_SUFFIXES

__all__ = ["MODULE_SUFFIXES", "Outputs", "module_text"]

_TEMPORARY_PREFIX = ".fold-guard-"

# A .py file that runs on its own (``python OUT.py``, or ``fold-guard inspect OUT.py``): the
# printed module refers to ``tvm`` for its metadata and to R.fold_barrier / R.fold_allow, which
# exist once fold_guard is imported.
_TVMSCRIPT_HEADER = """# Written by fold-guard. Importing fold_guard registers R.fold_barrier / R.fold_allow.
import tvm
import fold_guard  # noqa: F401
from tvm.script import ir as I
from tvm.script import relax as R

"""


@dataclass(frozen=True)
class _Claim:
    option: str
    path: str


class Outputs:
    """The files one run writes, claimed up front and written together at the end."""

    def __init__(self) -> None:
        self._claims: List[_Claim] = []

    def claim(self, option: str, path: str, suffixes: Optional[Tuple[str, ...]] = None) -> None:
        """Reserve ``path`` for ``option``'s output, or raise :class:`CliError` before any work.

        Refused: a suffix not in ``suffixes``; a path another option of this run claimed (by
        its real path, or the same file through a link); a directory; a directory that does not
        exist or does not take a new file (tried by creating one, which also catches ``/proc``
        and read-only file systems, where permission bits alone say yes to root).
        """
        if os.path.isdir(path):
            raise CliError(f"{option} {path}: is a directory")
        if suffixes is not None and os.path.splitext(path)[1].lower() not in suffixes:
            raise CliError(f"{option} {path}: unknown output format; use {' or '.join(suffixes)}")
        for other in self._claims:
            if _same_file(other.path, path):
                raise CliError(
                    f"{option} {path}: the same file as {other.option} {other.path}; "
                    "give each output its own path"
                )
        directory = _directory(path)
        if not os.path.isdir(directory):
            raise CliError(f"{option} {path}: directory {directory} does not exist")
        try:
            handle, probe = tempfile.mkstemp(prefix=_TEMPORARY_PREFIX, dir=directory)
            os.close(handle)
            os.unlink(probe)
        except OSError as err:
            raise CliError(
                f"{option} {path}: cannot write in {directory}: {err.strerror or err}"
            ) from err
        self._claims.append(_Claim(option, path))

    def commit(self, texts: Mapping[str, str]) -> None:
        """Write ``texts`` (claimed option -> content) to their paths: all of them, or none."""
        if set(texts) != {claim.option for claim in self._claims}:
            raise ValueError(f"commit needs exactly the claimed outputs, got {sorted(texts)}")
        staged: List[Tuple[_Claim, str]] = []
        backups: Dict[str, Optional[str]] = {}
        replaced: List[_Claim] = []
        try:
            # Step 1: every text in a temporary file beside its target (nothing visible yet).
            for claim in self._claims:
                staged.append((claim, _write_temporary(claim, texts[claim.option])))
            # Step 2: keep the old content of each target, then rename the new one over it.
            for claim, temporary in staged:
                backups[claim.path] = _backup(claim)
                os.replace(temporary, claim.path)
                replaced.append(claim)
        except BaseException as err:
            _roll_back(replaced, backups)
            if isinstance(err, OSError):
                failed = next(
                    (claim for claim, _ in staged if claim not in replaced), self._claims[-1]
                )
                raise CliError(
                    f"{failed.option} {failed.path}: cannot write: {err.strerror or err}; "
                    "nothing was written"
                ) from err
            raise
        finally:
            for _, temporary in staged:
                _remove(temporary)
            for backup in backups.values():
                if backup is not None:
                    _remove(backup)


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet: different files
        return False


def _write_temporary(claim: _Claim, text: str) -> str:
    handle, temporary = tempfile.mkstemp(
        prefix=_TEMPORARY_PREFIX, suffix=".tmp", dir=_directory(claim.path)
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        # mkstemp makes the file private (0600); give it the mode any new file would get.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
    except BaseException:
        _remove(temporary)
        raise
    return temporary


def _backup(claim: _Claim) -> Optional[str]:
    """A second name for the target's current content, or None when it does not exist yet."""
    if not os.path.lexists(claim.path):
        return None
    backup = os.path.join(_directory(claim.path), f"{_TEMPORARY_PREFIX}{secrets.token_hex(8)}.old")
    try:
        os.link(claim.path, backup)
    except OSError:  # no hard links here (some network and FUSE file systems): a copy
        shutil.copy2(claim.path, backup)
    return backup


def _roll_back(replaced: List[_Claim], backups: Mapping[str, Optional[str]]) -> None:
    for claim in reversed(replaced):
        backup = backups.get(claim.path)
        if backup is None:
            _remove(claim.path)
        else:
            os.replace(backup, claim.path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def module_text(mod: Any, path: str, ir: str) -> str:
    """``mod`` as the file ``path`` asks for: TVM JSON (``.json``) or TVMScript (``.py``)."""
    import tvm

    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".py" and ir != "relax":
        raise CliError(
            f"-o {path}: TVMScript output is for Relax modules; write a Relay module as .json"
        )
    if suffix == ".py":
        return _TVMSCRIPT_HEADER + mod.script(show_meta=True)
    return tvm.ir.save_json(mod)
