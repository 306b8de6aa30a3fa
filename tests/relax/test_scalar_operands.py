"""A 0-d constant operand compiled in as stock compiles it: the same bytes (RFC.md, guarantee 2).

Stock legalizes ``op(<tensor>, <0-d const>)`` with the scalar written into the kernel as an
immediate; TVM's constant folder and LLVM then rewrite some values (``pow(x, 0.5)`` becomes
``sqrt(x)``, ``x * -1.0`` a negation that flips a NaN's sign, ``x + 0.0`` is ``x``, which keeps
``-0.0``). fold_guard's shared kernels read scalars from memory, which gives the same bytes for
every other value; for these the call runs stock's own kernel. ONNX's ``LpPool`` found it::

    lv1 = power(abs(X), 2.0); lv2 = avg_pool2d(lv1); gv = power(25 * lv2, 0.5)
    ==> one constant, byte for byte stock's (it was up to 4 ulp off)

Each case is folded with the scalar as a literal constant and as a value folded earlier in the
same pass (its value known only once evaluated), by both engines, and compared with stock by
``tvm_ffi.structural_equal`` (constants' bytes, NaN payloads included).

White-box on purpose: it tests a stock rule of ``_stock`` (``value_shapes_kernel``), a private
mechanism.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Action
from fold_guard.relax._stock import value_shapes_kernel

#: Data at the corners of float arithmetic: signed zeros, infinities, NaNs with payloads,
#: subnormals, the largest float, and some ordinary values.
DATA = np.concatenate(
    [
        np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-40, -1e-40, 3.4e38, 2.0, 0.5], "f4"),
        np.array([0x7FC00123, 0xFFC00456], "u4").view("f4"),
        np.linspace(-7.5, 9.25, 11, dtype="f4"),
    ]
)


def _module(op: str, value: float, *, pending: bool, scalar_first: bool) -> tvm.IRModule:
    """``gv = op(DATA, value)`` (or ``op(value, DATA)``), the scalar literal or folded first."""
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            scalar: relax.Expr = relax.const(np.float32(value))
            if pending:  # a reshape of a 1-element constant: folded in the same pass
                one = relax.const(np.array([value], "float32"))
                scalar = bb.emit(relax.op.reshape(one, relax.ShapeExpr([])))
            args = (scalar, relax.const(DATA)) if scalar_first else (relax.const(DATA), scalar)
            gv = bb.emit_output(getattr(relax.op, op)(*args))
        bb.emit_func_output(gv)
    return bb.get()


def _folds_like_stock(mod: tvm.IRModule, reference: bool) -> None:
    stock = relax.transform.FoldConstant()(mod)
    ours = fgr.fold(mod, reference_engine=reference, kernel_cache=False)
    assert tvm_ffi.structural_equal(ours.mod, stock), ours.plan.explain()


def _lp_pool(*, pending: bool) -> tvm.IRModule:
    """ONNX LpPool(p=2) as Relax imports it, on constant data."""
    data = np.random.default_rng(0).standard_normal((1, 2, 8, 8)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            two, half = relax.const(np.float32(2.0)), relax.const(np.float32(0.5))
            if pending:
                half = bb.emit(relax.op.divide(relax.const(np.float32(1.0)), two))
            lv = bb.emit(relax.op.power(relax.op.abs(relax.const(data)), two))
            lv = bb.emit(relax.op.nn.avg_pool2d(lv, pool_size=[3, 3], strides=[2, 2]))
            lv = bb.emit(relax.op.multiply(lv, relax.const(np.float32(9.0))))
            gv = bb.emit_output(relax.op.power(lv, half))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("pending", [False, True], ids=["literal", "folded-first"])
def test_lp_pool_folds_to_stocks_bytes(pending: bool, reference: bool) -> None:
    _folds_like_stock(_lp_pool(pending=pending), reference)


#: The cases the rule is there for: without it the fast engine's bytes differ from stock's
#: (checked when it was written), and values around them that need no rule.
CASES = [
    ("multiply", -1.0),  # a negation: NaN sign
    ("multiply", 0.0),  # x * 0 -> 0: NaN, infinity, -0.0
    ("add", -0.0),
    ("add", 0.0),  # x + 0 -> x: -0.0 stays
    ("subtract", -0.0),
    ("divide", -1.0),
    ("floor_divide", np.nan),
    ("multiply", 0.1),
    ("divide", 3.0),
    ("maximum", 2.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("pending", [False, True], ids=["literal", "folded-first"])
@pytest.mark.parametrize("op,value", CASES, ids=[f"{op}-{value}" for op, value in CASES])
def test_a_scalar_operand_folds_to_stocks_bytes(op, value, pending, reference) -> None:
    _folds_like_stock(_module(op, value, pending=pending, scalar_first=False), reference)


def test_special_values_run_stocks_kernel_and_plain_ones_share() -> None:
    """The rule itself: a value stock's compile rewrites is special; scales are not."""
    special = [0.0, -0.0, 1.0, -1.0, np.inf, np.nan]
    assert all(value_shapes_kernel("relax.multiply", "float32", np.float32(v)) for v in special)
    assert not any(
        value_shapes_kernel("relax.multiply", "float32", np.float32(v))
        for v in (0.5, 2.0, 0.0039215, -3.0, 1e-40)
    )
    assert not value_shapes_kernel("relax.dequantize", "int8", np.int8(0))  # a zero point
    assert value_shapes_kernel("relax.quantize", "int8", np.int8(0), float_arithmetic=True)
    assert value_shapes_kernel("relax.power", "float32", np.float32(3.0))  # any exponent


OPS = ["add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "less"]
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, np.inf, -np.inf, np.nan]),
    st.floats(-1e6, 1e6, width=32, allow_subnormal=True),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(OPS),
    value=VALUES,
    pending=st.booleans(),
    scalar_first=st.booleans(),
    reference=st.booleans(),
)
def test_any_scalar_operand_folds_to_stocks_bytes(op, value, pending, scalar_first, reference):
    mod = _module(op, value, pending=pending, scalar_first=scalar_first)
    try:
        stock = relax.transform.FoldConstant()(mod)
    except Exception:  # noqa: BLE001 - stock cannot fold it (divide by a literal zero): kept
        plan = fgr.fold(mod, reference_engine=reference, kernel_cache=False).plan
        assert plan.decisions[-1].action is Action.KEEP, plan.explain()
        return
    ours = fgr.fold(mod, reference_engine=reference, kernel_cache=False)
    assert tvm_ffi.structural_equal(ours.mod, stock), (op, value, pending, ours.plan.explain())
