"""Equivalence corpus: small, unannotated Relax modules that exercise constant folding.

Every builder returns a fresh ``tvm.IRModule``; all data comes from fixed numpy seeds, so two
calls give structurally equal modules. Constants are written as function parameters in
TVMScript and bound with ``relax.transform.BindParams`` (or built with ``relax.const``).

Comments on each binding say what stock ``relax.transform.FoldConstant`` (apache-tvm 0.27)
does with it. Rules of the stock pass, as read from ``src/relax/transform/fold_constant.cc``
and checked by running it:

* An op call folds only inside a dataflow block, only when every argument is a constant and
  ``FLegalize`` turns it into a single ``call_tir``; the PrimFunc is built for ``llvm`` and run.
* ``R.call_tir`` with constant args and a static output shape folds anywhere, dataflow or not.
* A creation op (no tensor argument) whose result has more than 1024 elements is not folded.
  Any tensor argument (e.g. the scalar fill value of ``R.full``) lifts the limit.
* ``tensor_to_shape(const)`` and ``shape_to_tensor(ShapeExpr)`` are special-cased; a var bound
  to a ``ShapeExpr`` is substituted into the calls that use it, in or outside dataflow.
* Afterwards ``RemoveAllUnused`` drops the bindings nobody uses.

``STOCK`` records what stock does to each module: "unchanged" (output structurally equal to
the input), "folds" (it changes the module and no binding computable from constants alone is
left), "partial" (it changes the module but leaves such a binding: an op outside dataflow, a
TupleGetItem of a folded tuple, a call to a Relax function...).
``tests/relax/test_equivalence.py`` checks that record against the installed TVM.

Beware: ``relax.const(np_array)`` without ``dtype`` turns int64 into int32 and float64 into
float32, so every constant here is made with an explicit dtype.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

__all__ = ["BUILDERS", "NOT_RUNNABLE", "STOCK", "build", "corpus"]

BUILDERS: dict[str, Callable[[], tvm.IRModule]] = {}
STOCK: dict[str, str] = {}
# Modules that tvm.compile cannot build in 0.27, folded or not, with the reason.
NOT_RUNNABLE: dict[str, str] = {
    "tensor_to_shape_const": "LegalizeOps asserts reshape's shape is a ShapeExpr, not a var",
    "if_branches": "the 0.27 VM segfaults in StorageObj::AllocTensor on the else branch, unfolded too",
}


def _case(stock: str):
    assert stock in ("folds", "partial", "unchanged")

    def deco(fn):
        name = fn.__name__
        assert name not in BUILDERS, name
        BUILDERS[name] = fn
        STOCK[name] = stock
        return fn

    return deco


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype("float32")


def _bind(mod: tvm.IRModule, func: str = "main", **arrays: np.ndarray) -> tvm.IRModule:
    return relax.transform.BindParams(func, arrays)(mod)


def build(name: str) -> tvm.IRModule:
    return BUILDERS[name]()


def corpus() -> list[tuple[str, tvm.IRModule]]:
    """All corpus modules as ``(name, module)``, in a fixed order, freshly built."""
    return [(name, fn()) for name, fn in BUILDERS.items()]


# ---------------------------------------------------------------------------------------------
# Elementwise chains
# ---------------------------------------------------------------------------------------------


@_case("folds")
def elemwise_chain_f32():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((8, 16), "float32"),
            c0: R.Tensor((8, 16), "float32"),
            c1: R.Tensor((8, 16), "float32"),
        ):
            with R.dataflow():
                lv0 = R.add(c0, c1)  # folds: all args constant
                lv1 = R.multiply(lv0, c1)  # folds: lv0 folded above
                lv2 = R.exp(lv1)  # folds
                lv3 = R.sqrt(lv2)  # folds
                gv = R.add(x, lv3)  # no fold: x is a runtime input
                R.output(gv)
            return gv

    rng = _rng(0)
    return _bind(Mod, c0=_f32(rng, 8, 16), c1=_f32(rng, 8, 16))


@_case("folds")
def elemwise_unary_mix():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((64,), "float32"), c0: R.Tensor((64,), "float32")):
            with R.dataflow():
                lv0 = R.negative(c0)  # folds
                lv1 = R.abs(lv0)  # folds
                lv2 = R.add(lv1, R.const(1.0, "float32"))  # folds: scalar const too
                lv3 = R.log(lv2)  # folds
                lv4 = R.tanh(lv3)  # folds
                lv5 = R.sigmoid(lv4)  # folds
                lv6 = R.clip(lv5, R.prim_value(0.55), R.prim_value(0.7))  # folds: PrimValue args
                lv7 = R.subtract(lv6, R.const(0.5, "float32"))  # folds
                lv8 = R.divide(lv7, R.const(3.0, "float32"))  # folds
                lv9 = R.power(lv8, R.const(2.0, "float32"))  # folds
                gv = R.multiply(x, lv9)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(1), 64, lo=-3, hi=3))


@_case("folds")
def all_const_no_inputs():
    @I.ir_module
    class Mod:
        @R.function
        def main(c0: R.Tensor((4, 8), "float32"), c1: R.Tensor((8,), "float32")):
            with R.dataflow():
                lv0 = R.add(c0, c1)  # folds: broadcast add of constants
                lv1 = R.nn.relu(lv0)  # folds
                gv = R.sum(lv1, axis=[1])  # folds: reduction of a constant
                R.output(gv)
            return gv

    rng = _rng(2)
    return _bind(Mod, c0=_f32(rng, 4, 8), c1=_f32(rng, 8))


@_case("folds")
def scalar_consts_bound_var():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((16,), "float32"), c0: R.Tensor((16,), "float32")):
            with R.dataflow():
                k = c0  # var bound to a constant: uses are replaced by the constant
                s = R.const(0.25, "float32")  # scalar constant bound to a var
                lv0 = R.multiply(k, s)  # folds
                lv1 = R.maximum(lv0, R.const(0.0, "float32"))  # folds
                gv = R.add(x, lv1)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(3), 16))


@_case("folds")
def int8_wraparound_arith():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((32,), "int8"), c0: R.Tensor((32,), "int8"), c1: R.Tensor((32,), "int8")
        ):
            with R.dataflow():
                lv0 = R.add(c0, c1)  # folds: int8 add wraps around
                lv1 = R.multiply(lv0, R.const(3, "int8"))  # folds: wraps again
                lv2 = R.bitwise_xor(lv1, c1)  # folds
                gv = R.subtract(x, lv2)  # no fold: runtime x
                R.output(gv)
            return gv

    rng = _rng(4)
    return _bind(
        Mod,
        c0=rng.integers(-128, 128, size=32).astype("int8"),
        c1=rng.integers(-128, 128, size=32).astype("int8"),
    )


@_case("folds")
def astype_chain():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), c0: R.Tensor((4, 16), "float32")):
            with R.dataflow():
                lv0 = R.astype(c0, "float16")  # folds: rounding to fp16
                lv1 = R.astype(lv0, "int32")  # folds: truncation
                lv2 = R.astype(lv1, "uint8")  # folds: narrowing
                lv3 = R.astype(lv2, "float32")  # folds
                gv = R.add(x, lv3)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(5), 4, 16, lo=0, hi=200))


@_case("folds")
def compare_bool_where():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((8, 8), "float32"),
            c0: R.Tensor((8, 8), "float32"),
            c1: R.Tensor((8, 8), "float32"),
        ):
            with R.dataflow():
                lv0 = R.greater(c0, c1)  # folds: bool result
                lv1 = R.logical_not(lv0)  # folds: bool
                lv2 = R.equal(c0, c0)  # folds: all True
                lv3 = R.logical_and(lv1, lv2)  # folds
                gv = R.where(lv3, x, c1)  # no fold: x is runtime
                R.output(gv)
            return gv

    rng = _rng(6)
    return _bind(Mod, c0=_f32(rng, 8, 8), c1=_f32(rng, 8, 8))


@_case("folds")
def argmax_int64_take():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((10, 6), "float32"), c0: R.Tensor((5, 10), "float32")):
            with R.dataflow():
                lv0 = R.argmax(c0, axis=1)  # folds: int64 result
                lv1 = R.argmin(c0, axis=1, keepdims=True)  # folds: int64
                gv0 = R.take(x, lv0, axis=0)  # no fold: x is runtime
                gv = (gv0, lv1)  # tuple of a runtime tensor and a folded constant
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(7), 5, 10))


@_case("folds")
def reductions_const():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((12,), "float32"), c0: R.Tensor((12, 40), "float32")):
            with R.dataflow():
                lv0 = R.sum(c0, axis=[1])  # folds: float reduction, order set by the kernel
                lv1 = R.mean(c0, axis=[1])  # folds
                lv2 = R.max(c0, axis=[1])  # folds
                lv3 = R.add(lv0, lv1)  # folds
                lv4 = R.add(lv3, lv2)  # folds
                gv = R.multiply(x, lv4)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(8), 12, 40))


# ---------------------------------------------------------------------------------------------
# Matmul / conv2d
# ---------------------------------------------------------------------------------------------


@_case("folds")
def matmul_const_const():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((16, 8), "float32"),
            a: R.Tensor((16, 32), "float32"),
            b: R.Tensor((32, 8), "float32"),
        ):
            with R.dataflow():
                lv0 = R.matmul(a, b)  # folds: both operands constant
                gv = R.add(x, lv0)  # no fold: runtime x
                R.output(gv)
            return gv

    rng = _rng(10)
    return _bind(Mod, a=_f32(rng, 16, 32), b=_f32(rng, 32, 8))


@_case("folds")
def matmul_runtime_weight_bias():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((4, 32), "float32"),
            w: R.Tensor((16, 32), "float32"),
            b: R.Tensor((16,), "float32"),
        ):
            with R.dataflow():
                wt = R.permute_dims(w, axes=[1, 0])  # folds: transpose of a constant weight
                bs = R.multiply(b, R.const(2.0, "float32"))  # folds
                lv0 = R.matmul(x, wt)  # no fold: runtime activation
                gv = R.add(lv0, bs)  # no fold
                R.output(gv)
            return gv

    rng = _rng(11)
    return _bind(Mod, w=_f32(rng, 16, 32), b=_f32(rng, 16))


@_case("folds")
def conv2d_weight_transforms():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((1, 4, 8, 8), "float32"),
            w_hwio: R.Tensor((3, 3, 4, 8), "float32"),
            scale: R.Tensor((8,), "float32"),
            bias: R.Tensor((8,), "float32"),
        ):
            with R.dataflow():
                w = R.permute_dims(w_hwio, axes=[3, 2, 0, 1])  # folds: HWIO -> OIHW
                s = R.reshape(scale, R.shape([8, 1, 1, 1]))  # folds
                ws = R.multiply(w, s)  # folds: per-output-channel scale baked into weight
                b = R.reshape(bias, R.shape([1, 8, 1, 1]))  # folds
                lv0 = R.nn.conv2d(x, ws, padding=[1, 1, 1, 1])  # no fold: runtime x
                lv1 = R.add(lv0, b)  # no fold
                gv = R.nn.relu(lv1)  # no fold
                R.output(gv)
            return gv

    rng = _rng(12)
    return _bind(Mod, w_hwio=_f32(rng, 3, 3, 4, 8), scale=_f32(rng, 8), bias=_f32(rng, 8))


@_case("folds")
def conv2d_const_const():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((1, 4, 6, 6), "float32"),
            d: R.Tensor((1, 2, 8, 8), "float32"),
            w: R.Tensor((4, 2, 3, 3), "float32"),
        ):
            with R.dataflow():
                lv0 = R.nn.conv2d(d, w)  # folds: constant data and weight
                lv1 = R.nn.relu(lv0)  # folds
                gv = R.add(x, lv1)  # no fold: runtime x
                R.output(gv)
            return gv

    rng = _rng(13)
    return _bind(Mod, d=_f32(rng, 1, 2, 8, 8), w=_f32(rng, 4, 2, 3, 3))


# ---------------------------------------------------------------------------------------------
# Layout / data movement
# ---------------------------------------------------------------------------------------------


@_case("folds")
def reshape_transpose_chain():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((6, 4, 2), "float32"), c0: R.Tensor((2, 3, 4, 2), "float32")):
            with R.dataflow():
                lv0 = R.reshape(c0, R.shape([6, 8]))  # folds
                lv1 = R.permute_dims(lv0, axes=[1, 0])  # folds
                lv2 = R.reshape(lv1, R.shape([2, 4, 6]))  # folds
                lv3 = R.permute_dims(lv2, axes=[2, 1, 0])  # folds
                lv4 = R.expand_dims(lv3, axis=[0])  # folds
                lv5 = R.squeeze(lv4, axis=[0])  # folds
                gv = R.add(x, lv5)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(20), 2, 3, 4, 2))


@_case("folds")
def concat_consts():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((4, 9), "float32"),
            c0: R.Tensor((4, 2), "float32"),
            c1: R.Tensor((4, 3), "float32"),
            c2: R.Tensor((4, 4), "float32"),
        ):
            with R.dataflow():
                lv0 = R.concat((c0, c1, c2), axis=1)  # folds: tuple of constants as argument
                gv = R.multiply(x, lv0)  # no fold: runtime x
                R.output(gv)
            return gv

    rng = _rng(21)
    return _bind(Mod, c0=_f32(rng, 4, 2), c1=_f32(rng, 4, 3), c2=_f32(rng, 4, 4))


@_case("partial")
def split_tuple_getitem():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 4), "float32"), c0: R.Tensor((12, 4), "float32")):
            with R.dataflow():
                parts = R.split(c0, indices_or_sections=3, axis=0)  # folds: tuple of 3 constants
                p0 = parts[0]  # no fold: TupleGetItem of a var bound to a tuple of constants
                p2 = parts[2]  # no fold: same
                lv0 = R.subtract(p0, p2)  # no fold: p0, p2 are vars, not constants
                gv = R.add(x, lv0)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(22), 12, 4))


@_case("folds")
def return_tuple_of_consts():
    @I.ir_module
    class Mod:
        @R.function
        def main(c0: R.Tensor((3, 5), "float32"), c1: R.Tensor((5,), "int32")):
            with R.dataflow():
                lv0 = R.add(c0, R.const(1.0, "float32"))  # folds
                lv1 = R.multiply(c1, R.const(2, "int32"))  # folds
                gv = (lv0, lv1, c1)  # tuple of constants returned
                R.output(gv)
            return gv

    rng = _rng(23)
    return _bind(Mod, c0=_f32(rng, 3, 5), c1=rng.integers(-9, 9, size=5).astype("int32"))


@_case("partial")
def cumsum_no_legalize():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((6,), "int32"), c0: R.Tensor((6,), "int32")):
            with R.dataflow():
                lv0 = R.multiply(c0, R.const(2, "int32"))  # folds
                lv1 = R.cumsum(lv0, axis=0)  # no fold: cumsum has no FLegalize in 0.27
                gv = R.add(x, lv1)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_rng(26).integers(-9, 9, size=6).astype("int32"))


@_case("folds")
def slice_take_broadcast():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((3, 16), "float32"),
            c0: R.Tensor((10, 16), "float32"),
            idx: R.Tensor((3,), "int64"),
        ):
            with R.dataflow():
                lv0 = R.strided_slice(c0, axes=[0], begin=[1], end=[9], strides=[2])  # folds
                lv1 = R.take(lv0, idx, axis=0)  # folds: int64 constant indices
                lv2 = R.tile(lv1, repeats=[1, 1])  # folds
                gv = R.add(x, lv2)  # no fold: runtime x
                R.output(gv)
            return gv

    rng = _rng(24)
    return _bind(Mod, c0=_f32(rng, 10, 16), idx=np.array([3, 0, 2], dtype="int64"))


@_case("folds")
def broadcast_to_large():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((64, 64), "float32"), c0: R.Tensor((64,), "float32")):
            with R.dataflow():
                # folds: 4096 elements, but it has a tensor input, so the 1024 limit does not apply
                lv0 = R.broadcast_to(c0, R.shape([64, 64]))
                gv = R.add(x, lv0)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(25), 64))


# ---------------------------------------------------------------------------------------------
# Shapes and creation ops
# ---------------------------------------------------------------------------------------------


@_case("folds")
def shape_var_reshape():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 6), "float32"), c0: R.Tensor((24,), "float32")):
            with R.dataflow():
                s = R.shape([4, 6])  # ShapeExpr var: substituted into its uses, then dropped
                lv0 = R.reshape(c0, s)  # folds
                lv1 = R.reshape(x, s)  # no fold (runtime x); s is inlined into it
                gv = R.add(lv1, lv0)  # no fold
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(30), 24))


@_case("folds")
def tensor_to_shape_const():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((24,), "float32"), c0: R.Tensor((2,), "int64")):
            with R.dataflow():
                t = R.tensor_to_shape(c0)  # folds to R.shape([4, 6]): special case, int64 const
                R.output(t)
            s = R.match_cast(t, R.Shape([4, 6]))  # no fold: match_cast is not a call
            gv = R.reshape(x, s)  # no fold: runtime x, and outside dataflow
            return gv

    return _bind(Mod, c0=np.array([4, 6], dtype="int64"))


@_case("folds")
def shape_to_tensor_const():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((3,), "int64")):
            with R.dataflow():
                t = R.shape_to_tensor(R.shape([2, 3, 4]))  # folds: special case, int64 tensor
                lv0 = R.multiply(t, R.const(10, "int64"))  # folds
                gv = R.add(x, lv0)  # no fold: runtime x
                R.output(gv)
            return gv

    return Mod


@_case("folds")
def creation_small():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                z = R.zeros(R.shape([8, 8]), "float32")  # folds: 64 elements <= 1024
                o = R.ones(R.shape([8, 8]), "float32")  # folds
                f = R.full(R.shape([32, 32]), R.const(3.0, "float32"), "float32")  # folds: 1024
                f8 = R.full(R.shape([8, 8]), R.const(-2, "int8"), "int8")  # folds
                lv0 = R.add(z, o)  # folds
                lv1 = R.add(x, lv0)  # no fold: runtime x
                gv = (lv1, f, f8)
                R.output(gv)
            return gv

    return Mod


@_case("unchanged")
def creation_large():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((40, 40), "float32")):
            with R.dataflow():
                z = R.zeros(R.shape([40, 40]), "float32")  # no fold: 1600 > 1024, creation op
                o = R.ones(R.shape([2, 513]), "int32")  # no fold: 1026 > 1024
                lv0 = R.add(x, z)  # no fold: z is not a constant
                gv = (lv0, o)
                R.output(gv)
            return gv

    return Mod


@_case("folds")
def full_large_tensor_fill():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((64, 64), "float32")):
            with R.dataflow():
                # folds: 4096 elements, but the fill value is a tensor arg, so it is not treated
                # as a pure creation op by the 1024-element guard
                f = R.full(R.shape([64, 64]), R.const(2.0, "float32"), "float32")
                gv = R.multiply(x, f)  # no fold: runtime x
                R.output(gv)
            return gv

    return Mod


@_case("unchanged")
def arange_not_folded():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((20,), "int32")):
            with R.dataflow():
                # no fold: legalizes straight to a constant, not to call_tir, so stock skips it
                a = R.arange(0, 20, 1, "int32")
                gv = R.add(x, a)  # no fold
                R.output(gv)
            return gv

    return Mod


# ---------------------------------------------------------------------------------------------
# Quantize / dequantize
# ---------------------------------------------------------------------------------------------


@_case("folds")
def quantize_per_tensor_int8():
    @I.ir_module
    class Mod:
        @R.function
        def main(w: R.Tensor((16, 8), "float32")):
            with R.dataflow():
                gv = R.quantize(  # folds: fp32 constant weight -> int8 constant
                    w, R.const(0.02, "float32"), R.const(3, "int8"), axis=0, out_dtype="int8"
                )
                R.output(gv)
            return gv

    return _bind(Mod, w=_f32(_rng(40), 16, 8, lo=-3, hi=3))


@_case("folds")
def quantize_per_channel_int8():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            w: R.Tensor((8, 4, 3, 3), "float32"),
            scale: R.Tensor((8,), "float32"),
            zp: R.Tensor((8,), "int8"),
        ):
            with R.dataflow():
                gv = R.quantize(w, scale, zp, axis=0, out_dtype="int8")  # folds: per-channel
                R.output(gv)
            return gv

    rng = _rng(41)
    return _bind(
        Mod,
        w=_f32(rng, 8, 4, 3, 3),
        scale=_f32(rng, 8, lo=0.002, hi=0.01),
        zp=rng.integers(-5, 5, size=8).astype("int8"),
    )


@_case("folds")
def quantize_uint8_dequantize():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((32,), "float32"), w: R.Tensor((32,), "float32")):
            with R.dataflow():
                q = R.quantize(  # folds: uint8 with zero point 128, clamps at 0 and 255
                    w, R.const(0.01, "float32"), R.const(128, "uint8"), axis=0, out_dtype="uint8"
                )
                dq = R.dequantize(  # folds: the QDQ round trip collapses to fp32 constant
                    q, R.const(0.01, "float32"), R.const(128, "uint8"), axis=0, out_dtype="float32"
                )
                gv = R.add(x, dq)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, w=_f32(_rng(42), 32, lo=-2, hi=2))


@_case("folds")
def dequantize_per_tensor_uint8():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), q: R.Tensor((4, 16), "uint8")):
            with R.dataflow():
                dq = R.dequantize(  # folds: dequantize(const) -- the pattern QDQ backends match
                    q, R.const(0.05, "float32"), R.const(120, "uint8"), axis=1, out_dtype="float32"
                )
                gv = R.multiply(x, dq)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, q=_rng(43).integers(0, 256, size=(4, 16)).astype("uint8"))


@_case("folds")
def qdq_weight_conv2d():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((1, 4, 8, 8), "float32"),
            wq: R.Tensor((8, 4, 3, 3), "int8"),
            wscale: R.Tensor((8,), "float32"),
            wzp: R.Tensor((8,), "int8"),
        ):
            with R.dataflow():
                xq = R.quantize(  # no fold: runtime activation
                    x, R.const(0.05, "float32"), R.const(0, "int8"), axis=1, out_dtype="int8"
                )
                xdq = R.dequantize(  # no fold
                    xq, R.const(0.05, "float32"), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                wdq = R.dequantize(  # folds: per-channel int8 weight -> fp32 (kills QDQ pattern)
                    wq, wscale, wzp, axis=0, out_dtype="float32"
                )
                gv = R.nn.conv2d(xdq, wdq, padding=[1, 1, 1, 1])  # no fold: runtime input
                R.output(gv)
            return gv

    rng = _rng(44)
    return _bind(
        Mod,
        wq=rng.integers(-127, 128, size=(8, 4, 3, 3)).astype("int8"),
        wscale=_f32(rng, 8, lo=0.001, hi=0.01),
        wzp=np.zeros(8, dtype="int8"),
    )


@_case("folds")
def qdq_weight_matmul():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((2, 32), "float32"),
            w: R.Tensor((16, 32), "float32"),
        ):
            with R.dataflow():
                wq = R.quantize(  # folds: fp32 weight -> int8 (what backends want)
                    w, R.const(0.01, "float32"), R.const(0, "int8"), axis=0, out_dtype="int8"
                )
                wdq = R.dequantize(  # folds too (what QDQ backends do not want)
                    wq, R.const(0.01, "float32"), R.const(0, "int8"), axis=0, out_dtype="float32"
                )
                wt = R.permute_dims(wdq, axes=[1, 0])  # folds
                gv = R.matmul(x, wt)  # no fold: runtime activation
                R.output(gv)
            return gv

    return _bind(Mod, w=_f32(_rng(45), 16, 32))


@_case("folds")
def requantize_chain_weight():
    """A weight stored at one scale and requantized to another in the graph (DQ -> Q -> DQ)."""

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 16), "float32"), w: R.Tensor((16, 8), "int8")):
            with R.dataflow():
                w1 = R.dequantize(  # folds
                    w, R.const(0.01, "float32"), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                w2 = R.quantize(  # folds: the int8 weight at the second scale
                    w1, R.const(0.03, "float32"), R.const(0, "int8"), axis=1, out_dtype="int8"
                )
                w3 = R.dequantize(  # folds too
                    w2, R.const(0.03, "float32"), R.const(0, "int8"), axis=1, out_dtype="float32"
                )
                gv = R.matmul(x, w3)  # no fold: runtime activation
                R.output(gv)
            return gv

    return _bind(Mod, w=_rng(46).integers(-127, 128, size=(16, 8)).astype("int8"))


@_case("folds")
def half_weight_casts():
    """float16 and bfloat16 weights cast to float32 in the graph (TFLite's float16 models)."""
    import ml_dtypes

    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((2, 16), "float32"),
            w: R.Tensor((16, 8), "float16"),
            b: R.Tensor((8,), "bfloat16"),
        ):
            with R.dataflow():
                wf = R.astype(w, "float32")  # folds
                bf = R.astype(b, "float32")  # folds
                y = R.matmul(x, wf)  # no fold: runtime activation
                gv = R.add(y, bf)  # no fold
                R.output(gv)
            return gv

    rng = _rng(47)
    return _bind(
        Mod,
        w=rng.standard_normal((16, 8)).astype("float16"),
        b=rng.standard_normal(8).astype(np.float32).astype(ml_dtypes.bfloat16),
    )


