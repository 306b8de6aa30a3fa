"""Data movement, layout and creation ops fold to stock's bytes with no slow compile.

    y = broadcast_to / reshape / permute_dims / concat / split / strided_slice / take / gather /
        tile / repeat / flip / pad / full / zeros / ones / where / tril / astype (exact) (C)
        ==>  y a constant, byte-identical to stock's; its kernel, where one runs, built at -O0

Which kernels only move data is read from their TIR (``fold_guard/relax/_engine/movement.py``),
not from the op's name: every value stored is a load, an immediate, an exact cast or an integer
select. Such a kernel computes the same bits at LLVM -O0 as at stock's -O3 (nothing in it is
left undefined by LLVM's IR), so it is built at -O0; a *fill* (every element one bit pattern:
``broadcast_to`` of a one-element constant, a transpose of that, ``zeros``) is written without
a kernel at all, and not even written where only other fills read it. Each op is checked against
stock's bytes with the kernel (host copies and fills off) and with every mechanism on.

White-box on purpose: it tests the fast engine's data-movement reading (``_engine.movement``,
``strategy``), a private mechanism.
"""

from __future__ import annotations

from typing import Callable, List

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
from fold_guard.relax._engine import fast
from fold_guard.relax._engine.movement import moves_data, read_movement
from fold_guard.relax._engine.opt_level import QUICK_TARGET
from fold_guard.relax._engine.strategy import Strategy, Way, choose_strategies
from fold_guard.relax._translate import analyse

KERNELS_ONLY = EngineOptions(host_copies=False, fills=False)
DEFAULTS = EngineOptions()


def _c(array) -> tvm.ir.GenericConst:
    array = np.asarray(array)
    return relax.const(array, str(array.dtype))  # relax.const alone narrows int64 to int32


def _strategies(mod: tvm.IRModule, options: EngineOptions = DEFAULTS) -> List[Strategy]:
    """How the fast engine runs each folded call of ``mod``, in binding order."""
    analysis = analyse(mod, "default", StepTimer())
    plan = plan_folds(analysis.graph, analysis.policy)
    sites, kernels = analysis.translation.sites, analysis.kernels
    chosen = choose_strategies(plan, analysis.graph, sites, kernels, options)
    return [chosen[node.id] for node in analysis.graph.nodes if node.id in chosen]


def _assert_stock_bytes(mod: tvm.IRModule, options: EngineOptions) -> fgr.FoldResult:
    result = fgr.fold(mod, engine_options=options)
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(result.mod, stock), result.mod.script()
    assert result.report.fallbacks == ()
    return result


# NaN payloads (quiet and signalling, both signs), infinities and a negative zero: a copy that
# went through a float register or a float conversion would change some of them.
_ODD_FLOATS = np.array(
    [0x7FC00001, 0xFFA12345, 0x7F800000, 0x80000000, 0x3F800000, 0x00000001], "uint32"
).view("float32")
W = np.concatenate([_ODD_FLOATS, np.linspace(-3, 3, 18, dtype="float32")]).reshape(2, 3, 4)
HALF = W.astype("float16")
I8 = np.arange(-6, 6, dtype="int8").reshape(3, 4) * np.int8(21)
I32 = np.array([[-(2**31), 2**31 - 1, -1, 0]], "int32")

