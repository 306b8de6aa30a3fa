"""RFC.md, guarantees 1 and 2, for calls that share kernels (``fold_guard/relay/_engine/kernels.py``).

Elementwise calls of one signature are evaluated as one call on their flattened, concatenated
operands whatever their shapes; other calls repeated with one exact signature share one
prepared function. Each elementwise op is checked here against stock ``FoldConstant`` bit for
bit (structural equality compares constant bytes) on several shapes at once, with data that
reaches the corners of its arithmetic: NaN, infinities, signed zeros, subnormals, halfway cases
of rounding and values out of a cast's range.

White-box on purpose: it tests the Relay engine's kernel sharing (``_engine.evaluate``,
``_engine.kernels``), a private mechanism.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest
import tvm
from relay_ir import op_calls
from tvm import relay

import fold_guard
import fold_guard.relay as fgr
from fold_guard import Reason
from fold_guard.relay._engine import evaluate as _evaluate
from fold_guard.relay._engine import kernels as _kernels

#: Shapes of one rank: not multiples of the x86 schedule's vector width of 16, one that is, one longer.
SHAPES_2D = ((5, 3), (4, 32), (3, 37))
SHAPES_3D = ((2, 5, 3), (3, 4, 16), (2, 2, 33))

#: Float32 values at the corners of elementwise arithmetic.
SPECIAL_F32 = np.array(
    [
        0.0,
        -0.0,
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        1e-45,
        -1e-40,
        1.17549435e-38,
        0.5,
        1.5,
        2.5,
        -2.5,
        -0.5,
        127.5,
        128.0,
        -128.5,
        255.5,
        300.0,
        -300.0,
        65504.0,
        65520.0,
        2.0**31,
        -(2.0**31) - 256.0,
        3e9,
        1e30,
        -3.4e38,
        88.7,
        -104.0,
        1e-7,
    ],
    dtype="float32",
)


def _data(shape: Sequence[int], dtype: str, seed: int, *, positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if dtype.startswith("float"):
        values = rng.standard_normal(size).astype("float32") * np.float32(4.0)
        specials = SPECIAL_F32[: max(1, size // 2)]
        picks = rng.choice(size, size=min(size, len(specials)), replace=False)
        values[picks] = specials[: len(picks)]
        if positive:
            values = np.abs(values) + np.float32(1e-3)
        return values.astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    low = 1 if positive else int(info.min)
    return rng.integers(low, int(info.max), size=size, endpoint=True).astype(dtype).reshape(shape)


def _tuple_module(calls: Sequence[relay.Expr]) -> tvm.IRModule:
    """``main() = (call_0, call_1, ...)``, type-inferred."""
    return relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([], relay.Tuple(list(calls))))
    )


def _fold_both(calls: List[relay.Expr], policy: str) -> Tuple[tvm.IRModule, tvm.IRModule]:
    mod = _tuple_module(calls)
    stock = relay.transform.FoldConstant(fold_qnn=policy == "fold-qnn")(mod)
    return fgr.fold(mod, policy=policy, strict=True).mod, stock


class _Spy:
    """Records the shared evaluations of a fold: calls per flattened run, per prepared function."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.flattened: List[int] = []
        self.prepared: List[List[int]] = []
        real_flat_calls, real_kernel = _evaluate.flat_calls, _kernels.PreparedKernel
        spy = self

        def flat_calls(calls, forms):
            spy.flattened.append(len(calls))
            return real_flat_calls(calls, forms)

        class Recording(real_kernel):  # type: ignore[misc, valid-type]
            def __init__(self, template: relay.Call) -> None:
                super().__init__(template)
                self.record = [0]
                # The flattened path prepares its chunk calls (1-D, FLAT_CHUNK elements) too.
                if tuple(template.args[0].data.shape) != (_kernels.FLAT_CHUNK,):
                    spy.prepared.append(self.record)

            def __call__(self, call: relay.Call) -> object:
                value = super().__call__(call)
                self.record[0] += 1
                return value

        monkeypatch.setattr(_evaluate, "flat_calls", flat_calls)
        monkeypatch.setattr(_evaluate, "PreparedKernel", Recording)


