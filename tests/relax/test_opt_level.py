"""Kernels built at LLVM -O0 compute the bits stock's -O3 kernels compute.

fold_guard builds a kernel at -O0 (about 3x faster to compile) only where its operations leave
LLVM nothing undefined (``fold_guard/relax/_engine/opt_level.py``); everything else is built at -O3,
as stock builds it. Each rule is checked both ways, and random values at the edges (infinities,
NaN, zero and huge scales, the integer limits) must fold to stock's bits whichever level the
kernel got.

White-box on purpose: it tests the fast engine's choice of optimization level
(``_engine.opt_level``, ``_engine.strategy``), a private mechanism.
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

import fold_guard.relax as fgr
from fold_guard._core.planner import plan_folds
from fold_guard._core.report import StepTimer
from fold_guard.relax import EngineOptions
from fold_guard.relax._engine.opt_level import OPTIMIZED_TARGET, QUICK_BUILD_MAX_BYTES, QUICK_TARGET
from fold_guard.relax._engine.strategy import choose_strategies
from fold_guard.relax._translate import analyse


def _kernels(mod: tvm.IRModule):
    """How the fast engine runs each call, in binding order (every call here folds)."""
    analysis = analyse(mod, "default", StepTimer())
    plan = plan_folds(analysis.graph, analysis.policy)
    sites, kernels = analysis.translation.sites, analysis.kernels
    chosen = choose_strategies(plan, analysis.graph, sites, kernels, EngineOptions())
    return [chosen[node.id] for node in analysis.graph.nodes]


def _targets(mod: tvm.IRModule) -> list[str]:
    """The build target of each call's kernel, in binding order."""
    return [strategy.target for strategy in _kernels(mod)]


def _c(array) -> relax.Constant:
    array = np.asarray(array)
    return relax.const(array, str(array.dtype))  # relax.const alone narrows int64 to int32


def _quantize(data, scale, zero, dtype="int8", axis=-1):
    return relax.op.quantize(_c(data), _c(scale), _c(zero), axis=axis, out_dtype=dtype)


def _dequantize(data, scale, zero, axis=-1):
    return relax.op.dequantize(_c(data), _c(scale), _c(zero), axis=axis, out_dtype="float32")


W = np.linspace(-3, 3, 12, dtype="float32").reshape(3, 4)
S = np.float32(0.05)
ROW_SCALES = np.full(3, 0.05, "float32")
ROW_ZEROS = np.zeros(3, "int8")
SLOW = OPTIMIZED_TARGET


@pytest.mark.parametrize(
    ("make", "target"),
    [
        (lambda: _quantize(W, S, np.int8(0)), QUICK_TARGET),
        (lambda: _quantize(W, S, np.uint8(3), "uint8"), QUICK_TARGET),
        (lambda: _quantize(W, S, np.int16(0), "int16"), QUICK_TARGET),
        # a NaN weight meets the clip's comparisons, which LLVM may compile either way
        (lambda: _quantize(np.where(W > 2, np.nan, W).astype("float32"), S, np.int8(0)), SLOW),
        # 0 / 0 and inf / inf are NaN (per-channel scales: buffers, not immediates)
        (lambda: _quantize(W, ROW_SCALES * np.float32([1, 0, 1]), ROW_ZEROS, axis=0), SLOW),
        (lambda: _quantize(W, ROW_SCALES * np.float32([1, np.inf, 1]), ROW_ZEROS, axis=0), SLOW),
        (lambda: _quantize(W, ROW_SCALES, ROW_ZEROS, axis=0), QUICK_TARGET),
        (lambda: _dequantize(W.astype("int8"), S, np.int8(1)), QUICK_TARGET),
        (lambda: _dequantize(W.astype("uint16"), S, np.uint16(9)), QUICK_TARGET),
        (lambda: _dequantize(W.astype("int32"), S, np.int32(0)), QUICK_TARGET),
        # int32 minus a non-zero zero point may overflow (an nsw subtraction)
        (lambda: _dequantize(W.astype("int32"), S, np.int32(1)), SLOW),
        (lambda: relax.op.less(_c(np.arange(4)), _c(np.int64(2))), QUICK_TARGET),
        (lambda: relax.op.less(_c(W), _c(np.float32(0))), SLOW),
        (
            lambda: relax.op.where(_c(W > 0), _c(np.arange(12).reshape(3, 4)), _c(np.int64(0))),
            QUICK_TARGET,
        ),
        (lambda: relax.op.add(_c(np.arange(4)), _c(np.int64(7))), QUICK_TARGET),
        (
            lambda: relax.op.add(_c(np.array([2**62, 1])), _c(np.array([2**62, 1]))),
            OPTIMIZED_TARGET,
        ),
        (
            lambda: relax.op.subtract(_c(np.int32([-(2**31), 0])), _c(np.int32(1))),
            OPTIMIZED_TARGET,
        ),
        (lambda: relax.op.add(_c(W), _c(S)), SLOW),
        (lambda: relax.op.exp(_c(W)), SLOW),
    ],
)
def test_each_rule_picks_its_level_and_matches_stock(make, target) -> None:
    mod = calls_module(lambda: [make()])
    assert _targets(mod) == [target]
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(fgr.fold(mod, kernel_cache=False).mod, stock)


