"""A level's large calls run on a thread pool, and that changes no bit and no decision.

    w_i (256 x 1024 fp32) -> quantize -> dequantize       four of them: two levels of four
    t (big table) -> take(out-of-bounds index)            large calls each, one failing at run time
        ==>  the same module, plan and failure as evaluating one call at a time, and stock's bits

Also the kernel build split over threads (``_engine/link.py``): every symbol of a library built
in parts computes what the kernel built alone computes.

White-box on purpose: it tests the fast engine's thread pool (``_engine.fast``, ``link``, ``run``),
a private mechanism.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Set

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import calls_module
from tvm import relax, te

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason
from fold_guard.relax._engine import fast, link, run
from fold_guard.relax._engine.opt_level import OPTIMIZED_TARGET, QUICK_TARGET

_ROWS, _COLS = 256, 1024  # each int8 output is 256 KiB, each fp32 one 1 MiB: both go to the pool


def _qdq_calls(count: int, *, bad_take: bool = False):
    rng = np.random.default_rng(7)

    def calls():
        out = []
        for i in range(count):
            w = rng.standard_normal((_ROWS, _COLS)).astype("float32") * (i + 1)
            scale = relax.const((np.abs(w).max(axis=1) / 127).astype("float32"))
            zero = relax.const(np.zeros(_ROWS, "int8"))
            q = relax.op.quantize(relax.const(w), scale, zero, axis=0, out_dtype="int8")
            out.append(relax.op.dequantize(q, scale, zero, axis=0, out_dtype="float32"))
        if bad_take:
            table = relax.const(rng.standard_normal((_ROWS, _COLS)).astype("float32"))
            rows = np.arange(100, dtype="int64")
            rows[-1] = _ROWS  # a row that does not exist; the output (400 KiB) goes to the pool
            index = relax.const(rows)
            out.append(relax.op.take(table, index, axis=0))
        return out

    return calls


class _CountingPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor that records the threads its tasks ran on."""

    threads: ClassVar[Set[int]] = set()

    def submit(self, fn, /, *args, **kwargs):
        def recorded(*a, **k):
            _CountingPool.threads.add(threading.get_ident())
            return fn(*a, **k)

        return super().submit(recorded, *args, **kwargs)


def _fold_with(monkeypatch, mod, cpus: int, **kwargs):
    monkeypatch.setattr(run, "ThreadPoolExecutor", _CountingPool)
    _CountingPool.threads = set()
    return fgr.fold(mod, kernel_cache=False, threads=cpus, **kwargs)


def test_large_calls_of_a_level_run_on_other_threads_with_stock_bits(monkeypatch) -> None:
    mod = calls_module(_qdq_calls(4))
    result = _fold_with(monkeypatch, mod, 2)
    on_pool = set(_CountingPool.threads)
    assert on_pool and threading.get_ident() not in on_pool
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def test_one_cpu_runs_everything_on_the_calling_thread(monkeypatch) -> None:
    result = _fold_with(monkeypatch, calls_module(_qdq_calls(2)), 1)
    assert _CountingPool.threads == set()
    assert all(d.reason is Reason.FOLDED for d in result.plan.decisions)


def test_a_failing_call_among_parallel_ones_is_recorded_as_alone(monkeypatch) -> None:
    mod = calls_module(_qdq_calls(3, bad_take=True))
    parallel = _fold_with(monkeypatch, mod, 2)
    assert _CountingPool.threads
    serial = _fold_with(monkeypatch, mod, 1)
    assert tvm_ffi.structural_equal(parallel.mod, serial.mod)
    reasons = [(d.label, d.reason, d.detail) for d in parallel.plan.decisions]
    assert reasons == [(d.label, d.reason, d.detail) for d in serial.plan.decisions]
    failed = [d for d in parallel.plan.decisions if d.reason is Reason.EVAL_FAILED]
    assert len(failed) == 1 and "undefined" in failed[0].detail
    assert sum(d.reason is Reason.FOLDED for d in parallel.plan.decisions) == 6
    with pytest.raises(fold_guard.FoldNotPossibleError, match="undefined"):
        _fold_with(monkeypatch, mod, 2, strict=True)


