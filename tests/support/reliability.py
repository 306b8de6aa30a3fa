"""The concurrency check the reliability tests of both IRs share. It uses only ``tvm.ir`` and the
standard library, so it runs on any TVM either adapter supports. (The bad-input catalogue's
runner is :mod:`support.ir_harness`.)
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Sequence

import tvm

__all__ = ["check_concurrent_like_sequential"]


def check_concurrent_like_sequential(
    entries: Sequence[Callable[[tvm.IRModule], tvm.IRModule]],
    work: Sequence[tvm.IRModule],
    *,
    rounds: int = 1,
    assert_equal: Callable[[tvm.IRModule, tvm.IRModule], None] = tvm.ir.assert_structural_equal,
) -> None:
    """Each entry run on ``work`` from ``len(work)`` threads at once equals it run sequentially,
    raises nothing, and leaves every input byte-for-byte as it was."""
    for entry in entries:
        expected = [entry(mod) for mod in work]
        saved = [tvm.ir.save_json(mod) for mod in work]
        for _ in range(rounds):
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(work)) as pool:
                results = list(pool.map(entry, work))
            for got, want in zip(results, expected):
                assert_equal(got, want)
        assert [tvm.ir.save_json(mod) for mod in work] == saved
