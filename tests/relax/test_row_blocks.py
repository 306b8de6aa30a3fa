"""A large quantize or dequantize runs in blocks of rows on the pool, with stock's bits (RFC.md,
guarantees 1 and 2).

    table (32768 x 128 int8) -> dequantize        two tables of different heights, so their
    table (4096 x 128 int8)  -> dequantize        kernel is generic in the leading dim
        ==>  two row blocks for the large one, one call for the small one; stock's module

and the cases that run whole: a kernel with a static or shared leading dim, a scale along the
rows whose length is not the row count, a type NumPy cannot view, too few rows for two blocks
that start on 64-byte boundaries.

White-box on purpose: it tests the fast engine's row blocks (``_engine.row_blocks``, ``strategy``),
a private mechanism.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import calls_module
from hypothesis import given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Reason
from fold_guard._core.graph import FoldNode, InputKind, NodeInput, TensorInfo
from fold_guard.relax._engine import row_blocks as _row_blocks
from fold_guard.relax._engine import strategy
from fold_guard.relax._sites import CallSite, SiteKind

_TALL, _SHORT, _WIDTH = 32768, 4096, 128  # the tall table's fp32 result: 16 MiB


def _tables(make_call):
    rng = np.random.default_rng(3)

    def calls():
        return [make_call(rng, rows) for rows in (_TALL, _SHORT)]

    return calls


def _dequantize_per_tensor(rng, rows):
    table = rng.integers(-128, 128, (rows, _WIDTH), dtype="int8")
    return relax.op.dequantize(
        relax.const(table), relax.const(np.float32(0.037)), relax.const(np.int8(3)), axis=1
    )


def _dequantize_along_rows(rng, rows):
    table = rng.integers(-128, 128, (rows, _WIDTH), dtype="int8")
    scale = relax.const((rng.random(rows) * 0.1 + 0.001).astype("float32"))
    zero = relax.const(rng.integers(-5, 5, rows, dtype="int8"))
    return relax.op.dequantize(relax.const(table), scale, zero, axis=0)


def _quantize_per_column(rng, rows):
    table = (rng.standard_normal((rows, _WIDTH)) * 4).astype("float32")
    scale = relax.const((np.abs(table).max(axis=0) / 127).astype("float32"))
    zero = relax.const(np.zeros(_WIDTH, "int8"))
    return relax.op.quantize(relax.const(table), scale, zero, axis=1, out_dtype="int8")


def _fold_recording_blocks(monkeypatch, mod, cpus: int):
    """fold() with ``cpus`` threads; returns the result and every row_blocks answer that split."""
    splits: List[_row_blocks.RowBlocks] = []
    real = _row_blocks.row_blocks

    def recorded(*args):
        blocks = real(*args)
        if blocks is not None:
            splits.append(blocks)
        return blocks

    monkeypatch.setattr(strategy, "row_blocks", recorded)
    return fgr.fold(mod, kernel_cache=False, threads=cpus), splits


@pytest.mark.parametrize(
    "make_call, sliced",
    [
        (_dequantize_per_tensor, (0,)),
        (_dequantize_along_rows, (0, 1, 2)),
        (_quantize_per_column, (0,)),
    ],
    ids=["dequantize-per-tensor", "dequantize-along-rows", "quantize-per-column"],
)
def test_a_large_call_runs_in_row_blocks_with_stock_bits(monkeypatch, make_call, sliced) -> None:
    mod = calls_module(_tables(make_call))
    result, splits = _fold_recording_blocks(monkeypatch, mod, 2)
    assert [(b.bounds, b.sliced_leaves) for b in splits] == [
        (((0, _TALL // 2), (_TALL // 2, _TALL)), sliced)
    ]
    assert all(d.reason is Reason.FOLDED for d in result.plan.decisions if d.label != "gv")
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    alone, none = _fold_recording_blocks(monkeypatch, mod, 1)
    assert none == []
    assert tvm_ffi.structural_equal(alone.mod, result.mod)


# --------------------------------------------------------------------------- when a call runs whole


def _site_and_node(data_type: relax.TensorType, scale_shape, axis: int, out_dtype: str):
    data = relax.Var("w", data_type)
    scale = relax.Var("s", relax.TensorType(scale_shape, "float32"))
    zero = relax.Var("z", relax.TensorType(scale_shape, "int8"))
    call = relax.BlockBuilder().normalize(
        relax.op.dequantize(data, scale, zero, axis=axis, out_dtype=out_dtype)
    )
    site = CallSite(0, "main", call, SiteKind.OP, relax.Var("y"), True, (data, scale, zero))
    shape = tuple(int(d) for d in data_type.shape.values)
    inputs = (
        TensorInfo.of(str(data_type.dtype), shape),
        TensorInfo.of("float32", tuple(scale_shape)),
        TensorInfo.of("int8", tuple(scale_shape)),
    )
    node = FoldNode(
        0,
        "relax.dequantize",
        "y",
        "main",
        tuple(NodeInput(InputKind.CONSTANT, "c", info) for info in inputs),
        (TensorInfo.of(out_dtype, shape),),
    )
    return site, node


def _blocks(rows: int, cols: int, kernel_dims, *, scale=(), axis=1, data_dtype="int8"):
    site, node = _site_and_node(relax.TensorType((rows, cols), data_dtype), scale, axis, "float32")
    kernel_result = relax.TensorType(kernel_dims, "float32")
    return _row_blocks.row_blocks(site, node, kernel_result, 2)


_N = tvm.tirx.Var("n0", "int64")


def test_a_generic_leading_dim_splits_in_two_aligned_blocks() -> None:
    blocks = _blocks(_TALL, _WIDTH, (_N, _WIDTH))
    assert blocks is not None and blocks.bounds == ((0, _TALL // 2), (_TALL // 2, _TALL))


@pytest.mark.parametrize(
    "why, kernel_dims, rows, cols, scale, axis, data_dtype",
    [
        ("static kernel", (_TALL, _WIDTH), _TALL, _WIDTH, (), 1, "int8"),
        ("leading dim shared", (_N, _N), 4096, 4096, (), 1, "int8"),
        ("scale along rows, not one per row", (_N, _WIDTH), _TALL, _WIDTH, (1,), 0, "int8"),
        ("no NumPy view of float8", (_N, _WIDTH), _TALL, _WIDTH, (), 1, "float8_e4m3fn"),
        ("under 4 MiB", (_N, _WIDTH), 4096, _WIDTH, (), 1, "int8"),
    ],
)
def test_these_calls_run_whole(why, kernel_dims, rows, cols, scale, axis, data_dtype) -> None:
    assert _blocks(rows, cols, kernel_dims, scale=scale, axis=axis, data_dtype=data_dtype) is None


def test_blocks_start_on_64_byte_boundaries_of_every_tensor() -> None:
    # 3 int8 columns: a block must start at a multiple of 64 rows (192 bytes of data); the fp32
    # result's rows (12 bytes) need 16, the one-per-row scale 16
    rows = (4 << 20) // 12 + 7
    blocks = _blocks(rows, 3, (_N, 3), scale=(rows,), axis=0)
    assert blocks is not None
    (lo0, hi0), (lo1, hi1) = blocks.bounds
    assert (lo0, hi1) == (0, rows) and hi0 == lo1 and hi0 % 64 == 0
    assert blocks.sliced_leaves == (0, 1, 2)


def _single_block(rows: int) -> Optional[_row_blocks.RowBlocks]:
    return _blocks(rows, 1 << 20, (_N, 1 << 20))


def test_too_few_rows_for_two_blocks_run_whole() -> None:
    # two rows of 1 Mi int8 columns: 8 MiB of fp32, but each row is 1 MiB, so two blocks exist;
    # one row is not two blocks
    assert _single_block(2) is not None
    site, node = _site_and_node(relax.TensorType((1, 8 << 20), "int8"), (), 1, "float32")
    assert _row_blocks.row_blocks(site, node, relax.TensorType((_N, 8 << 20), "float32"), 2) is None


# --------------------------------------------------------------------------- property


@settings(max_examples=examples(200), deadline=None)
@given(
    rows=st.integers(2, 1 << 16),
    cols=st.integers(1, 700),
    along_rows=st.booleans(),
    blocks=st.integers(2, 8),
)
def test_blocks_cover_the_rows_once_and_start_aligned(rows, cols, along_rows, blocks) -> None:
    """Whatever the shape: the blocks partition ``[0, rows)`` in order, at most ``blocks`` of
    them, and each starts on a 64-byte boundary of the data, the result and a sliced scale."""
    scale = (rows,) if along_rows else (cols,)
    site, node = _site_and_node(
        relax.TensorType((rows, cols), "int8"), scale, 0 if along_rows else 1, "float32"
    )
    found = _row_blocks.row_blocks(site, node, relax.TensorType((_N, cols), "float32"), blocks)
    if rows * cols * 4 < _row_blocks.ROW_BLOCKS_MIN_BYTES:
        assert found is None
        return
    if found is None:  # too few rows for two aligned blocks
        assert rows <= 64
        return
    assert 2 <= len(found.bounds) <= blocks
    assert found.bounds[0][0] == 0 and found.bounds[-1][1] == rows
    for (_, hi), (lo, _) in zip(found.bounds, found.bounds[1:]):
        assert hi == lo
    for lo, hi in found.bounds:
        assert lo < hi
        assert (lo * cols) % 64 == 0 and (lo * cols * 4) % 64 == 0  # int8 data, fp32 result
        if along_rows:
            assert (lo * 4) % 64 == 0 and lo % 64 == 0  # fp32 scale, int8 zero point
    assert found.sliced_leaves == ((0, 1, 2) if along_rows else (0,))
