"""The fast engine's compiled kernels: each distinct (PrimFunc, target) built once per fold.

:meth:`KernelLibrary.build` takes every kernel the strategies name: with a kernel cache, those
built before (by this or another process) are loaded from disk and the rest are compiled into
one shared library the cache keeps; without one, they are built in memory, one batch per
target. A kernel asked for later at another target (an ``-O3`` build for a call its guard turned
away) is built then, in memory. A build that fails leaves the kernel without a function:
:meth:`function` raises, and the fast engine reruns the call on the reference engine.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

import tvm
import tvm_ffi

from .cache import KernelCache
from .interface import EngineStats

__all__ = ["KernelLibrary"]

logger = logging.getLogger("fold_guard")


class KernelLibrary:
    """Compiled functions for (PrimFunc, target) pairs; structurally equal PrimFuncs share one."""

    def __init__(self, cache: Optional[KernelCache], threads: int, stats: EngineStats) -> None:
        self._cache = cache
        self._threads = threads
        self._stats = stats
        #: (structural hash, target) -> [(PrimFunc, symbol)]
        self._symbols: Dict[Tuple[int, str], List[Tuple[tvm.tirx.PrimFunc, str]]] = {}
        #: symbol -> (PrimFunc, target), registered but not built yet
        self._pending: Dict[str, Tuple[tvm.tirx.PrimFunc, str]] = {}
        #: symbol -> (the runtime module that holds it, its name there)
        self._compiled: Dict[str, Tuple[Any, str]] = {}
        self._failures: Dict[str, str] = {}

    def build(self, kernels: Iterable[Tuple[tvm.tirx.PrimFunc, str]]) -> None:
        """Load or compile every (PrimFunc, target) of ``kernels`` (see the module docstring)."""
        for prim_func, target in kernels:
            self._symbol(prim_func, target)
        pending, self._pending = self._pending, {}
        if pending and self._cache is not None:
            pending = self._build_through_cache(self._cache, pending)
        by_target: Dict[str, Dict[str, tvm.tirx.PrimFunc]] = {}
        for symbol, (prim_func, target) in pending.items():
            by_target.setdefault(target, {})[symbol] = prim_func
        for target, named in by_target.items():
            self._build_in_memory(target, named)

    def function(self, prim_func: tvm.tirx.PrimFunc, target: str) -> Any:
        """The compiled function for ``prim_func`` at ``target``, built now if it is new."""
        symbol = self._symbol(prim_func, target)
        if symbol in self._pending:
            self._build_in_memory(target, {symbol: self._pending.pop(symbol)[0]})
        if symbol in self._failures:
            raise RuntimeError(self._failures[symbol])
        module, name = self._compiled[symbol]
        return module[name]

    def _symbol(self, prim_func: tvm.tirx.PrimFunc, target: str) -> str:
        bucket = self._symbols.setdefault((tvm_ffi.structural_hash(prim_func), target), [])
        for known, symbol in bucket:
            if tvm_ffi.structural_equal(known, prim_func):
                return symbol
        symbol = f"fold_guard_kernel_{sum(len(b) for b in self._symbols.values())}"
        bucket.append((prim_func, symbol))
        self._pending[symbol] = (prim_func, target)
        return symbol

    def _build_in_memory(self, target: str, funcs: Dict[str, tvm.tirx.PrimFunc]) -> None:
        named = {symbol: func.with_attr("global_symbol", symbol) for symbol, func in funcs.items()}
        try:
            batch = tvm.tirx.build(tvm.IRModule(named), target=target)
        except Exception as err:  # noqa: BLE001 - one by one below, to find the kernel that fails
            logger.debug("batched kernel build failed (%s); building kernels one by one", err)
        else:
            self._compiled.update({symbol: (batch, symbol) for symbol in named})
            self._stats.compiled += len(named)
            return
        for symbol, func in named.items():
            try:
                built = tvm.tirx.build(tvm.IRModule({symbol: func}), target=target)
            except Exception as err:  # noqa: BLE001 - the calls using it fall back, counted
                self._failures[symbol] = f"kernel build failed: {err}".splitlines()[0]
                continue
            self._compiled[symbol] = (built, symbol)
            self._stats.compiled += 1

    def _build_through_cache(
        self, cache: KernelCache, funcs: Dict[str, Tuple[tvm.tirx.PrimFunc, str]]
    ) -> Dict[str, Tuple[tvm.tirx.PrimFunc, str]]:
        """Load or build ``funcs`` through ``cache``; return those left to build without it."""
        keys = {
            symbol: cache.key(cache.digest(func), target)
            for symbol, (func, target) in funcs.items()
        }
        try:
            found = cache.lookup(sorted(set(keys.values())))
        except Exception as err:  # noqa: BLE001 - counted: the kernels are built in memory
            self._count_cache_fault("reading", cache, err)
            return funcs
        missing = {key: funcs[symbol] for symbol, key in keys.items() if key not in found}
        if missing:
            try:
                found.update(cache.build(missing, threads=self._threads))
            except Exception as err:  # noqa: BLE001 - counted: the kernels are built in memory
                self._count_cache_fault("building through", cache, err)
        left: Dict[str, Tuple[tvm.tirx.PrimFunc, str]] = {}
        for symbol, key in keys.items():
            if key in found:
                self._compiled[symbol] = found[key]
            else:
                left[symbol] = funcs[symbol]
        self._stats.compiled += len({key for key in missing if key in found})
        self._stats.cached += len(
            {key for key in keys.values() if key in found and key not in missing}
        )
        return left

    def _count_cache_fault(self, doing: str, cache: KernelCache, err: Exception) -> None:
        note = f"kernel cache: {doing} {cache.dir} failed ({type(err).__name__}: {err})"
        self._stats.fallbacks.append(note.splitlines()[0] + "; kernels built in memory")
        logger.info("fold_guard %s", self._stats.fallbacks[-1])
