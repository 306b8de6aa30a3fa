"""A persistent, process-safe cache of compiled fold kernels (compiled code only, never a plan fact).

Most of a cold fold's time is LLVM compiling kernels, and a model folded again (or a similarly
built model: the same op signatures) needs the same kernels. Kernels missing from the cache are
built together once (``tvm.tirx.build``, in parallel parts: see ``link``), linked into one shared
library, and loaded from it; kernels found in the cache are loaded from their library with no
compilation. The cache is keyed by the PrimFunc legalization gave this run, so it can only
give the code of that PrimFunc: what folds is decided before the cache is asked.
The code is the code the JIT would run: the same TIR, built for the same target, so folded
constants are the same bits (the equivalence suites run with the cache on).

Layout under the cache directory (chosen by ``fold_guard.relax._config``)::

    v3/<build>/libs/<sha256 of the file>.so     one library per batch of kernels built together
    v3/<build>/index/<kernel key>.json          {"library", "symbol", "sha256"} for each kernel

``<build>`` digests everything besides the kernel that determines the code: fold_guard's
version, TVM's version and the identity of its installed libraries, LLVM's version and the
target kind. A kernel's key is the SHA-256 of the exact target it is built for (which carries
its optimization level, see ``opt_level``) and of its PrimFunc's digest, the SHA-256 of the
serialized PrimFunc (``tvm.ir.save_json``). Kernels built together share one library whatever
their optimization levels.

Safety: files are written under a temporary name and renamed (atomic on POSIX), so concurrent
processes never see half a file; a library is checked against the digest its index entry
recorded before it is loaded, so a corrupt or truncated entry is detected, removed and rebuilt;
when the libraries exceed the size bound the least recently used are deleted, counting the
libraries of every build and layout in the directory, so that those of an older fold_guard or
TVM go first and the directory stays bounded across upgrades (an index entry whose library is
gone is a miss).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import tvm

from ..._version import __version__ as FOLD_GUARD_VERSION
from .link import build_shared_library

__all__ = ["KernelCache"]

logger = logging.getLogger("fold_guard")

_LAYOUT = "v3"
#: The libraries of every layout and build under the cache directory (v1 and v2 had this shape).
_LIBRARIES_GLOB = "v*/*/libs/*.so"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tvm_build_identity() -> str:
    """TVM's version plus size and mtime of its installed libraries: a rebuilt TVM is another build."""
    return f"{tvm.__version__}|{_libraries_identity(Path(tvm.__file__).parent / 'lib')}"


@functools.lru_cache(maxsize=4)
def _libraries_identity(lib_dir: Path) -> str:
    """Size and mtime of TVM's libraries in ``lib_dir``, and its LLVM's version.

    Read once per process: the libraries this process has loaded are the ones it runs, whatever
    is installed over them later.
    """
    parts = []
    for lib in sorted(lib_dir.glob("libtvm*.so")) if lib_dir.is_dir() else []:
        stat = lib.stat()
        parts.append(f"{lib.name}:{stat.st_size}:{stat.st_mtime_ns}")
    try:
        parts.append(f"llvm{tvm.target.codegen.llvm_version_major()}")
    except Exception:  # noqa: BLE001 - an LLVM-less build has no version to add
        parts.append("llvm?")
    return "|".join(parts)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class _Entry:
    library: str
    symbol: str
    sha256: str