# ---------------------------------------------------------------------------------------------
# Mixed runtime/constant, dataflow placement, call_tir
# ---------------------------------------------------------------------------------------------


@_case("folds")
def mixed_const_runtime():
    @I.ir_module
    class Mod:
        @R.function
        def main(
            x: R.Tensor((8, 8), "float32"),
            c0: R.Tensor((8, 8), "float32"),
            c1: R.Tensor((8, 8), "float32"),
        ):
            with R.dataflow():
                lv0 = R.add(x, c0)  # no fold: runtime x
                lv1 = R.multiply(c0, c1)  # folds
                lv2 = R.add(lv0, lv1)  # no fold: lv0 is runtime
                lv3 = R.exp(lv1)  # folds
                lv4 = R.matmul(lv2, lv3)  # no fold
                lv5 = R.subtract(lv3, c1)  # folds
                gv = R.add(lv4, lv5)  # no fold
                R.output(gv)
            return gv

    rng = _rng(50)
    return _bind(Mod, c0=_f32(rng, 8, 8), c1=_f32(rng, 8, 8))


@_case("unchanged")
def ops_outside_dataflow():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((16,), "float32"), c0: R.Tensor((16,), "float32")):
            lv0 = R.add(c0, c0)  # no fold: op outside a dataflow block
            lv1 = R.exp(lv0)  # no fold: outside dataflow
            gv = R.add(x, lv1)  # no fold
            return gv

    return _bind(Mod, c0=_f32(_rng(51), 16))


