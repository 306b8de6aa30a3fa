"""Folded calls that only move data are copied by NumPy, with the bits stock's kernels write.

    y = reshape / permute_dims / expand_dims / squeeze / flatten / take / shape_to_tensor (C)
        ==>  y a constant, byte-identical to stock's, and no kernel compiled for it

Stock compiles one kernel per distinct shape for each of these (a bias reshape per channel
count); fold_guard legalizes them the same way, to take the same fold decision, but copies the
elements with NumPy instead of compiling.

White-box on purpose: it tests the fast engine's NumPy copies (``_engine.host``), a private
mechanism.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import calls_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relax

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason


def _assert_bits_equal_stock(mod: tvm.IRModule) -> fgr.FoldResult:
    result = fgr.fold(mod, kernel_cache=False)
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(result.mod, stock), result.mod.script()
    return result


def _const(array: np.ndarray) -> relax.Constant:
    return relax.const(array, str(array.dtype))  # relax.const alone narrows int64 to int32


def test_data_movement_folds_like_stock_without_a_kernel() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 2)).astype("float32")

    def calls():
        return [
            relax.op.reshape(_const(w), (6, 4)),
            relax.op.permute_dims(_const(w), [2, 0, 1]),
            relax.op.permute_dims(_const(w)),
            relax.op.expand_dims(_const(w), [0, 3]),
            relax.op.squeeze(_const(w[:1]), [0]),
            relax.op.flatten(_const(w)),
            relax.op.take(_const(w), _const(np.array([3, 0], "int64")), axis=0),
            relax.op.take(_const(w), _const(np.array(1, "int64")), axis=1, mode="wrap"),
            relax.op.take(_const(w), _const(np.array([-1, 7], "int32")), axis=2, mode="clip"),
            relax.op.take(_const(w), _const(np.array([-1, 7], "int32")), axis=2, mode="wrap"),
            relax.op.shape_to_tensor(relax.ShapeExpr([5, 7])),
        ]

    result = _assert_bits_equal_stock(calls_module(calls))
    assert [d.reason for d in result.plan.decisions] == [Reason.FOLDED] * 11
    assert result.report.kernels_compiled == 0


def test_nan_payloads_and_narrow_types_are_copied_bit_for_bit() -> None:
    payloads = np.array([0x7FC00001, 0xFFC12345, 0x7F800000, 0x00000001], "uint32")
    floats = payloads.view("float32").reshape(2, 2)
    halves = np.array([[0x7E01, 0xFC00], [0x0001, 0x8000]], "uint16").view("float16")
    flags = np.array([[True, False, True]])
    small = np.array([[-128, 127], [0, -1]], "int8")

    def calls():
        return [
            relax.op.permute_dims(_const(floats)),
            relax.op.reshape(_const(halves), (4,)),
            relax.op.squeeze(_const(flags), [0]),
            relax.op.permute_dims(_const(small)),
        ]

    result = _assert_bits_equal_stock(calls_module(calls))
    assert result.report.kernels_compiled == 0
    folded = result.mod["main"].body.blocks[0].bindings[-1].value.fields
    assert folded[1].value.numpy().view("uint32").reshape(-1).tolist() == [
        0x7FC00001,
        0x7F800000,
        0xFFC12345,
        0x00000001,
    ]


def test_types_numpy_cannot_hold_still_get_a_kernel() -> None:
    """bfloat16 has no NumPy type of its own: its reshape is compiled, as stock does it."""
    data = relax.const(tvm.runtime.tensor(np.zeros((2, 3), "float32")))
    result = _assert_bits_equal_stock(
        calls_module(lambda: [relax.op.reshape(relax.op.astype(data, "bfloat16"), (3, 2))])
    )
    assert result.report.kernels_compiled >= 2  # the astype and the bfloat16 reshape


def test_reshape_of_a_computed_constant_feeds_the_next_kernel() -> None:
    rng = np.random.default_rng(1)
    bias = rng.standard_normal(8).astype("float32")
    scale = np.float32(0.05)

    def calls():
        reshaped = relax.op.reshape(_const(bias), (1, 8, 1, 1))
        return [relax.op.multiply(reshaped, _const(scale)), relax.op.permute_dims(reshaped)]

    result = _assert_bits_equal_stock(calls_module(calls))
    assert result.report.kernels_compiled == 1  # the multiply


def test_out_of_bounds_fast_take_is_kept_not_read() -> None:
    """Stock's kernel reads outside the buffer here (its result is undefined): fold_guard keeps the call."""
    data = np.arange(6, dtype="float32").reshape(2, 3)
    mod = calls_module(
        lambda: [relax.op.take(_const(data), _const(np.array([0, 5], "int64")), axis=1)]
    )
    result = fgr.fold(mod, kernel_cache=False)
    (decision,) = result.plan.decisions
    assert decision.reason is Reason.EVAL_FAILED
    assert "undefined" in decision.detail and "axis of 3" in decision.detail
    assert tvm_ffi.structural_equal(result.mod, mod)
    with pytest.raises(fold_guard.FoldNotPossibleError, match="axis of 3"):
        fgr.fold(mod, strict=True, kernel_cache=False)