@pytest.mark.parametrize(
    ("left", "right", "op", "fits"),
    [
        (np.int64([-(2**63)]), np.int64(1), relax.op.subtract, False),
        (np.int64([-(2**62)]), np.int64(2**62), relax.op.subtract, True),
        (np.uint64([2**63, 1]), np.uint64(2**63), relax.op.add, False),
        (np.uint64([2**63 - 1]), np.uint64(2**63), relax.op.add, True),
        (np.uint64([0, 5]), np.uint64(1), relax.op.subtract, False),
        (np.uint8([255, 0]), np.uint8(1), relax.op.add, False),
        (np.uint16([7]), np.uint16(7), relax.op.subtract, True),
    ],
)
def test_integer_overflow_is_found_at_every_width(left, right, op, fits) -> None:
    """Only the level is compared: where the exact result overflows, TVM's ``nsw`` / ``nuw``
    arithmetic is undefined, and stock's kernel (its scalar an immediate) need not agree with any
    other build."""
    mod = calls_module(lambda: [op(_c(left), _c(right))])
    assert _targets(mod) == [QUICK_TARGET if fits else SLOW]


def test_sub_byte_integers_are_optimized() -> None:
    """int4 has no NumPy type for a guard to read: its arithmetic is built at -O3, as stock's."""
    small = relax.op.astype(_c(np.float32([1, 2, 3, 4])), "int4")
    mod = calls_module(lambda: [relax.op.add(small, small)])
    assert _targets(mod) == [OPTIMIZED_TARGET, OPTIMIZED_TARGET]
    assert tvm_ffi.structural_equal(
        fgr.fold(mod, kernel_cache=False).mod, relax.transform.FoldConstant()(mod)
    )


def test_a_kernel_writing_many_bytes_is_optimized() -> None:
    """Past QUICK_BUILD_MAX_BYTES read and written, the kernel's run time outweighs its build."""
    rows = QUICK_BUILD_MAX_BYTES // (4 * 1024) + 1
    weight = np.ones((rows, 1024), "int8")
    mod = calls_module(lambda: [_dequantize(weight, S, np.int8(0))])
    assert _targets(mod) == [OPTIMIZED_TARGET]


def test_the_bytes_a_kernel_reads_count_too() -> None:
    """A quantize writes a quarter of what it reads: the float input counts toward the bound."""
    rows = QUICK_BUILD_MAX_BYTES // (5 * 1024) + 1  # writes rows KiB, reads four times that
    assert rows * 1024 < QUICK_BUILD_MAX_BYTES // 4
    weight = np.ones((rows, 1024), "float32")
    small = np.ones((4, 1024), "float32")
    mod = calls_module(lambda: [_quantize(weight, S, np.int8(0)), _quantize(small, S, np.int8(0))])
    # one symbolic kernel serves both calls: together they read and write too much for -O0
    assert _targets(mod) == [OPTIMIZED_TARGET, OPTIMIZED_TARGET]
    assert _targets(calls_module(lambda: [_quantize(small, S, np.int8(0))])) == [QUICK_TARGET]