@_case("partial")
def dataflow_and_plain_blocks():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((16,), "float32"), c0: R.Tensor((16,), "float32")):
            with R.dataflow():
                lv0 = R.multiply(c0, R.const(2.0, "float32"))  # folds: in dataflow
                lv1 = R.add(x, lv0)  # no fold: runtime x
                R.output(lv0, lv1)
            lv2 = R.exp(lv0)  # no fold: outside dataflow, even though lv0 is now a constant
            gv = R.add(lv1, lv2)  # no fold
            return gv

    return _bind(Mod, c0=_f32(_rng(52), 16))


@_case("folds")
def call_tir_in_dataflow():
    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def scale_shift(
            A: T.Buffer((8, 8), "float32"),
            B: T.Buffer((8,), "float32"),
            C: T.Buffer((8, 8), "float32"),
        ):
            for i, j in T.grid(8, 8):
                with T.sblock("scale_shift"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = A[vi, vj] * T.float32(0.5) + B[vj]

        @R.function
        def main(
            x: R.Tensor((8, 8), "float32"),
            a: R.Tensor((8, 8), "float32"),
            b: R.Tensor((8,), "float32"),
        ):
            cls = Mod
            with R.dataflow():
                lv0 = R.call_tir(  # folds: call_tir of a module PrimFunc on constants
                    cls.scale_shift, (a, b), out_ty=R.Tensor((8, 8), "float32")
                )
                lv1 = R.call_tir(  # no fold: runtime x
                    cls.scale_shift, (x, b), out_ty=R.Tensor((8, 8), "float32")
                )
                gv = R.add(lv0, lv1)  # no fold
                R.output(gv)
            return gv

    rng = _rng(53)
    return _bind(Mod, a=_f32(rng, 8, 8), b=_f32(rng, 8))


@_case("folds")
def call_tir_outside_dataflow():
    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def add_one(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32")):
            for i, j in T.grid(4, 4):
                with T.sblock("add_one"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    B[vi, vj] = A[vi, vj] + T.float32(1.0)

        @R.function
        def main(x: R.Tensor((4, 4), "float32"), c0: R.Tensor((4, 4), "float32")):
            cls = Mod
            lv0 = R.call_tir(  # folds: call_tir folds outside dataflow too
                cls.add_one, (c0,), out_ty=R.Tensor((4, 4), "float32")
            )
            lv1 = R.call_tir(  # folds: chained on the folded constant
                cls.add_one, (lv0,), out_ty=R.Tensor((4, 4), "float32")
            )
            gv = R.add(x, lv1)  # no fold: runtime x
            return gv

    return _bind(Mod, c0=_f32(_rng(54), 4, 4))


@_case("folds")
def multi_function():
    rng = _rng(55)
    hc = _f32(rng, 8)  # captured by TVMScript: R.const(hc) becomes an embedded constant

    @I.ir_module
    class Mod:
        @R.function(private=True)
        def helper(y: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                lv0 = R.exp(R.const(hc, "float32"))  # folds: constant inside the callee
                gv = R.multiply(y, lv0)  # no fold: y is a parameter
                R.output(gv)
            return gv

        @R.function
        def main(x: R.Tensor((4, 8), "float32"), c0: R.Tensor((4, 8), "float32")):
            cls = Mod
            with R.dataflow():
                lv0 = R.add(c0, c0)  # folds
                lv1 = R.add(x, lv0)  # no fold
                R.output(lv1)
            gv = cls.helper(lv1)  # no fold: call to a Relax function is never folded
            return gv

    return _bind(Mod, c0=_f32(rng, 4, 8))


@_case("partial")
def multi_function_const_call():
    @I.ir_module
    class Mod:
        @R.function
        def scale(y: R.Tensor((16,), "float32"), sc: R.Tensor((16,), "float32")) -> R.Tensor(
            (16,), "float32"
        ):
            with R.dataflow():
                gv = R.multiply(y, sc)  # no fold: y is a parameter
                R.output(gv)
            return gv

        @R.function
        def main(x: R.Tensor((16,), "float32"), c0: R.Tensor((16,), "float32")):
            cls = Mod
            with R.dataflow():
                lv0 = R.sqrt(c0)  # folds
                R.output(lv0)
            lv1 = cls.scale(lv0, lv0)  # no fold: Relax call on constants is not evaluated
            gv = R.add(x, lv1)  # no fold: outside dataflow
            return gv

    return _bind(Mod, c0=_f32(_rng(56), 16, lo=0.1, hi=4))


@_case("folds")
def symbolic_shape_input():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32"), c0: R.Tensor((8,), "float32")):
            n = T.int64()
            with R.dataflow():
                lv0 = R.multiply(c0, c0)  # folds: static constant subgraph
                lv1 = R.add(lv0, R.const(1.0, "float32"))  # folds
                lv2 = R.add(x, lv1)  # no fold: dynamic runtime input
                z = R.zeros(R.shape([n, 8]), "float32")  # no fold: symbolic shape
                gv = R.add(lv2, z)  # no fold
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(57), 8))


@_case("partial")
def impure_print():
    @I.ir_module
    class Mod:
        @R.function(pure=False)
        def main(x: R.Tensor((4,), "float32"), c0: R.Tensor((4,), "float32")):
            with R.dataflow():
                lv0 = R.add(c0, R.const(1.0, "float32"))  # folds
                lv1 = R.add(x, lv0)  # no fold
                R.output(lv0, lv1)
            R.print(lv0, format="fold_guard corpus: {}")  # no fold: impure, kept
            lv2 = R.multiply(lv0, lv0)  # no fold: outside dataflow
            gv = R.add(lv1, lv2)  # no fold
            return gv

    return _bind(Mod, c0=_f32(_rng(58), 4))


@_case("folds")
def impure_call_packed():
    @I.ir_module
    class Mod:
        @R.function(pure=False)
        def main(x: R.Tensor((4, 4), "float32"), c0: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                lv0 = R.exp(c0)  # folds
                R.output(lv0)
            # no fold: impure packed call, even on a constant (testing.echo returns its arg)
            lv1 = R.call_packed("testing.echo", lv0, ty_args=R.Tensor((4, 4), "float32"))
            gv = R.add(x, lv1)  # no fold: outside dataflow
            return gv

    return _bind(Mod, c0=_f32(_rng(59), 4, 4))


@_case("folds")
def unused_const_binding():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((8,), "float32"), c0: R.Tensor((8,), "float32")):
            with R.dataflow():
                lv0 = R.exp(c0)  # noqa: F841 - folds, then removed: nothing uses it
                lv1 = R.sqrt(x)  # noqa: F841 - no fold, but removed: unused (RemoveAllUnused)
                gv = R.add(x, c0)  # no fold: runtime x
                R.output(gv)
            return gv

    return _bind(Mod, c0=_f32(_rng(60), 8))


@_case("unchanged")
def runtime_only():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), y: R.Tensor((8, 4), "float32")):
            with R.dataflow():
                lv0 = R.matmul(x, y)  # no fold: no constants at all
                gv = R.nn.softmax(lv0, axis=-1)  # no fold
                R.output(gv)
            return gv

    return Mod