# (id, policy, builder of one call from a seed and a shape). Each builder is called per shape.
Builder = Callable[[int, Tuple[int, ...]], relay.Expr]


def _c(array: np.ndarray) -> relay.Constant:
    return relay.const(array)


def _unary(name: str, *, positive: bool = False) -> Builder:
    op = getattr(relay, name) if hasattr(relay, name) else getattr(relay.op, name)
    return lambda seed, shape: op(_c(_data(shape, "float32", seed, positive=positive)))


def _binary(name: str, dtype: str, broadcast: str) -> Builder:
    op = getattr(relay, name)

    def build(seed: int, shape: Tuple[int, ...]) -> relay.Expr:
        other = {"full": shape, "row": shape[-1:], "column": shape[:-1] + (1,)}[broadcast]
        # Integer division by zero traps (SIGFPE) on x86, in stock as here: no zero divisors.
        rhs = _data(other, dtype, seed + 1, positive=name == "divide" and dtype != "float32")
        lhs = _data(shape, dtype, seed)
        if dtype == "float32":
            # NaN meeting NaN is never flattened (test_nan_meeting_nan_keeps_the_static_kernel):
            # here NaNs meet numbers only.
            lhs = np.where(np.isnan(lhs) & np.isnan(rhs), np.float32(1.0), lhs)
        return op(_c(lhs), _c(rhs))

    return build


def _cast(dtype_in: str, dtype_out: str) -> Builder:
    return lambda seed, shape: relay.cast(_c(_data(shape, dtype_in, seed)), dtype_out)


def _quantize(axis: int, out_dtype: str, per_channel: bool) -> Builder:
    def build(seed: int, shape: Tuple[int, ...]) -> relay.Expr:
        data = _data(shape, "float32", seed)
        if per_channel:
            channels = shape[axis]
            scale = _c(np.linspace(0.01, 0.2, channels, dtype="float32"))
            zero = _c(np.arange(channels, dtype="int32") % 5 - 2)
        else:
            scale, zero = _c(np.float32(0.037)), _c(np.int32(3))
        return relay.qnn.op.quantize(_c(data), scale, zero, axis=axis, out_dtype=out_dtype)

    return build


def _dequantize(axis: int, in_dtype: str, per_channel: bool) -> Builder:
    def build(seed: int, shape: Tuple[int, ...]) -> relay.Expr:
        data = _data(shape, in_dtype, seed)
        if per_channel:
            channels = shape[axis]
            scale = _c(np.linspace(0.01, 0.2, channels, dtype="float32"))
            zero = _c(np.arange(channels, dtype="int32") % 5 - 2)
        else:
            scale, zero = _c(np.float32(0.037)), _c(np.int32(-4))
        return relay.qnn.op.dequantize(_c(data), scale, zero, axis=axis)

    return build