#: op -> a call on non-uniform constants (so that its kernel runs, or NumPy copies it)
DATA_MOVEMENT: dict[str, Callable[[], relax.Expr]] = {
    "broadcast_to": lambda: relax.op.broadcast_to(_c(W[:1]), relax.ShapeExpr([3, 3, 4])),
    "reshape": lambda: relax.op.reshape(_c(W), (6, 4)),
    "permute_dims": lambda: relax.op.permute_dims(_c(W), [2, 0, 1]),
    "expand_dims": lambda: relax.op.expand_dims(_c(W), [1]),
    "squeeze": lambda: relax.op.squeeze(_c(W[:1]), [0]),
    "flatten": lambda: relax.op.flatten(_c(W)),
    "concat": lambda: relax.op.concat([_c(W), _c(-W)], axis=1),
    "split": lambda: relax.op.split(_c(W), 2, axis=2),
    "strided_slice": lambda: relax.op.strided_slice(
        _c(W), axes=[2], begin=[1], end=[4], strides=[2]
    ),
    "take": lambda: relax.op.take(_c(W), _c(np.array([2, 0], "int64")), axis=1),
    "take_clip": lambda: relax.op.take(_c(W), _c(np.array([-4, 9], "int64")), 1, mode="clip"),
    "gather_elements": lambda: relax.op.gather_elements(
        _c(W), _c(np.tile(np.array([[2], [0], [1]], "int64"), (2, 1, 4))), axis=1
    ),
    "gather_nd": lambda: relax.op.gather_nd(_c(W), _c(np.array([[0, 1], [1, 2]], "int64"))),
    "tile": lambda: relax.op.tile(_c(W), [1, 2, 1]),
    "repeat": lambda: relax.op.repeat(_c(W), 2, axis=1),
    "flip": lambda: relax.op.flip(_c(W), axis=1),
    "pad": lambda: relax.op.nn.pad(_c(W), [0, 0, 1, 1, 2, 0], pad_value=1.5),
    "layout_transform": lambda: relax.op.layout_transform(_c(W), lambda a, b, d: (b, a, d)),
    "where": lambda: relax.op.where(_c(W > 0), _c(W), _c(-W)),
    "tril": lambda: relax.op.tril(_c(W)),
    "triu": lambda: relax.op.triu(_c(W), 1),
    "zeros": lambda: relax.op.zeros((4, 4), "float32"),
    "ones": lambda: relax.op.ones((4, 4), "int8"),
    "full": lambda: relax.op.full((4, 4), _c(np.float32(2.5))),
    "full_like": lambda: relax.op.full_like(_c(W), _c(np.float32(-0.0))),
    "zeros_like": lambda: relax.op.zeros_like(_c(HALF)),
    "astype int8 -> uint8": lambda: relax.op.astype(_c(I8), "uint8"),
    "astype int32 -> uint32": lambda: relax.op.astype(_c(I32), "uint32"),
    "astype int32 -> int8": lambda: relax.op.astype(_c(I32), "int8"),
    "astype int8 -> int64": lambda: relax.op.astype(_c(I8), "int64"),
    "astype int8 -> float32": lambda: relax.op.astype(_c(I8), "float32"),
    "astype float16 -> float32": lambda: relax.op.astype(_c(HALF), "float32"),
}
#: ops whose 0-d operand stock's kernel has as an immediate: without fills, stock's own kernel
#: computes them (``_stock.value_shapes_kernel``); with fills, they are fills (below)
VALUE_COMPILED_IN = frozenset({"full", "full_like"})


@pytest.mark.parametrize("name", sorted(DATA_MOVEMENT))
def test_a_data_movement_kernel_is_read_as_one_from_its_tir(name) -> None:
    mod = calls_module(lambda: [DATA_MOVEMENT[name]()])
    analysis = analyse(mod, "default", StepTimer())
    (kernel,) = {id(k): k for k in analysis.kernels.values()}.values()
    assert moves_data(kernel.prim_func), kernel.prim_func.script()
    (strategy,) = _strategies(mod, KERNELS_ONLY)
    if name in VALUE_COMPILED_IN:
        assert strategy.way is Way.STOCK  # stock's own kernel, its value an immediate
    else:
        assert strategy.way is Way.KERNEL and strategy.target == QUICK_TARGET


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DATA_MOVEMENT))
def test_a_data_movement_op_folds_to_stock_bytes_at_o0_and_with_every_mechanism(name) -> None:
    mod = calls_module(lambda: [DATA_MOVEMENT[name]()])
    _assert_stock_bytes(mod, KERNELS_ONLY)
    _assert_stock_bytes(mod, EngineOptions())


#: kernels that compute: none of them is read as data movement, so each keeps stock's -O3
#: unless an arithmetic rule of ``opt_level`` proves -O0 exact for it
COMPUTING: dict[str, Callable[[], relax.Expr]] = {
    "add": lambda: relax.op.add(_c(W), _c(W)),
    "exp": lambda: relax.op.exp(_c(W)),
    "sum": lambda: relax.op.sum(_c(W), axis=1),
    "maximum": lambda: relax.op.maximum(_c(W), _c(-W)),
    "clip": lambda: relax.op.clip(_c(W), -1.0, 1.0),
    "less of floats": lambda: relax.op.less(_c(W), _c(-W)),
    "astype float32 -> int32": lambda: relax.op.astype(_c(W[1:]), "int32"),
    "astype float32 -> float16": lambda: relax.op.astype(_c(W), "float16"),
    "astype int32 -> float32": lambda: relax.op.astype(_c(I32), "float32"),
}