@_case("folds")
def blockbuilder_layer_norm():
    """Built with BlockBuilder and relax.const rather than TVMScript."""
    rng = _rng(61)
    gamma = _f32(rng, 16, lo=0.5, hi=1.5)
    beta = _f32(rng, 16)
    raw = _f32(rng, 4, 16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            g = relax.const(gamma, "float32")
            b = relax.const(beta, "float32")
            c = relax.const(raw, "float32")
            # folds: layer_norm of a constant with constant gamma/beta
            ln = bb.emit(relax.op.nn.layer_norm(c, g, b, axes=[-1]))
            # folds
            sm = bb.emit(relax.op.nn.softmax(ln, axis=-1))
            # no fold: runtime x
            out = bb.emit_output(relax.op.add(x, sm))
        bb.emit_func_output(out)
    return bb.get()


@_case("folds")
def blockbuilder_where_int64_shape_ops():
    """BlockBuilder: int64/int32 index arithmetic on constants feeding a gather."""
    rng = _rng(62)
    table = _f32(rng, 10, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            idx = relax.const(np.array([9, 3, 7, 1, 5], dtype="int64"), "int64")
            # folds: int64 arithmetic
            i2 = bb.emit(
                relax.op.floor_mod(
                    relax.op.add(idx, relax.const(4, "int64")), relax.const(10, "int64")
                )
            )
            # folds: gather from a constant table
            rows = bb.emit(relax.op.take(relax.const(table, "float32"), i2, axis=0))
            # no fold: runtime x
            out = bb.emit_output(relax.op.add(x, rows))
        bb.emit_func_output(out)
    return bb.get()


@_case("partial")
def if_branches():
    """Bindings inside If branches: call_tir folds there, ops (no dataflow block) do not."""
    rng = _rng(63)
    c = _f32(rng, 4)

    @I.ir_module
    class Mod:
        @T.prim_func(private=True, s_tir=True)
        def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
            for i in range(4):
                with T.sblock("b"):
                    vi = T.axis.remap("S", [i])
                    b[vi] = a[vi] + T.float32(1)

        @R.function
        def main(x: R.Tensor((4,), "float32"), flag: R.Tensor((), "bool")):
            cls = Mod
            if flag:
                # folds: call_tir on a constant, in any block
                t = R.call_tir(
                    cls.add_one, (R.const(c, "float32"),), out_ty=R.Tensor((4,), "float32")
                )
                r = R.add(x, t)  # no fold: runtime x
            else:
                e = R.exp(R.const(c, "float32"))  # no fold: an op outside a dataflow block
                r = R.add(x, e)  # no fold: runtime x
            return r

    return Mod


@_case("folds")
def nested_function():
    """A local function's dataflow block folds like a module-level one."""
    rng = _rng(64)
    a, b = _f32(rng, 4), _f32(rng, 4)

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            @R.function
            def inner(y: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
                with R.dataflow():
                    k = R.multiply(R.const(a, "float32"), R.const(b, "float32"))  # folds
                    z = R.add(y, k)  # no fold: runtime y
                    R.output(z)
                return z

            w = inner(x)  # no fold: a call to a function is never evaluated
            return w

    return Mod


@_case("folds")
def weaker_annotated_types():
    """A constant bound to a variable annotated with a weaker type (ndim only, no shape).

    Once the constant replaces the variable, the argument's type is more precise, so stock
    infers the call's result type again; the call that reads that result sees a renamed
    variable; a call whose replaced argument keeps its type keeps its own.
    """
    rng = _rng(65)
    a, b = _f32(rng, 4, 8), _f32(rng, 4, 8)

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                w: R.Tensor(dtype="float32", ndim=2) = R.const(a, "float32")
                v = R.multiply(R.const(b, "float32"), R.const(b, "float32"))  # folds, same type
                y = R.add(x, w)  # no fold: runtime x; its argument's type gets precise
                z = R.subtract(y, v)  # no fold: runtime y (renamed: its type changed)
                u = R.multiply(x, v)  # no fold: runtime x; v's type does not change
                R.output(z, u)
            return (z, u)

    return Mod
