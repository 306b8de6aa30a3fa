"""A persistent, process-safe cache of compiled fold kernels.

Most of a fold's time is LLVM compiling kernels, and a model folded again (or a similarly built
model: the same op signatures) needs the same kernels. Kernels missing from the cache are built
together once (``tvm.tirx.build``, in parallel parts: see ``_shared_library``), linked into one
shared library, and loaded from it; kernels found in the cache are loaded from their library with no compilation.
The code is the code the JIT would run: the same TIR, built for the same target, so folded
constants are the same bits (the equivalence suites run with the cache on).

Layout under the cache directory (``$FOLD_GUARD_CACHE_DIR``, else
``$XDG_CACHE_HOME/fold_guard``, else ``~/.cache/fold_guard``)::

    v2/<build>/libs/<sha256 of the file>.so     one library per batch of kernels built together
    v2/<build>/index/<kernel key>.json          {"library", "symbol", "sha256"} for each kernel
    v2/<build>/legalized/<request key>.json     what a kernel request legalized to (``_legalized``)

``<build>`` digests everything besides the kernel that determines the code: fold_guard's
version, TVM's version and the identity of its installed libraries, LLVM's version and the
target kind. A kernel's key is the SHA-256 of the exact target it is built for (which carries
its optimization level, see ``_opt_level``) and of its PrimFunc's digest, the SHA-256 of the
serialized PrimFunc (``tvm.ir.save_json``). Kernels built together share one library whatever
their optimization levels.

Safety: files are written under a temporary name and renamed (atomic on POSIX), so concurrent
processes never see half a file; a library is checked against the digest its index entry
recorded before it is loaded, so a corrupt or truncated entry is detected, removed and rebuilt;
when the libraries exceed the size bound the least recently used are deleted, counting the
libraries of every build and layout in the directory, so that those of an older fold_guard or
TVM go first and the directory stays bounded across upgrades (an index entry whose library is
gone is a miss), and beyond :data:`MAX_LEGALIZED_ENTRIES` legalization
records the least recently used are deleted too (checked about once per 256 new records).
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

from .. import __version__ as FOLD_GUARD_VERSION
from .._core.errors import PreconditionError
from ._shared_library import build_shared_library

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_MAX_BYTES_ENV",
    "DEFAULT_MAX_BYTES",
    "MAX_LEGALIZED_ENTRIES",
    "CacheSetting",
    "KernelCache",
    "default_cache_dir",
    "resolve_cache",
]

logger = logging.getLogger("fold_guard")

#: Relocates the cache; ``off`` (or ``0``, ``false``, ``no``, empty) disables it.
CACHE_DIR_ENV = "FOLD_GUARD_CACHE_DIR"
#: The size bound in bytes for the cached libraries of every build and layout in the directory
#: (default :data:`DEFAULT_MAX_BYTES`).
CACHE_MAX_BYTES_ENV = "FOLD_GUARD_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
_OFF = frozenset({"", "0", "off", "false", "no"})
_LAYOUT = "v2"
#: The libraries of every layout and build under the cache directory (v1 had the same shape).
_LIBRARIES_GLOB = "v*/*/libs/*.so"
#: The bound on legalization records (each a few hundred bytes).
MAX_LEGALIZED_ENTRIES = 1 << 16
#: Records are counted (a stat of each) when a new one's key starts with this: about once per
#: 256 new records, so a fold that writes a few does not pay for listing tens of thousands.
_TRIM_KEY_PREFIX = "00"

#: ``None``: the environment decides; ``False``: no cache; a path: the cache directory.
CacheSetting = Union[None, bool, str, os.PathLike]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fold_guard``, or ``~/.cache/fold_guard`` (the XDG default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fold_guard"


def resolve_cache(setting: CacheSetting, target: str) -> Optional[KernelCache]:
    """The cache a fold uses: ``setting`` if given, else ``$FOLD_GUARD_CACHE_DIR``, else the default.

    >>> resolve_cache(False, "llvm") is None
    True
    """
    if setting is False:
        return None
    if setting is None or setting is True:
        env = os.environ.get(CACHE_DIR_ENV)
        if env is not None and env.strip().lower() in _OFF:
            return None
        root = Path(env) if env else default_cache_dir()
    else:
        root = Path(setting)
    raw = os.environ.get(CACHE_MAX_BYTES_ENV, str(DEFAULT_MAX_BYTES))
    try:
        max_bytes = int(raw)
    except ValueError:
        raise PreconditionError(
            f"{CACHE_MAX_BYTES_ENV}={raw!r} is not a number of bytes; hint: unset it for the default "
            f"({DEFAULT_MAX_BYTES}) or set e.g. {CACHE_MAX_BYTES_ENV}=268435456"
        ) from None
    return KernelCache(root, target, max_bytes=max_bytes)


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

    def __init__(
        self, root: Union[str, os.PathLike], target: str, *, max_bytes: int = DEFAULT_MAX_BYTES
    ):
        self.root = Path(root)
        self.target = target
        self.max_bytes = max_bytes
        build = f"{FOLD_GUARD_VERSION}|{_tvm_build_identity()}|{target}"
        self.dir = self.root / _LAYOUT / hashlib.sha256(build.encode()).hexdigest()[:24]
        self._libs = self.dir / "libs"
        self._index = self.dir / "index"
        self._legalized = self.dir / "legalized"

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
        self, functions: Mapping[str, Tuple[tvm.tirx.PrimFunc, str]]
    ) -> Dict[str, Tuple[Any, str]]:
        """Compile ``{key: (PrimFunc, target)}`` as one library, store it, and load it."""
        named = {
            self.symbol(key): (func.with_attr("global_symbol", self.symbol(key)), target)
            for key, (func, target) in functions.items()
        }
        self._libs.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._libs, prefix=".tmp-", suffix=".so")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            build_shared_library(named, str(tmp))
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

    def read_legalized(self, keys: List[str]) -> Dict[str, Any]:
        """The legalization records stored under ``keys`` (see ``_legalized``); drop unreadable ones."""
        found: Dict[str, Any] = {}
        for key in keys:
            path = self._legalized / f"{key}.json"
            try:
                found[key] = json.loads(path.read_text())
                os.utime(path)  # recently used: evicted last
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                logger.debug("fold_guard kernel cache: unreadable record %s, legalizing", path)
                self._remove(path)
        return found

    def write_legalized(self, records: Mapping[str, Any]) -> None:
        """Store legalization records; now and then, keep at most :data:`MAX_LEGALIZED_ENTRIES`.

        The bound may be exceeded by about 256 records between two trims.
        """
        if not records:
            return
        for key, record in records.items():
            _atomic_write(self._legalized / f"{key}.json", json.dumps(record).encode())
        if any(key.startswith(_TRIM_KEY_PREFIX) for key in records):
            self._trim(self._legalized, "*.json", count=MAX_LEGALIZED_ENTRIES)

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