@pytest.mark.parametrize("name", sorted(COMPUTING))
def test_a_kernel_that_computes_is_not_read_as_data_movement(name) -> None:
    mod = calls_module(lambda: [COMPUTING[name]()])
    analysis = analyse(mod, "default", StepTimer())
    (kernel,) = {id(k): k for k in analysis.kernels.values()}.values()
    assert read_movement(kernel.prim_func) is None, kernel.prim_func.script()
    assert not moves_data(kernel.prim_func)


# --------------------------------------------------------------------------- fills


def _one(value, dtype: str) -> tvm.ir.GenericConst:
    return _c(np.array([value], dtype))


#: call -> the bits every element of its result has, as a fill (None: not a fill)
FILLS: dict[str, Callable[[], relax.Expr]] = {
    "broadcast_to of (1,)": lambda: relax.op.broadcast_to(
        _one(0.02, "float32"), relax.ShapeExpr([32, 528, 1, 1])
    ),
    "broadcast_to of a NaN payload": lambda: relax.op.broadcast_to(
        _c(np.array([0x7FA00001], "uint32").view("float32")), relax.ShapeExpr([3, 5])
    ),
    "broadcast_to of -0.0 (1, 1)": lambda: relax.op.broadcast_to(
        _c(np.array([[-0.0]], "float32")), relax.ShapeExpr([4, 6])
    ),
    "broadcast_to float16": lambda: relax.op.broadcast_to(
        _one(1.5, "float16"), relax.ShapeExpr([7])
    ),
    "broadcast_to bool": lambda: relax.op.broadcast_to(_one(True, "bool"), relax.ShapeExpr([9])),
    "broadcast_to of a 0-d 0.25": lambda: relax.op.broadcast_to(
        _c(np.float32(0.25)), relax.ShapeExpr([2, 3])
    ),
    "permute_dims of a fill": lambda: relax.op.permute_dims(
        relax.op.broadcast_to(_one(-7, "int8"), relax.ShapeExpr([300, 40]))
    ),
    "reshape of a fill": lambda: relax.op.reshape(
        relax.op.broadcast_to(_one(3, "int64"), relax.ShapeExpr([6, 4])), (4, 6)
    ),
    "pad of a fill with its own value": lambda: relax.op.nn.pad(
        relax.op.broadcast_to(_one(1.5, "float32"), relax.ShapeExpr([2, 2])),
        [1, 1, 0, 0],
        pad_value=1.5,
    ),
    "concat of two equal fills": lambda: relax.op.concat(
        [
            relax.op.broadcast_to(_one(2.0, "float32"), relax.ShapeExpr([2, 3])),
            relax.op.broadcast_to(_one(2.0, "float32"), relax.ShapeExpr([1, 3])),
        ]
    ),
    "zeros": lambda: relax.op.zeros((8, 8), "float32"),
    "ones_like": lambda: relax.op.ones_like(_c(I8)),
    "full of a 0-d literal": lambda: relax.op.full((3, 3), _c(np.int32(-5))),
    # values stock's legalizers compile in specially (``_stock.value_shapes_kernel``): stored
    # as immediates, they are still these bits
    "full of a 0-d 1.0": lambda: relax.op.full((2, 5), _c(np.float32(1.0))),
    "broadcast_to of a 0-d -0.0": lambda: relax.op.broadcast_to(
        _c(np.float32(-0.0)), relax.ShapeExpr([4, 2])
    ),
    "full_like of a 0-d -1.0": lambda: relax.op.full_like(_c(W), _c(np.float32(-1.0))),
}
#: calls that look close but are not fills (each still folds to stock's bytes)
NOT_FILLS: dict[str, Callable[[], relax.Expr]] = {
    "broadcast_to of (2,)": lambda: relax.op.broadcast_to(
        _c(np.array([1, 2], "float32")), relax.ShapeExpr([3, 2])
    ),
    "broadcast_to of a 0-d NaN (stock compiles it in)": lambda: relax.op.broadcast_to(
        _c(np.float32(np.nan)), relax.ShapeExpr([3])
    ),
    "pad of a fill with another value": lambda: relax.op.nn.pad(
        relax.op.broadcast_to(_one(1.5, "float32"), relax.ShapeExpr([2, 2])),
        [1, 1, 0, 0],
        pad_value=2.5,
    ),
    "concat of two different fills": lambda: relax.op.concat(
        [
            relax.op.broadcast_to(_one(2.0, "float32"), relax.ShapeExpr([2, 3])),
            relax.op.broadcast_to(_one(-2.0, "float32"), relax.ShapeExpr([1, 3])),
        ]
    ),
    "astype of a fill (a cast)": lambda: relax.op.astype(
        relax.op.broadcast_to(_one(5, "int8"), relax.ShapeExpr([4])), "int32"
    ),
}