def test_both_levels_share_one_fold_and_one_cache(tmp_path) -> None:
    def calls():
        return [_dequantize(W.astype("int8"), S, np.int8(0)), relax.op.exp(_c(W))]

    mod = calls_module(calls)
    assert _targets(mod) == [QUICK_TARGET, OPTIMIZED_TARGET]
    stock = relax.transform.FoldConstant()(mod)
    cold = fgr.fold(mod, kernel_cache=tmp_path)
    warm = fgr.fold(mod, kernel_cache=tmp_path)
    assert (cold.report.kernels_compiled, cold.report.kernels_cached) == (2, 0)
    assert (warm.report.kernels_compiled, warm.report.kernels_cached) == (0, 2)
    assert tvm_ffi.structural_equal(cold.mod, stock)
    assert tvm_ffi.structural_equal(warm.mod, stock)


@pytest.mark.parametrize("poisoned", [False, True])
def test_values_known_only_at_evaluation_are_guarded(poisoned: bool) -> None:
    """Operands computed by earlier folds are checked before the -O0 kernel runs.

    A quantize of a folded 0 / 0 (NaN) and an int64 add of a folded value that overflows fail
    their guards and run -O3 builds of their kernels instead, compiled on demand.
    """
    numerator = np.float32([[0, 1], [2, 3]] if poisoned else [[1, 1], [2, 3]])
    factor = np.int64([2, 0] if poisoned else [1, 0])

    def calls():
        ratio = relax.op.divide(_c(numerator), _c(np.float32([[0, 1], [1, 1]])))
        offset = relax.op.multiply(_c(np.int64(2**61)), _c(factor))
        return [
            relax.op.quantize(
                ratio, _c(np.float32([0.05, 0.1])), _c(np.int8([0, 0])), axis=1, out_dtype="int8"
            ),
            relax.op.add(_c(np.int64([2**62, 1])), offset),
        ]

    mod = calls_module(calls)
    guarded = [k for k in _kernels(mod) if k.guard is not None]
    assert len(guarded) == 2 and all(k.target == QUICK_TARGET for k in guarded)
    result = fgr.fold(mod, kernel_cache=False)
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    # divide, multiply (-O3), quantize, add (-O0); then the two -O3 builds the guards asked for
    assert result.report.kernels_compiled == (6 if poisoned else 4)


_F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_SCALES = st.one_of(
    st.sampled_from([0.0, 1e-45, 1e-30, 0.05, 1.0, 3e38, float("inf"), float("nan")]),
    st.floats(2.0**-20, 2.0**20, width=32),
)
_QDTYPES = st.sampled_from(["int8", "uint8", "int16", "uint16"])


@st.composite
def _edge_quantize(draw):
    dtype = draw(_QDTYPES)
    data = np.array(draw(st.lists(_F32, min_size=1, max_size=6)), "float32")
    info = np.iinfo(dtype)
    zeros = st.integers(int(info.min), int(info.max))
    # one scale per element: buffers, as real per-channel scales (a scalar zero scale is an
    # immediate that TVM's simplifier rejects, in stock too)
    scale = np.array([draw(_SCALES) for _ in data], "float32")
    zero = np.array([draw(zeros) for _ in data], dtype)
    return _quantize(data, scale, zero, dtype, axis=0)


@st.composite
def _edge_dequantize(draw):
    dtype = draw(st.sampled_from(["int8", "uint8", "int16", "uint16", "int32"]))
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    data = np.array(draw(st.lists(ints, min_size=1, max_size=6)), dtype)
    zero = np.array([draw(st.one_of(st.just(0), ints)) for _ in data], dtype)
    scale = np.array([draw(_SCALES) for _ in data], "float32")
    return _dequantize(data, scale, zero, axis=0)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_edge_quantize(), _edge_dequantize()), min_size=1, max_size=3))
def test_edge_values_fold_to_stock_bits_at_either_level(calls) -> None:
    """RFC.md, guarantee 2: folded constants are bit-identical to stock's."""
    mod = calls_module(lambda: calls)
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(fgr.fold(mod, kernel_cache=False).mod, stock)