_DTYPES = st.sampled_from(["float32", "float16", "int8", "uint8", "int32", "int64", "bool"])


@st.composite
def _movement(draw):
    """A random constant of 1-4 dims and one data-movement call over it."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    dtype = draw(_DTYPES)
    seed = draw(st.integers(0, 2**16))
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * 8, dtype="uint8")
    itemsize = np.dtype(dtype).itemsize
    data = raw[: int(np.prod(shape)) * itemsize].view(dtype if dtype != "bool" else "uint8")
    data = (data % 2).astype("bool") if dtype == "bool" else data
    data = data.reshape(shape)
    kind = draw(st.sampled_from(["reshape", "permute", "expand", "squeeze", "take"]))
    const = _const(data)
    if kind == "reshape":
        return relax.op.reshape(const, (int(np.prod(shape)),))
    if kind == "permute":
        return relax.op.permute_dims(const, draw(st.permutations(range(len(shape)))))
    if kind == "expand":
        return relax.op.expand_dims(const, [draw(st.integers(0, len(shape)))])
    if kind == "squeeze":
        return relax.op.squeeze(relax.op.expand_dims(const, [0]), [0])
    axis = draw(st.integers(0, len(shape) - 1))
    indices = draw(st.lists(st.integers(-5, 8), min_size=1, max_size=4))
    mode = draw(st.sampled_from(["clip", "wrap"]))
    return relax.op.take(const, _const(np.array(indices, "int64")), axis=axis, mode=mode)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_movement(), min_size=1, max_size=3))
def test_random_data_movement_matches_stock_bit_for_bit(calls) -> None:
    """RFC.md, guarantees 1 and 2: stock's module, constant for constant, bit for bit."""
    _assert_bits_equal_stock(calls_module(lambda: calls))


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1000, 2048), "float32"),
        ((37, 8192), "float32"),
        ((600, 2048), "int8"),
        ((8, 65536), "uint16"),
    ],
)
def test_large_transposes_copied_in_stripes_match_stock(shape, dtype) -> None:
    """A transpose whose source rows are a multiple of 2 KiB apart is copied 16 rows at a time
    (NumPy's own order misses the cache on every read there): the same bits as stock's kernel,
    including a last stripe narrower than the others."""
    rng = np.random.default_rng(1)
    w = rng.integers(-100, 100, shape).astype(dtype)
    result = _assert_bits_equal_stock(calls_module(lambda: [relax.op.permute_dims(_const(w))]))
    assert [d.reason for d in result.plan.decisions] == [Reason.FOLDED]
    assert result.report.kernels_compiled == 0


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 300])
def test_striped_copy_writes_what_copyto_writes(rows, monkeypatch) -> None:
    from fold_guard.relax._engine import host as _host

    monkeypatch.setattr(_host, "_STRIPED_MIN_BYTES", 0)  # small sources take the stripes too
    source = np.arange(rows * 4096, dtype="float32").reshape(rows, 4096)
    for view in (source.T, source, source[:, :100].T):
        target = np.zeros(view.shape, view.dtype)
        _host._copy(target, view)
        np.testing.assert_array_equal(target, view)