@pytest.mark.parametrize("name", sorted(FILLS))
def test_a_fill_is_written_without_a_kernel_as_stock_writes_it(name) -> None:
    mod = calls_module(lambda: [FILLS[name]()])
    assert all(s.way is Way.FILL for s in _strategies(mod))
    result = _assert_stock_bytes(mod, EngineOptions(threads=2))
    assert result.report.kernels_compiled == 0


@pytest.mark.parametrize("name", sorted(NOT_FILLS))
def test_a_call_that_is_no_fill_runs_its_kernel_with_stock_bytes(name) -> None:
    mod = calls_module(lambda: [NOT_FILLS[name]()])
    assert _strategies(mod)[-1].way is not Way.FILL
    _assert_stock_bytes(mod, EngineOptions())


def test_a_fill_only_fills_read_is_never_written(monkeypatch) -> None:
    """broadcast_to (16 MiB) -> permute_dims -> the constant: only the transpose is written, in
    two parts on the pool; the broadcast exists only as its bits."""
    written: List[int] = []
    real = fast.fill_parts

    def counting(out, scalar, parts):
        written.append(int(np.prod(out.shape)))
        return real(out, scalar, parts)

    monkeypatch.setattr(fast, "fill_parts", counting)
    big = relax.op.broadcast_to(_one(0.5, "float32"), relax.ShapeExpr([4096, 1024]))
    mod = calls_module(lambda: [relax.op.permute_dims(big)])
    result = fgr.fold(mod, engine_options=EngineOptions(threads=2))
    assert written == [4096 * 1024]
    (constant,) = [
        field
        for field in result.mod["main"].body.blocks[0].bindings[-1].value.fields
        if isinstance(field, tvm.ir.GenericConst)
    ]
    assert tuple(constant.value.shape) == (1024, 4096)
    assert (constant.value.numpy() == np.float32(0.5)).all()


def test_the_fills_switch_leaves_the_kernels_and_the_bytes() -> None:
    mod = calls_module(lambda: [FILLS["permute_dims of a fill"](), FILLS["zeros"]()])
    assert [s.way for s in _strategies(mod, EngineOptions(fills=False))] == [
        Way.KERNEL,
        Way.HOST_COPY,
        Way.KERNEL,
    ]
    _assert_stock_bytes(mod, EngineOptions(fills=False))


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    bits=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["float32", "int32", "uint32", "float16", "int8", "uint8"]),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    transpose=st.booleans(),
)
def test_a_fill_has_the_reference_engines_bits(bits, dtype, shape, transpose) -> None:
    """Any bit pattern (NaN payloads included), dtype and shape: the fill is the reference
    engine's result (each call built and run as stock does), bit for bit."""
    width = np.dtype(dtype).itemsize
    value = np.array([bits & ((1 << (8 * width)) - 1)], f"u{width}").view(dtype)

    def calls():
        call = relax.op.broadcast_to(_c(value), relax.ShapeExpr(shape))
        return [relax.op.permute_dims(call) if transpose else call]

    mod = calls_module(calls)
    folded = fgr.fold(mod, engine_options=EngineOptions())
    reference = fgr.fold(mod, reference_engine=True)
    assert tvm_ffi.structural_equal(folded.mod, reference.mod)
    assert folded.report.kernels_compiled == 0


def test_a_lazy_fill_a_failed_consumer_needs_is_written_after_all(monkeypatch) -> None:
    """A fill whose only reader fails in the fast engine: the reader is rerun on the reference
    engine, which reads the fill's tensor (computed as stock would), and the bytes are stock's."""
    real = fast.fill_parts
    calls_seen: List[int] = []

    def failing_for_the_transpose(out, scalar, parts):
        calls_seen.append(len(out.shape))
        if tuple(out.shape) == (40, 300):
            raise RuntimeError("injected fault")
        return real(out, scalar, parts)

    monkeypatch.setattr(fast, "fill_parts", failing_for_the_transpose)
    mod = calls_module(lambda: [FILLS["permute_dims of a fill"]()])
    result = fgr.fold(mod, engine_options=EngineOptions())
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(result.mod, stock)
    assert len(result.report.fallbacks) == 1 and "injected fault" in result.report.fallbacks[0]
