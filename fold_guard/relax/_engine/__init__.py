"""Evaluation: the one interface between the Relax adapter's translation and running kernels.

Translation (``_translate``) hands an engine the call sites, the graph and a
:class:`~fold_guard.relax._sites.KernelSpec` per call; the adapter's driver then calls
:meth:`Engine.prepare` once with the first plan (compile what it needs) and
:meth:`Engine.evaluate` once per round of the core's re-plan loop. Nothing under this package
reads the environment or a ``PassContext``: every choice arrives in :class:`EngineOptions`,
resolved once per run by ``fold_guard.relax._config``.

Two engines answer the interface:

* ``reference``: serial, each call legalized on its operands as constants and built as the stock
  pass builds it, no cache, no host copies, no threads, no helper shared with ``fast``. Short
  enough to check against the stock pass by eye; the oracle the tests compare the fast engine
  with, bit for bit, and the switch to flip (``reference_engine=True``) when a TVM or LLVM
  upgrade breaks a trick.
* ``fast``: kernels shared per op signature, built in one batch (``-O0`` where exact: data
  movement read from the TIR, some arithmetic), cached on disk, fills of one value written
  without a kernel, data movement copied by NumPy, a level's large calls on threads. Each mechanism can be
  switched off here, and a fault in any of them reruns that call on the reference engine.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import tvm

from ..._core.graph import FoldGraph
from .._sites import CallSite, KernelSpec
from .fast import FastEngine
from .interface import DEFAULT_CACHE_MAX_BYTES, Engine, EngineOptions, EngineStats, Values
from .reference import ReferenceEngine

__all__ = [
    "DEFAULT_CACHE_MAX_BYTES",
    "Engine",
    "EngineOptions",
    "EngineStats",
    "Values",
    "make_engine",
]


def make_engine(
    options: EngineOptions,
    mod: tvm.IRModule,
    graph: FoldGraph,
    sites: Sequence[CallSite],
    kernels: Mapping[int, KernelSpec],
) -> Engine:
    """The engine ``options`` ask for, over one translated module."""
    reference = ReferenceEngine(mod, graph, sites)
    if options.reference:
        return reference
    return FastEngine(options, graph, sites, kernels, reference)