CASES: Dict[str, Tuple[str, Builder]] = {
    "qnn.quantize-per-tensor-int8": ("fold-qnn", _quantize(0, "int8", False)),
    "qnn.quantize-axis0-int8": ("fold-qnn", _quantize(0, "int8", True)),
    "qnn.quantize-axis1-uint8": ("fold-qnn", _quantize(1, "uint8", True)),
    "qnn.quantize-axis0-int32": ("fold-qnn", _quantize(0, "int32", True)),
    "qnn.dequantize-per-tensor-int8": ("fold-qnn", _dequantize(0, "int8", False)),
    "qnn.dequantize-axis0-int8": ("fold-qnn", _dequantize(0, "int8", True)),
    "qnn.dequantize-axis1-int32": ("fold-qnn", _dequantize(1, "int32", True)),
    "cast-f32-int32": ("default", _cast("float32", "int32")),
    "cast-f32-int64": ("default", _cast("float32", "int64")),
    "cast-f32-f16": ("default", _cast("float32", "float16")),
    "cast-f32-f64": ("default", _cast("float32", "float64")),
    "cast-i32-f32": ("default", _cast("int32", "float32")),
    "cast-i32-int8": ("default", _cast("int32", "int8")),
    "cast-i8-i32": ("default", _cast("int8", "int32")),
    "round": ("default", _unary("round")),
    "floor": ("default", _unary("floor")),
    "ceil": ("default", _unary("ceil")),
    "negative": ("default", _unary("negative")),
    "sqrt": ("default", _unary("sqrt")),
    "rsqrt": ("default", _unary("rsqrt", positive=True)),
    "exp": ("default", _unary("exp")),
    "log": ("default", _unary("log")),
    "sigmoid": ("default", _unary("sigmoid")),
    "tanh": ("default", _unary("tanh")),
    "clip": (
        "default",
        lambda seed, shape: relay.clip(_c(_data(shape, "float32", seed)), -1.5, 2.0),
    ),
}
for _name in ("add", "subtract", "multiply", "divide", "maximum", "minimum"):
    for _dtype in ("float32", "int32"):
        for _broadcast in ("full", "row", "column"):
            CASES[f"{_name}-{_dtype}-{_broadcast}"] = (
                "default",
                _binary(_name, _dtype, _broadcast),
            )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "shapes", [SHAPES_2D, pytest.param(SHAPES_3D, marks=pytest.mark.slow)], ids=["2d", "3d"]
)
def test_flattened_elementwise_calls_are_bit_identical_to_stock(case, shapes, monkeypatch):
    policy, build = CASES[case]
    calls = [build(seed, shape) for seed, shape in enumerate(shapes)]
    spy = _Spy(monkeypatch)
    ours, stock = _fold_both(calls, policy)
    tvm.ir.assert_structural_equal(ours, stock)
    # The differently shaped calls went through one flattened evaluation.
    assert spy.flattened == [len(shapes)] and spy.prepared == []


def _quantize_chain(shapes: Sequence[Tuple[int, int]]) -> tvm.IRModule:
    return _tuple_module(
        [_quantize(0, "int8", True)(seed, shape) for seed, shape in enumerate(shapes)]
    )


@pytest.fixture
def kernel_builds():
    """Counts the kernel builds of the interpreter (``relay.backend.build``) inside the block."""
    name = "relay.backend.build"
    real = tvm.get_global_func(name)
    counter = {"builds": 0}

    def counting(*args):
        counter["builds"] += 1
        return real(*args)

    tvm.register_func(name, counting, override=True)
    try:
        yield counter
    finally:
        tvm.register_func(name, real, override=True)


def _builds(counter: Dict[str, int], fold: Callable[[], object]) -> int:
    before = counter["builds"]
    fold()
    return counter["builds"] - before


def test_distinct_shapes_of_one_signature_compile_one_set_of_kernels(kernel_builds):
    """Per-channel quantize of 3 and of 8 differently shaped weights builds the same kernels
    (the ops of its canonical form, once), in one interpreter run."""
    few = _quantize_chain([(17 + i, 16 + i) for i in range(3)])
    many = _quantize_chain([(17 + i, 16 + i) for i in range(8)])
    builds_few = _builds(kernel_builds, lambda: fgr.fold(few, policy="fold-qnn"))
    result = fgr.fold(many, policy="fold-qnn")
    builds_many = _builds(kernel_builds, lambda: fgr.fold(many, policy="fold-qnn"))
    assert builds_few == builds_many > 0
    assert result.report.evaluation_runs == 1
    tvm.ir.assert_structural_equal(result.mod, relay.transform.FoldConstant(fold_qnn=True)(many))


def test_repeated_signatures_reuse_stocks_static_kernels(kernel_builds, monkeypatch):
    """Six softmaxes of one shape (not elementwise): one prepared function, as many builds as
    one call's batched evaluation, bit-identical to stock."""

    def softmaxes(count: int) -> List[relay.Expr]:
        return [relay.nn.softmax(_c(_data((8, 8), "float32", seed))) for seed in range(count)]

    builds_one = _builds(kernel_builds, lambda: fgr.fold(_tuple_module(softmaxes(1))))
    spy = _Spy(monkeypatch)
    builds_six = _builds(kernel_builds, lambda: fgr.fold(_tuple_module(softmaxes(6))))
    assert builds_six == builds_one > 0
    assert spy.prepared == [[6]] and spy.flattened == []
    ours, stock = _fold_both(softmaxes(6), "default")
    tvm.ir.assert_structural_equal(ours, stock)


