"""Kernels shared across shapes must compute what per-shape kernels compute.

fold_guard legalizes calls of one op signature once, over symbolic dims where the members'
shapes differ. Random modules put several calls of one op, with random shapes (size-1 dims
included, where broadcasting changes the computation), side by side; under the default policy
the result must equal the stock pass's constant for constant.

    y_i = op(C_i, D_i)  for i in 1..k, C_i / D_i constants of random shapes
        ==>  every y_i a constant, byte-identical to stock's
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relax

import fold_guard.relax as fgr

DIMS = st.sampled_from([1, 2, 3, 5])


# Each builder gets the example's shared ``base`` dims (so that calls collide in one op
# signature, which is what shares a kernel) and draws what varies between the calls.


def _binary(op):
    """Two broadcast-compatible shapes over ``base``: per dim equal, or one side 1."""

    def build(rng, draw, base):
        left, right = [], []
        for dim in base:
            kind = draw(st.sampled_from(["same", "left1", "right1"]))
            left.append(1 if kind == "left1" else dim)
            right.append(1 if kind == "right1" else dim)
        return op(_const(rng, left), _const(rng, right))

    return build


def _broadcast_to(rng, draw, base):
    source = [draw(st.sampled_from([1, dim])) for dim in base]
    return relax.op.broadcast_to(_const(rng, source), relax.ShapeExpr(base))


def _matmul(rng, draw, base):
    m, k, n = draw(DIMS), base[0], draw(DIMS)
    batch = draw(st.sampled_from([[], [1], [2]]))
    return relax.op.matmul(_const(rng, batch + [m, k]), _const(rng, [k, n]))


def _sum(rng, draw, base):
    shape = [draw(DIMS) for _ in base]
    return relax.op.sum(_const(rng, shape), axis=[0], keepdims=len(base) % 2 == 0)


def _per_axis_quantize(rng, draw, base):
    rows, cols = draw(DIMS), draw(DIMS)
    data = _const(rng, [rows, cols])
    scale = relax.const((rng.random(rows) + 0.05).astype("float32"))
    zero = relax.const(np.zeros(rows, "int8"))
    return relax.op.quantize(data, scale, zero, axis=0, out_dtype="int8")


def _strided_slice(rng, draw, base):
    shape = [draw(DIMS), draw(DIMS)]
    return relax.op.strided_slice(_const(rng, shape), axes=[1], begin=[0], end=[base[0] + 1])


def _const(rng, shape):
    return relax.const(rng.standard_normal(shape).astype("float32"))


BUILDERS = {
    "add": _binary(relax.op.add),
    "multiply": _binary(relax.op.multiply),
    "maximum": _binary(relax.op.maximum),
    "broadcast_to": _broadcast_to,
    "matmul": _matmul,
    "sum": _sum,
    "quantize_per_axis": _per_axis_quantize,
    "strided_slice": _strided_slice,
}


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(BUILDERS))
@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(2, 4), seed=st.integers(0, 2**16), data=st.data())
def test_shared_kernels_match_stock(op, count, seed, data):
    rng = np.random.default_rng(seed)
    base = data.draw(st.lists(DIMS, min_size=1, max_size=3), label="base")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outputs = [bb.emit(BUILDERS[op](rng, data.draw, base)) for _ in range(count)]
            result = bb.emit_output(relax.Tuple([x, *outputs]))
        bb.emit_func_output(result)
    mod = bb.get()
    ours = fgr.fold(mod, strict=True)
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(ours.mod, stock), ours.mod.script(show_meta=False)
    assert len(ours.plan.folded) == count


def test_size_specialized_op_gets_one_kernel_per_shape():
    """adaptive_avg_pool2d picks its loop order from static sizes (a window that divides evenly
    becomes its own reduction axis), so sharing one symbolic kernel changed float sums by 1 ulp.
    Ops outside SHAPE_GENERIC_OPS get a static kernel per shape, like the stock pass.

        a = pool(C(1, 2, 7, 9)); b = pool(C(1, 2, 10, 11))  ==>  2 kernels, constants as stock's
    """
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            calls = [
                bb.emit(
                    relax.op.nn.adaptive_avg_pool2d(_const_uniform(rng, shape), output_size=[3, 3])
                )
                for shape in [(1, 2, 7, 9), (1, 2, 10, 11)]
            ]
            out = bb.emit_output(relax.Tuple(calls))
        bb.emit_func_output(out)
    mod = bb.get()
    result = fgr.fold(mod, strict=True)
    assert result.report.kernels_compiled + result.report.kernels_cached == 2
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))


def _const_uniform(rng, shape):
    return relax.const(rng.uniform(0.1, 0.9, shape).astype("float32"))