def _add_kernel(constant: float) -> tvm.tirx.PrimFunc:
    a = te.placeholder((8,), "float32", name="a")
    return te.create_prim_func([a, te.compute((8,), lambda i: a[i] * 1.5 + constant)])


def test_a_library_built_in_parts_holds_every_kernel(tmp_path) -> None:
    """Three parts built on three threads, linked by TVM's helper: the kernels built alone."""
    functions = {
        f"k{i}": (_add_kernel(float(i)).with_attr("global_symbol", f"k{i}"), target)
        for i, target in enumerate([OPTIMIZED_TARGET, QUICK_TARGET] * 3)
    }
    groups = link._groups(functions, 3)
    assert len(groups) == 3
    grouped = [s for g in groups for named in g.values() for s in named]
    assert sorted(grouped) == sorted(functions)
    path = str(tmp_path / "lib.so")
    link.build_shared_library(functions, path, threads=3)
    library = tvm.runtime.load_module(path)
    x = np.arange(8, dtype="float32")
    for symbol, (func, target) in functions.items():
        alone = tvm.tirx.build(tvm.IRModule({symbol: func}), target=target)
        expected, got = (tvm.runtime.empty((8,), "float32") for _ in range(2))
        alone[symbol](tvm.runtime.tensor(x), expected)
        library[symbol](tvm.runtime.tensor(x), got)
        assert got.numpy().tobytes() == expected.numpy().tobytes()


def test_a_failed_part_leaves_no_library(tmp_path) -> None:
    good = _add_kernel(1.0).with_attr("global_symbol", "good")
    path = tmp_path / "lib.so"
    with pytest.raises(Exception, match="kind"):
        link.build_shared_library(
            {"good": (good, OPTIMIZED_TARGET), "bad": (good, '{"kind": "no-such-target"}')},
            str(path),
        )
    assert not os.path.exists(path)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_thread_count_that_is_not_positive_is_a_clear_error(monkeypatch, value) -> None:
    mod = calls_module(_qdq_calls(1))
    before = tvm.ir.save_json(mod)
    monkeypatch.setenv("FOLD_GUARD_THREADS", value)
    with pytest.raises(fold_guard.PreconditionError, match=f"FOLD_GUARD_THREADS='{value}'"):
        fgr.fold(mod, kernel_cache=False)
    assert tvm.ir.save_json(mod) == before


def test_the_thread_count_caps_the_pool(monkeypatch) -> None:
    monkeypatch.setenv("FOLD_GUARD_THREADS", "1")
    monkeypatch.setattr(run, "ThreadPoolExecutor", _CountingPool)
    _CountingPool.threads = set()
    mod = calls_module(_qdq_calls(4))
    result = fgr.fold(mod, kernel_cache=False)
    assert _CountingPool.threads == set()
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def test_calls_after_two_that_cannot_allocate_still_run(monkeypatch) -> None:
    """Five large calls on two threads; on the pool, the third and fourth cannot allocate.

    Both faults are counted and those calls rerun on the reference engine; the fifth, started
    after them, runs on the pool as usual: everything folds to stock's bits.
    """
    mod = calls_module(_qdq_calls(5))
    real_allocate = fast._empty
    allocations = []

    def allocate(outputs):
        allocations.append(outputs)
        if len(allocations) in (3, 4):
            raise MemoryError("no room for this output")
        return real_allocate(outputs)

    monkeypatch.setattr(fast, "_empty", allocate)
    result = _fold_with(monkeypatch, mod, 2)
    assert all(d.reason is Reason.FOLDED for d in result.plan.decisions)
    assert [line.split(": ", 1)[1] for line in result.report.fallbacks] == [
        "MemoryError: no room for this output"
    ] * 2
    assert len(allocations) == 10
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))