class KernelCache:
    """Compiled kernels on disk, keyed by their PrimFunc and by what builds them.

    ``lookup`` loads what is cached; ``build`` compiles the rest into one library, stores it and
    loads it. Both return ``{key: (runtime module, symbol)}``.
    """

    def __init__(self, root: Union[str, os.PathLike], target: str, *, max_bytes: int):
        self.root = Path(root)
        self.target = target
        self.max_bytes = max_bytes
        build = f"{FOLD_GUARD_VERSION}|{_tvm_build_identity()}|{target}"
        self.dir = self.root / _LAYOUT / hashlib.sha256(build.encode()).hexdigest()[:24]
        self._libs = self.dir / "libs"
        self._index = self.dir / "index"

    @staticmethod
    def digest(prim_func: tvm.tirx.PrimFunc) -> str:
        """SHA-256 of the serialized PrimFunc without ``global_symbol`` (names are ours)."""
        func = (
            prim_func.without_attr("global_symbol")
            if prim_func.attrs and "global_symbol" in prim_func.attrs
            else prim_func
        )
        return hashlib.sha256(tvm.ir.save_json(func).encode()).hexdigest()

    @staticmethod
    def key(digest: str, target: str) -> str:
        """The cache key of the PrimFunc whose :meth:`digest` is ``digest``, built for ``target``."""
        return hashlib.sha256(f"{target}\n{digest}".encode()).hexdigest()

    @staticmethod
    def symbol(key: str) -> str:
        return f"fold_guard_{key[:32]}"

    def lookup(self, keys: List[str]) -> Dict[str, Tuple[Any, str]]:
        """Load every kernel of ``keys`` that is cached and intact; drop entries that are not."""
        entries: Dict[str, _Entry] = {}
        for key in keys:
            entry = self._read_entry(key)
            if entry is not None:
                entries[key] = entry
        found: Dict[str, Tuple[Any, str]] = {}
        loaded: Dict[str, Any] = {}
        for key, entry in entries.items():
            if entry.library not in loaded:
                loaded[entry.library] = self._load_library(entry)
            module = loaded[entry.library]
            if module is None:
                self._remove(self._index / f"{key}.json")
                continue
            found[key] = (module, entry.symbol)
        return found

    def build(
        self, functions: Mapping[str, Tuple[tvm.tirx.PrimFunc, str]], *, threads: int = 1
    ) -> Dict[str, Tuple[Any, str]]:
        """Compile ``{key: (PrimFunc, target)}`` as one library on ``threads``, store and load it."""
        named = {
            self.symbol(key): (func.with_attr("global_symbol", self.symbol(key)), target)
            for key, (func, target) in functions.items()
        }
        self._libs.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._libs, prefix=".tmp-", suffix=".so")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            build_shared_library(named, str(tmp), threads=threads)
            digest = _sha256_file(tmp)
            final = self._libs / f"{digest}.so"
            os.replace(tmp, final)
        except BaseException:
            self._remove(tmp)
            raise
        module = tvm.runtime.load_module(str(final))
        for key in functions:
            entry = {"library": final.name, "symbol": self.symbol(key), "sha256": digest}
            _atomic_write(self._index / f"{key}.json", json.dumps(entry).encode())
        self._evict(keep=final)
        return {key: (module, self.symbol(key)) for key in functions}

    # ------------------------------------------------------------------------------ internals

    def _read_entry(self, key: str) -> Optional[_Entry]:
        path = self._index / f"{key}.json"
        try:
            data = json.loads(path.read_text())
            return _Entry(str(data["library"]), str(data["symbol"]), str(data["sha256"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            logger.debug("fold_guard kernel cache: unreadable index entry %s, rebuilding", path)
            self._remove(path)
            return None

    def _load_library(self, entry: _Entry) -> Optional[Any]:
        path = self._libs / entry.library
        try:
            if _sha256_file(path) != entry.sha256:
                logger.debug(
                    "fold_guard kernel cache: %s does not match its digest, rebuilding", path
                )
                self._remove(path)
                return None
            module = tvm.runtime.load_module(str(path))
            os.utime(path)  # recently used: evicted last
            return module
        except FileNotFoundError:
            return None
        except Exception as err:  # noqa: BLE001 - a library that does not load is rebuilt
            logger.debug("fold_guard kernel cache: %s does not load (%s), rebuilding", path, err)
            self._remove(path)
            return None

    def _evict(self, keep: Path) -> None:
        # Over the whole cache directory: every build (another fold_guard or TVM version) and
        # every older layout keeps its libraries here, and those nothing uses any more are the
        # least recently used; a build's index entries whose library is gone are misses.
        self._trim(self.root, _LIBRARIES_GLOB, max_bytes=self.max_bytes, keep=keep)

    def _trim(
        self,
        directory: Path,
        pattern: str,
        *,
        max_bytes: Optional[int] = None,
        count: Optional[int] = None,
        keep: Optional[Path] = None,
    ) -> None:
        """Delete the least recently used files of ``directory`` beyond ``max_bytes`` or ``count``."""
        files = []
        for path in directory.glob(pattern):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        left = len(files)
        for _, size, path in sorted(files):
            over_bytes = max_bytes is not None and total > max_bytes
            over_count = count is not None and left > count
            if not (over_bytes or over_count):
                break
            if path != keep:
                self._remove(path)
                total -= size
                left -= 1

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