@pytest.mark.parametrize(
    "build, why",
    [
        (lambda seed, shape: relay.sum(_c(_data(shape, "float32", seed)), axis=1), "a reduction"),
        (lambda seed, shape: relay.nn.softmax(_c(_data(shape, "float32", seed))), "a reduction"),
        (
            lambda seed, shape: relay.reshape(_c(_data(shape, "float32", seed)), (-1,)),
            "not elementwise",
        ),
        (
            lambda seed, shape: relay.transpose(_c(_data(shape, "float32", seed))),
            "not elementwise",
        ),
        (_cast("float32", "int8"), "a cast whose out-of-range values differ between kernels"),
        (_cast("float32", "uint8"), "a cast whose out-of-range values differ between kernels"),
    ],
    ids=["sum", "softmax", "reshape", "transpose", "cast-f32-int8", "cast-f32-uint8"],
)
def test_excluded_signatures_keep_static_kernels_per_shape(build, why, kernel_builds, monkeypatch):
    """Signatures that may not be flattened (``why`` says why) are not: differently shaped calls
    compile kernels per shape, as in stock, and stay bit-identical to it."""
    shapes = SHAPES_2D
    calls = [build(seed, shape) for seed, shape in enumerate(shapes)]
    assert all(_kernels.flat_form(call) is None for call in calls)
    spy = _Spy(monkeypatch)
    builds_one = _builds(kernel_builds, lambda: fgr.fold(_tuple_module(calls[:1])))
    builds_all = _builds(kernel_builds, lambda: fgr.fold(_tuple_module(calls)))
    assert builds_all >= len(shapes) * builds_one > 0
    assert spy.flattened == [] and spy.prepared == []  # lone signatures: the batched path
    ours, stock = _fold_both(calls, "default")
    tvm.ir.assert_structural_equal(ours, stock)


def test_qnn_ops_that_read_constant_values_stay_batched():
    """``qnn.requantize`` computes its fixed-point multipliers from the scale constants' values
    during canonicalization: with a parameter in their place it would lower differently, so its
    calls keep the batched path, which evaluates the very expression stock evaluates."""
    scales = relay.const(np.linspace(0.01, 0.2, 4, dtype="float32"))
    zero = relay.const(0)
    call = relay.qnn.op.requantize(
        relay.const(np.arange(12, dtype="int32").reshape(3, 4)),
        scales,
        zero,
        relay.const(np.float32(0.05)),
        zero,
        axis=1,
    )
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([], call)))
    assert _kernels.prepared_key(mod["main"].body) is None
    assert _kernels.flat_form(mod["main"].body) is None
    tvm.ir.assert_structural_equal(
        fgr.fold(mod, policy="fold-qnn").mod, relay.transform.FoldConstant(fold_qnn=True)(mod)
    )


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide"])
def test_nan_meeting_nan_keeps_the_static_kernel(name):
    """Where both operands of a float add / subtract / multiply / divide are NaN, the result is
    one of the two NaNs, and which one depends on the instruction's operand order, which LLVM
    may commute: such a call is evaluated alone, by stock's kernel, never flattened."""
    lhs = _data((3, 4, 16), "float32", 1)
    rhs = _data((3, 4, 1), "float32", 2)
    lhs[1, 2, 11], rhs[1, 2, 0] = np.float32(np.nan), -np.float32(np.nan)
    clean = _data((3, 4, 16), "float32", 3)
    op = getattr(relay, name)
    calls = [op(_c(lhs), _c(rhs)), op(_c(clean), _c(rhs)), op(_c(clean[:2]), _c(rhs[:2]))]
    assert _kernels.flat_form(calls[0]) is None
    assert _kernels.flat_form(calls[1]) is not None
    ours, stock = _fold_both(calls, "default")
    tvm.ir.assert_structural_equal(ours, stock)


