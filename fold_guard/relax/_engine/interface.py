"""The engine interface's types: options, statistics, values, and the protocol both engines meet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Protocol, Sequence

from ..._core.planner import FoldPlan

__all__ = ["DEFAULT_CACHE_MAX_BYTES", "Engine", "EngineOptions", "EngineStats", "Values"]

#: node id -> its output tensors (a ShapeExpr for a folded ``tensor_to_shape``)
Values = Dict[int, List[object]]

#: The default bound on the kernel cache's libraries, all builds together.
DEFAULT_CACHE_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class EngineOptions:
    """Everything an engine may decide by; each fast mechanism can be switched off alone.

    ``reference`` selects the reference engine (the other switches then do not matter).
    ``threads``: how many threads build kernels and run a level's large calls (1: none).
    ``cache_dir``: the persistent kernel cache's directory, or None for no cache.
    ``host_copies``: data movement (reshape, transpose, gather...) copied by NumPy.
    ``quick_builds``: kernels built at LLVM ``-O0`` where exact (data movement, by its TIR;
    some arithmetic, with value guards).
    ``fills``: a call whose every element has one bit pattern written without a kernel, or not
    at all where only other fills read it (``fills``).
    ``row_blocks``: a large quantize / dequantize split into row blocks over the threads.
    ``striped_transposes``: a large 2-D transpose copy done in cache-friendly stripes.
    ``pool_warm_up``: every pool thread started with the first large call (``run.Pool``).

    ``fold(mod, engine_options=...)`` takes it, for tests and benchmarks: every switch at once.

    >>> import dataclasses
    >>> import fold_guard.relax as fgr
    >>> fgr.EngineOptions().reference, dataclasses.replace(fgr.EngineOptions(), fills=False).fills
    (False, False)
    """

    reference: bool = False
    threads: int = 1
    cache_dir: Optional[Path] = None
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    host_copies: bool = True
    quick_builds: bool = True
    fills: bool = True
    row_blocks: bool = True
    striped_transposes: bool = True
    pool_warm_up: bool = True


@dataclass
class EngineStats:
    """What an engine did: kernels built and loaded, and the calls it had to fall back on.

    ``fallbacks`` holds one line per fault of a fast mechanism (``lv3 = relax.quantize: ...``):
    the call it hit was rerun on the reference engine, or the cache's failure cost a build.
    """

    compiled: int = 0
    cached: int = 0
    fallbacks: List[str] = field(default_factory=list)


class Engine(Protocol):
    """Computes the folded calls of a plan (see the module docstring)."""

    stats: EngineStats

    def prepare(self, plan: FoldPlan) -> None:
        """Build (or load) every kernel the folded calls of ``plan`` need."""

    def evaluate(
        self,
        plan: FoldPlan,
        values: Values,
        *,
        strict: bool,
        release: Mapping[int, Sequence[int]],
    ) -> Dict[int, str]:
        """Fill ``values`` for the folded calls of ``plan`` that have none; return the failures.

        A failure is a call whose kernel fails as the stock pass's would (node id -> the error
        text); with ``strict`` the first one raises :class:`~fold_guard.FoldNotPossibleError`.
        ``release`` (the driver's, decided once per plan: ``_core.driver.releasable``) names the
        values the engine may drop once every listed consumer has its own; the rewrite is
        handed the same mapping.
        """