def test_scalars_that_differ_only_in_bits_do_not_share_a_kernel():
    """``add(A, 0.0)`` and ``add(A, -0.0)`` differ only in the sign of a scalar inlined as an
    immediate (``-0.0 + 0.0`` is ``0.0``; ``-0.0 + -0.0`` is ``-0.0``): two forms, each bit-exact."""
    data = np.array([[-0.0, 0.0, 1.0], [-0.0, -0.0, 2.0]], dtype="float32")
    calls = [relay.add(relay.const(data), relay.const(np.float32(zero))) for zero in (0.0, -0.0)]
    taller = np.concatenate([data, -data[:1]])
    calls += [relay.add(relay.const(taller), relay.const(np.float32(zero))) for zero in (0.0, -0.0)]
    forms = {_kernels.flat_form(call).key for call in calls}
    assert len(forms) == 2
    ours, stock = _fold_both(calls, "default")
    tvm.ir.assert_structural_equal(ours, stock)


def test_a_failing_shared_evaluation_falls_back_and_is_reported(monkeypatch):
    """When the flattened evaluation fails, its calls are evaluated the way stock does; a call
    that fails there too is kept (evaluation failed, with the error), the others still fold, and
    ``strict`` raises naming it."""
    real_run, real_call = _evaluate._run, _kernels.PreparedKernel.__call__
    sentinel = np.float32(1234.5)

    def is_bad(expr: relay.Expr) -> bool:
        return bool((expr.args[0].data.numpy() == sentinel).any())

    def run(exprs):
        if any(is_bad(expr) for expr in exprs):
            raise tvm.TVMError("a kernel failed")
        return real_run(exprs)

    def call(self, expr):
        if is_bad(expr):
            raise tvm.TVMError("a flattened kernel failed")
        return real_call(self, expr)

    monkeypatch.setattr(_evaluate, "_run", run)
    monkeypatch.setattr(_kernels.PreparedKernel, "__call__", call)
    calls = [_quantize(0, "int8", True)(seed, (17 + seed, 16)) for seed in range(4)]
    bad = _data((19, 16), "float32", 2)
    bad[3, 5] = sentinel
    calls[2] = relay.qnn.op.quantize(_c(bad), *calls[2].args[1:], axis=0, out_dtype="int8")
    mod = _tuple_module(calls)
    result = fgr.fold(mod, policy="fold-qnn")
    reasons = [d.reason for d in result.plan.decisions if d.op == "qnn.quantize"]
    assert reasons.count(Reason.EVAL_FAILED) == 1 and reasons.count(Reason.FOLDED) == 3
    (failed,) = [d for d in result.plan.decisions if d.reason is Reason.EVAL_FAILED]
    assert "TVMError: a kernel failed" in failed.detail
    assert len(op_calls(result.mod, "qnn.quantize")) == 1
    with pytest.raises(
        fold_guard.FoldNotPossibleError, match=r"evaluating %\d+ = qnn.quantize failed"
    ):
        fgr.fold(mod, policy="fold-qnn", strict=True)


def test_a_function_that_types_otherwise_than_the_call_is_not_used(monkeypatch):
    """A prepared function must type exactly as stock's expression (the op over constants): an
    op whose relation read a tensor operand's value would lower to other kernels over a
    parameter. When the types differ the function is not used (here faked, as no Relay op
    relation of TVM 0.16 reads a non-scalar constant), and the batched path evaluates the calls."""
    real = _kernels._result_type

    def result_type(func):
        return relay.TensorType((), "int8") if func.params else real(func)

    monkeypatch.setattr(_kernels, "_result_type", result_type)
    spy = _Spy(monkeypatch)
    calls = [relay.nn.softmax(_c(_data((4, 4), "float32", seed))) for seed in range(3)]
    ours, stock = _fold_both(calls, "default")
    tvm.ir.assert_structural_equal(ours, stock)
    assert spy.prepared == []
