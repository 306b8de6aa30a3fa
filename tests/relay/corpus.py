"""Equivalence corpus: small, unannotated Relay modules that exercise constant folding.

Every builder returns a fresh, type-checked ``tvm.IRModule``; all data comes from fixed numpy
seeds, so two calls give structurally equal modules. :func:`make_inputs` gives deterministic
run-time inputs for a module.

Each builder has a comment saying what stock ``relay.transform.FoldConstant`` (TVM 0.16,
``src/relay/transforms/fold_constant.cc``) does with it. The rules of the stock pass, as read
from that file and checked by ``tests/relay/test_corpus_stock.py``:

* It is a function pass over every global Relay function except those with a ``Compiler``,
  ``Extern`` or ``SkipOptimization`` attribute; inside it, nothing in a local function with
  ``Primitive=1`` is touched. Non-primitive local functions (closures) are folded inside.
* A call folds when its callee is an ``Op`` (not a function, local or global), it has at least
  one argument (``zeros((4, 5))`` is kept: "it is harmful to fold ones(shape=(4, 5))"), the op is
  not stateful, and every argument is a constant or a literal ``Tuple`` of constants. The call is
  evaluated with the interpreter on the CPU; a tuple result becomes a literal ``Tuple`` of
  constants.
* Non-computational ops (every QNN op) are kept unless the op has a QNN canonicalization and
  ``fold_qnn=True``. ``device_copy`` is never folded.
* ``shape_of`` / ``vm.shape_of`` / ``ndarray_size`` fold whenever the argument's *type* has a
  static shape, even if the argument is a run-time input; with a ``relay.Any`` dimension they stay.
* ``TupleGetItem`` of a literal ``Tuple`` becomes the field, whether or not the fields are
  constants. ``If`` with a constant condition becomes the chosen branch.
* A ``Let`` whose (folded) value is a single constant is dropped and the constant inlined; a let
  bound to a tuple of constants stays (a tuple is not a "simple" constant).

``STOCK`` records, per module, whether stock changes it with ``FoldConstant()`` and with
``FoldConstant(fold_qnn=True)``, and the op calls left afterwards (counted over every function
of the module, closures and primitive functions included). ``EXECUTOR`` says how a module is
run: ``"graph"`` (``relay.build`` + graph executor) or ``"vm"`` (control flow, closures, global
calls, dynamic shapes); ``NOT_RUNNABLE`` lists the modules that cannot be run here, with why.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from relay_ir import op_calls
from tvm import relay
from tvm.contrib import graph_executor

__all__ = [
    "BUILDERS",
    "DYNAMIC_DIM",
    "EXECUTOR",
    "NOT_BIT_EXACT",
    "NOT_RUNNABLE",
    "STOCK",
    "STOCK_MUTATES_INPUT",
    "TARGET",
    "StockRecord",
    "corpus",
    "make_inputs",
    "on_cpu",
    "op_counts",
    "run_module",
]

# hhb-tvm's LLVM default triple is riscv64; the modules must run on this x86 host.
TARGET = "llvm -mtriple=x86_64-linux-gnu"
# The size given to every relay.Any dimension when a dynamic module is run.
DYNAMIC_DIM = 3

CHANGES = "changes"
UNCHANGED = "unchanged"


@dataclass(frozen=True)
class StockRecord:
    """What stock ``FoldConstant`` does to one module.

    ``default`` / ``fold_qnn``: ``"changes"`` or ``"unchanged"`` (output structurally equal to
    the input) for ``FoldConstant()`` / ``FoldConstant(fold_qnn=True)``. ``ops_default`` /
    ``ops_fold_qnn``: op name -> number of calls of it left in the whole module afterwards.
    """

    default: str
    fold_qnn: str
    ops_default: Mapping[str, int]
    ops_fold_qnn: Mapping[str, int] = field(default_factory=dict)


BUILDERS: dict[str, Callable[[], tvm.IRModule]] = {}
STOCK: dict[str, StockRecord] = {}
EXECUTOR: dict[str, str] = {}
# Runnable modules whose stock-folded build is not bit-identical to the unfolded build, with why.
# They are compared with a tolerance to the unfolded run, and bit for bit to stock's folded run.
NOT_BIT_EXACT: dict[str, str] = {
    "batch_norm_consts": (
        "the interpreter evaluates batch_norm as one fused kernel (scale * data + shift after "
        "SimplifyInference); relay.build folds the same arithmetic op by op, so about a third "
        "of the outputs differ by up to 1.5e-7"
    ),
}
# Modules whose *input* stock FoldConstant changes in place, per setting, with why. fold_guard
# must not copy this: the input module is never mutated (RFC.md, guarantee 4).
STOCK_MUTATES_INPUT: dict[str, str] = {
    name: "fold_qnn=True: evaluating qnn.requantize on constants canonicalizes it, which writes "
    "the default rounding into the original call's attrs in place (rounding 'None' -> 'UPWARD')"
    for name in ("qnn_requantize_const", "qnn_dense_requantize_const")
}
NOT_RUNNABLE: dict[str, str] = {
    "ndarray_size_dynamic": "the Relay VM has no shape function for ndarray_size on a dynamic input "
    "(error: cannot find ShapeFunc for ndarray_size)",
    # The ccompiler codegen emits C source that relay.build leaves uncompiled, so the graph
    # executor finds no function ccompiler_0 (exporting with a C compiler would be needed).
    "compiler_function_skipped": "the ccompiler C source is not compiled into the built module "
    "(error: no such function in module: ccompiler_0)",
    # ccompiler only knows add / subtract / multiply.
    "compiler_function_only": "the ccompiler codegen rejects exp (error: Unrecognized op)",
}


def _case(
    default: str,
    ops_default: Mapping[str, int],
    *,
    fold_qnn: str | None = None,
    ops_fold_qnn: Mapping[str, int] | None = None,
    executor: str = "graph",
) -> Callable[[Callable[[], relay.Function | tvm.IRModule]], Callable[[], tvm.IRModule]]:
    """Register a builder. ``fold_qnn`` / ``ops_fold_qnn`` default to the ``default`` record
    (a module without QNN ops on constants is folded the same way by both)."""
    assert default in (CHANGES, UNCHANGED) and executor in ("graph", "vm")

    def deco(fn: Callable[[], relay.Function | tvm.IRModule]) -> Callable[[], tvm.IRModule]:
        name = fn.__name__
        assert name not in BUILDERS, name

        def build() -> tvm.IRModule:
            made = fn()
            mod = made if isinstance(made, tvm.IRModule) else tvm.IRModule.from_expr(made)
            return relay.transform.InferType()(mod)

        build.__name__ = name
        build.__doc__ = fn.__doc__
        BUILDERS[name] = build
        STOCK[name] = StockRecord(
            default,
            fold_qnn or default,
            _nonzero(ops_default),
            _nonzero(ops_default if ops_fold_qnn is None else ops_fold_qnn),
        )
        EXECUTOR[name] = executor
        return build

    return deco


def _nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    # a 0 in a record documents an op that stock removes; op_counts never lists it
    return {op: n for op, n in counts.items() if n}


def corpus() -> list[tuple[str, tvm.IRModule]]:
    """All corpus modules as ``(name, module)``, in a fixed order, freshly built."""
    return [(name, build()) for name, build in BUILDERS.items()]


def op_counts(mod: tvm.IRModule) -> dict[str, int]:
    """Op name -> number of calls to it, over every Relay function of ``mod`` (nested ones too)."""
    return dict(Counter(call.op.name for call in op_calls(mod)))


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _concrete_shape(ty: relay.TensorType) -> tuple[int, ...]:
    return tuple(DYNAMIC_DIM if isinstance(dim, tvm.tir.Any) else int(dim) for dim in ty.shape)


def _random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype("bool")
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        # int32 inputs stay small so that sums with other int32 data cannot overflow differently
        lo, hi = (max(info.min, -1000), min(info.max, 1000))
        return rng.integers(lo, hi + 1, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def make_inputs(name: str, mod: tvm.IRModule) -> dict[str, np.ndarray]:
    """Deterministic inputs for ``@main`` of ``mod``, keyed by parameter name.

    Dynamic (``relay.Any``) dimensions get size :data:`DYNAMIC_DIM`. The seed depends only on
    ``name``, so the unfolded and folded module of a case get the same inputs.
    """
    rng = np.random.default_rng(_seed(name))
    inputs: dict[str, np.ndarray] = {}
    for param in mod["main"].params:
        ty = param.checked_type
        if not isinstance(ty, relay.TensorType):
            raise TypeError(f"{name}: parameter {param.name_hint} has non-tensor type {ty}")
        inputs[param.name_hint] = _random_array(rng, _concrete_shape(ty), ty.dtype)
    return inputs


# ---------------------------------------------------------------------------------------------
# Small builders
# ---------------------------------------------------------------------------------------------


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(
    rng: np.random.Generator, *shape: int, lo: float = -1.0, hi: float = 1.0
) -> relay.Constant:
    # explicit dtype: relay.const turns float64 into float32 and int64 into int32 silently
    return relay.const(rng.uniform(lo, hi, size=shape).astype("float32"), "float32")


def _int(rng: np.random.Generator, dtype: str, *shape: int, lo: int, hi: int) -> relay.Constant:
    return relay.const(rng.integers(lo, hi, size=shape).astype(dtype), dtype)


def _scalar(value: float | bool, dtype: str) -> relay.Constant:
    return relay.const(np.array(value, dtype=dtype), dtype)


def _var(name: str, shape: Sequence[int | tvm.tir.Any], dtype: str = "float32") -> relay.Var:
    return relay.var(name, shape=shape, dtype=dtype)


def _fn(
    params: Sequence[relay.Var], body: relay.Expr, ret_type: relay.Type | None = None
) -> relay.Function:
    return relay.Function(list(params), body, ret_type)


def _vec4() -> relay.TensorType:
    # Global functions called from another function need a declared result type: Relay's
    # InferType cannot infer a call to a GlobalVar whose function it has not typed yet.
    return relay.TensorType((4,), "float32")


def _qparams(scale: float, zero_point: int = 0) -> tuple[relay.Constant, relay.Constant]:
    return _scalar(scale, "float32"), _scalar(zero_point, "int32")


# ---------------------------------------------------------------------------------------------
# Plain float chains
# ---------------------------------------------------------------------------------------------


@_case(CHANGES, {"add": 1})
def float_elemwise_chain() -> relay.Function:
    """x + exp((c0 + c1) * c2): the constant chain folds into one constant."""
    rng = _rng(0)
    x = _var("x", (4, 8))
    c0, c1, c2 = (_f32(rng, 4, 8) for _ in range(3))
    # stock: add, multiply, exp fold (all args constant); the add with x stays
    return _fn([x], relay.add(x, relay.exp(relay.multiply(relay.add(c0, c1), c2))))


@_case(CHANGES, {"add": 1})
def conv2d_const_input() -> relay.Function:
    """relu(conv2d(const, const)) folds; only the add with x is left."""
    rng = _rng(1)
    x = _var("x", (1, 4, 8, 8))
    data, weight = _f32(rng, 1, 3, 8, 8), _f32(rng, 4, 3, 3, 3)
    conv = relay.nn.conv2d(data, weight, padding=(1, 1), channels=4, kernel_size=(3, 3))
    # stock: conv2d and relu fold (constant data and weight); add(x, .) stays
    return _fn([x], relay.add(x, relay.nn.relu(conv)))


@_case(CHANGES, {"nn.conv2d": 1, "add": 1, "nn.relu": 1})
def conv2d_weight_prep() -> relay.Function:
    """Weight scaling and bias reshaping fold; the conv2d on x stays."""
    rng = _rng(2)
    x = _var("x", (1, 3, 16, 16))
    weight = relay.multiply(_f32(rng, 8, 3, 3, 3), _f32(rng, 8, 1, 1, 1))  # stock: folds
    bias = relay.reshape(relay.add(_f32(rng, 8), _f32(rng, 8)), (1, 8, 1, 1))  # stock: folds
    conv = relay.nn.conv2d(x, weight, padding=(1, 1), channels=8, kernel_size=(3, 3))  # x: stays
    return _fn([x], relay.nn.relu(relay.add(conv, bias)))


@_case(CHANGES, {"nn.dense": 1, "nn.bias_add": 1})
def dense_transpose_reshape() -> relay.Function:
    """transpose(reshape(const)) as a dense weight, and a doubled bias, fold."""
    rng = _rng(3)
    x = _var("x", (2, 16))
    weight = relay.transpose(relay.reshape(_f32(rng, 4, 16), (16, 4)), (1, 0))  # stock: folds
    bias = relay.multiply(_f32(rng, 4), _scalar(2.0, "float32"))  # stock: folds
    return _fn([x], relay.nn.bias_add(relay.nn.dense(x, weight), bias))  # x: both stay


@_case(CHANGES, {"subtract": 1, "concatenate": 1})
def concatenate_tuple_consts() -> relay.Function:
    """concatenate of a literal Tuple of constants folds; one with x in its Tuple stays."""
    rng = _rng(4)
    x = _var("x", (5, 4))
    c0, c1, c2 = _f32(rng, 2, 4), _f32(rng, 3, 4), _f32(rng, 3, 4)
    # stock: multiply folds, then concatenate folds (its Tuple argument is all constants)
    t = relay.concatenate(relay.Tuple([c0, relay.multiply(c1, c2)]), axis=0)
    # stock: subtract (x) stays; the outer concatenate (x in its Tuple) stays
    return _fn([x], relay.concatenate(relay.Tuple([relay.subtract(x, t), t]), axis=1))


@_case(CHANGES, {"multiply": 1, "add": 1})
def split_tuple_getitem() -> relay.Function:
    """split(const) folds to a Tuple of constants; the TupleGetItems on it become constants."""
    rng = _rng(5)
    x = _var("x", (2, 4))
    parts = relay.split(_f32(rng, 6, 4), 3, axis=0)  # one split call, read twice
    # stock: split folds to (C0, C1, C2); parts[0] -> C0, parts[2] -> C2; multiply/add (x) stay
    return _fn([x], relay.add(relay.multiply(x, parts[0]), parts[2]))


@_case(CHANGES, {"add": 1})
def batch_norm_consts() -> relay.Function:
    """batch_norm of constants (a tuple-returning op) folds; its item 0 becomes a constant."""
    rng = _rng(6)
    x = _var("x", (1, 4, 3, 3))
    bn = relay.nn.batch_norm(
        _f32(rng, 1, 4, 3, 3),
        _f32(rng, 4),
        _f32(rng, 4),
        _f32(rng, 4),
        _f32(rng, 4, lo=0.5, hi=2.0),
    )
    # stock: batch_norm folds (the interpreter runs SimplifyInference) to a 3-tuple of
    # constants, bn[0] becomes the first; add(x, .) stays
    return _fn([x], relay.add(x, bn[0]))


@_case(CHANGES, {"add": 2})
def tuple_getitem_literal_tuple() -> relay.Function:
    """TupleGetItem of literal Tuples: rewritten to the field even when it is not constant."""
    rng = _rng(7)
    x, y = _var("x", (3, 5)), _var("y", (3, 5))
    c, c2 = _f32(rng, 3, 5), _f32(rng, 3, 5)
    picked_var = relay.TupleGetItem(relay.Tuple([x, y]), 1)  # stock: -> y (no call folds)
    picked_const = relay.TupleGetItem(relay.Tuple([x, c]), 1)  # stock: -> c
    # stock: (c, c2).0 -> c, then multiply(c, c2) has constant args and folds
    folded = relay.multiply(relay.TupleGetItem(relay.Tuple([c, c2]), 0), c2)
    # stock: add(add(y, c), C)
    return _fn([x, y], relay.add(relay.add(picked_var, picked_const), folded))


@_case(CHANGES, {"add": 1})
def full_and_like_ops() -> relay.Function:
    """full(const fill) / full_like / zeros_like have a constant argument, so they fold."""
    rng = _rng(8)
    x = _var("x", (4, 5))
    c = _f32(rng, 4, 5)
    filled = relay.full(_scalar(2.0, "float32"), shape=(4, 5), dtype="float32")  # stock: folds
    like = relay.full_like(c, _scalar(0.5, "float32"))  # stock: folds
    zeros = relay.zeros_like(c)  # stock: folds (one constant argument)
    # stock: multiply(filled, like) and add(., zeros) fold; only add(x, C) is left
    return _fn([x], relay.add(x, relay.add(relay.multiply(filled, like), zeros)))


@_case(CHANGES, {"add": 1})
def cast_clip_where_chain() -> relay.Function:
    """cast / clip / greater / where / strided_slice / expand_dims / squeeze on constants fold."""
    rng = _rng(9)
    x = _var("x", (4, 4))
    a = relay.cast(_int(rng, "int32", 4, 6, lo=-5, hi=6), "float32")  # stock: folds
    b = relay.clip(a, -2.0, 2.0)  # stock: folds
    mask = relay.greater(_f32(rng, 4, 6), _scalar(0.0, "float32"))  # stock: folds (bool)
    w = relay.where(mask, b, relay.negative(b))  # stock: folds
    s = relay.strided_slice(w, begin=[0, 1], end=[4, 5])  # stock: folds, (4, 4)
    q = relay.squeeze(relay.expand_dims(s, 0), axis=[0])  # stock: folds
    return _fn([x], relay.add(x, q))  # stock: stays (x)


@_case(CHANGES, {"multiply": 1, "add": 1})
def take_reduce_tile_chain() -> relay.Function:
    """take with constant indices, mean, tile and max on constants all fold."""
    rng = _rng(10)
    x = _var("x", (3, 4))
    table = _f32(rng, 10, 4)
    rows = relay.take(table, relay.const(np.array([1, 3, 5], "int32"), "int32"), axis=0)  # folds
    tiled = relay.tile(relay.mean(rows, axis=0, keepdims=True), (3, 1))  # stock: folds, (3, 4)
    top = relay.max(table, axis=[0])  # stock: folds, (4,)
    return _fn([x], relay.add(relay.multiply(x, tiled), top))  # stock: both stay (x)


@_case(CHANGES, {"add": 1})
def int_arith_wraparound() -> relay.Function:
    """int8 arithmetic on constants wraps around; shifts and bitwise ops fold."""
    rng = _rng(11)
    x = _var("x", (16,), "int8")
    c0 = _int(rng, "int8", 16, lo=-128, hi=128)
    c1 = _int(rng, "int8", 16, lo=-128, hi=128)
    wrapped = relay.multiply(relay.add(c0, c1), _scalar(3, "int8"))  # stock: folds, wraps
    wide = relay.right_shift(relay.cast(wrapped, "int32"), _scalar(1, "int32"))  # stock: folds
    masked = relay.cast(relay.bitwise_and(wide, _scalar(0x3F, "int32")), "int8")  # stock: folds
    return _fn([x], relay.add(x, masked))  # stock: stays (x)


@_case(UNCHANGED, {"add": 2, "multiply": 1, "concatenate": 1})
def mixed_const_runtime() -> relay.Function:
    """Every call has a run-time argument: nothing folds."""
    rng = _rng(12)
    x = _var("x", (2, 3))
    c0, c1, c2 = _f32(rng, 2, 3), _f32(rng, 2, 3), _f32(rng, 1, 3)
    a = relay.add(x, c0)  # stock: stays (x)
    b = relay.multiply(c1, x)  # stock: stays (x)
    cat = relay.concatenate(
        relay.Tuple([relay.add(a, b), c2]), axis=0
    )  # stock: stays (a Tuple with a call)
    return _fn([x], cat)


@_case(UNCHANGED, {"zeros": 1, "ones": 1, "add": 2})
def zero_arg_calls() -> relay.Function:
    """zeros((4, 5)) / ones((4, 5)) have no arguments: stock keeps them, and what uses them."""
    x = _var("x", (4, 5))
    z = relay.zeros((4, 5), "float32")  # stock: kept (zero-arg call heuristic)
    o = relay.ones((4, 5), "float32")  # stock: kept
    return _fn([x], relay.add(x, relay.add(z, o)))  # stock: add(z, o) args are calls, kept


# ---------------------------------------------------------------------------------------------
# shape_of / ndarray_size, dynamic shapes
# ---------------------------------------------------------------------------------------------


@_case(CHANGES, {"multiply": 1, "add": 1})
def shape_of_static_runtime() -> relay.Function:
    """shape_of / ndarray_size of a statically shaped run-time input fold to constants."""
    x = _var("x", (2, 3, 4))
    # stock: shape_of(x) -> [2, 3, 4] (its type is static, x's value is irrelevant); cast and
    # sum then fold on the constant
    dims = relay.sum(relay.cast(relay.shape_of(x), "float32"))
    size = relay.cast(relay.ndarray_size(x, "int32"), "float32")  # stock: -> 24.0
    return _fn([x], relay.add(relay.multiply(x, size), dims))  # stock: both stay (x)


@_case(UNCHANGED, {"shape_of": 1, "cast": 1, "sum": 1, "add": 1}, executor="vm")
def shape_of_dynamic() -> relay.Function:
    """shape_of of a relay.Any-shaped input is not folded."""
    x = _var("x", (relay.Any(), 4))
    # stock: shape_of stays (dynamic first dimension), so cast and sum of it stay too
    dims = relay.sum(relay.cast(relay.shape_of(x), "float32"))
    return _fn([x], relay.add(x, dims))


@_case(UNCHANGED, {"ndarray_size": 1, "cast": 1, "multiply": 1}, executor="vm")
def ndarray_size_dynamic() -> relay.Function:
    """ndarray_size of a relay.Any-shaped input is not folded."""
    x = _var("x", (3, relay.Any()))
    size = relay.cast(relay.ndarray_size(x, "int32"), "float32")  # stock: stays (dynamic)
    return _fn([x], relay.multiply(x, size))


@_case(CHANGES, {"add": 1, "multiply": 1, "shape_of": 1}, executor="vm")
def dynamic_any_const_branches() -> relay.Function:
    """A relay.Any input next to constant side branches: the side branches fold."""
    rng = _rng(13)
    x = _var("x", (relay.Any(), 8))
    w = relay.multiply(_f32(rng, 8), _f32(rng, 8))  # stock: folds
    scale = relay.sum(relay.exp(_f32(rng, 8)))  # stock: folds to a scalar
    y = relay.multiply(relay.add(x, w), scale)  # stock: stays (x)
    return _fn([x], relay.Tuple([y, relay.shape_of(x)]))  # stock: shape_of(x) stays (dynamic)


# ---------------------------------------------------------------------------------------------
# Let form, If, closures, primitive functions
# ---------------------------------------------------------------------------------------------


@_case(CHANGES, {"add": 1, "nn.relu": 1}, executor="vm")
def let_bound_constants() -> relay.Function:
    """Let-bound constants are inlined and their lets dropped; a let of a run-time value stays."""
    rng = _rng(14)
    x = _var("x", (3, 4))
    c0, c1, c2 = _f32(rng, 3, 4), _f32(rng, 3, 4), _f32(rng, 3, 4)
    k, a, b, y, z = (relay.var(n) for n in ("k", "a", "b", "y", "z"))
    body = relay.Let(
        k,
        c2,  # stock: a let of a constant: inlined, dropped
        relay.Let(
            a,
            relay.add(c0, c1),  # stock: folds, inlined, dropped
            relay.Let(
                b,
                relay.multiply(a, k),  # stock: folds, inlined, dropped
                relay.Let(y, relay.add(x, b), relay.Let(z, relay.nn.relu(y), z)),  # stock: stay
            ),
        ),
    )
    return _fn([x], body)


@_case(CHANGES, {"add": 2, "concatenate": 1}, executor="vm")
def anf_constant_chain() -> tvm.IRModule:
    """A graph-form module put in A-normal form: each constant let folds and disappears."""
    rng = _rng(15)
    x = _var("x", (2, 6))
    s = relay.exp(_f32(rng, 2, 6))  # shared by two users; stock: folds
    w = relay.multiply(s, _f32(rng, 2, 6))  # stock: folds
    out = relay.concatenate(relay.Tuple([relay.add(x, s), relay.add(x, w)]), axis=0)  # stay
    mod = tvm.IRModule.from_expr(_fn([x], out))
    return relay.transform.ToANormalForm()(mod)


@_case(CHANGES, {"add": 1}, executor="vm")
def anf_split_tuple() -> relay.Function:
    """let t = split(const): t folds to a Tuple of constants, but the let stays.

    A Tuple is not a "simple" constant, so stock does not inline it, and ``t.0`` (a
    TupleGetItem of a Var, not of a literal Tuple) is not rewritten either.
    """
    rng = _rng(16)
    x = _var("x", (2, 4))
    t, a, y = relay.var("t"), relay.var("a"), relay.var("y")
    body = relay.Let(
        t,
        relay.split(_f32(rng, 6, 4), 3, axis=0).astuple(),  # stock: -> let t = (C0, C1, C2)
        relay.Let(
            a,
            relay.TupleGetItem(t, 0),  # stock: stays (t is a Var)
            relay.Let(y, relay.add(x, a), y),  # stock: stays
        ),
    )
    return _fn([x], body)


@_case(CHANGES, {"subtract": 1}, executor="vm")
def if_const_cond() -> relay.Function:
    """If(False, ...) becomes its false branch (the true one, folded first, is dropped)."""
    rng = _rng(17)
    x = _var("x", (3,))
    c0, c1 = _f32(rng, 3), _f32(rng, 3)
    then = relay.add(x, relay.multiply(c0, c1))  # stock: multiply folds, then the branch is dropped
    other = relay.subtract(x, c0)  # stock: kept (the chosen branch)
    return _fn([x], relay.If(_scalar(False, "bool"), then, other))


@_case(CHANGES, {"multiply": 1}, executor="vm")
def if_computed_cond() -> relay.Function:
    """The condition greater(2.0, 1.0) folds to True first, then the If is resolved."""
    rng = _rng(18)
    x = _var("x", (3,))
    cond = relay.greater(_scalar(2.0, "float32"), _scalar(1.0, "float32"))  # stock: -> True
    then = relay.multiply(x, _f32(rng, 3))  # stock: kept (the chosen branch)
    other = relay.add(x, relay.exp(_f32(rng, 3)))  # stock: dropped with the If
    return _fn([x], relay.If(cond, then, other))


@_case(CHANGES, {"add": 2}, executor="vm")
def if_runtime_cond() -> relay.Function:
    """An If on a run-time condition stays; constant chains inside both branches fold."""
    rng = _rng(19)
    x, flag = _var("x", (3,)), _var("flag", (), "bool")
    then = relay.add(x, relay.exp(_f32(rng, 3)))  # stock: exp folds
    other = relay.add(x, relay.negative(_f32(rng, 3)))  # stock: negative folds
    return _fn([x, flag], relay.If(flag, then, other))


@_case(CHANGES, {"add": 2}, executor="vm")
def local_closure() -> relay.Function:
    """A let-bound local function: its body folds; calls to it (even on constants) stay."""
    rng = _rng(20)
    x = _var("x", (4,))
    y = _var("y", (4,))
    f = relay.var("f")
    closure = _fn([y], relay.add(y, relay.multiply(_f32(rng, 4), _f32(rng, 4))))  # multiply folds
    # stock: f(x) and f(const) stay: only calls to Ops are evaluated
    body = relay.add(relay.Call(f, [x]), relay.Call(f, [_f32(rng, 4)]))
    return _fn([x], relay.Let(f, closure, body))


@_case(CHANGES, {"multiply": 1, "add": 1}, executor="vm")
def nested_closures() -> relay.Function:
    """A closure defined inside a closure: stock folds inside both."""
    rng = _rng(21)
    x, y, z = _var("x", (5,)), _var("y", (5,)), _var("z", (5,))
    inner = _fn([z], relay.multiply(z, relay.exp(_f32(rng, 5))))  # stock: exp folds
    outer = _fn(
        [y], relay.add(relay.Call(inner, [y]), relay.negative(_f32(rng, 5)))
    )  # negative folds
    return _fn([x], relay.Call(outer, [x]))  # stock: the calls to closures stay


def _primitive(func: relay.Function) -> relay.Function:
    return func.with_attr("Primitive", tvm.tir.IntImm("int32", 1))


@_case(CHANGES, {"add": 2, "multiply": 1, "negative": 0})
def primitive_function() -> relay.Function:
    """A local function with Primitive=1: its body is not folded; main's own chain is."""
    rng = _rng(22)
    x, a = _var("x", (6,)), _var("a", (6,))
    prim = _primitive(_fn([a], relay.add(a, relay.multiply(_f32(rng, 6), _f32(rng, 6)))))  # kept
    arg = relay.add(x, relay.negative(_f32(rng, 6)))  # stock: negative folds, add stays
    return _fn([x], relay.Call(prim, [arg]))


@_case(UNCHANGED, {"add": 1, "multiply": 1, "exp": 1})
def primitive_function_only() -> relay.Function:
    """All constant work sits in a Primitive=1 function: stock changes nothing."""
    rng = _rng(23)
    x, a = _var("x", (6,)), _var("a", (6,))
    # stock: kept (inside a primitive function)
    prim = _primitive(_fn([a], relay.add(a, relay.multiply(relay.exp(_f32(rng, 6)), _f32(rng, 6)))))
    return _fn([x], relay.Call(prim, [x]))


# ---------------------------------------------------------------------------------------------
# Several global functions, external (Compiler) functions
# ---------------------------------------------------------------------------------------------


@_case(CHANGES, {"multiply": 1, "add": 1, "subtract": 1, "exp": 0}, executor="vm")
def multi_function() -> tvm.IRModule:
    """@main calls @helper, which calls @leaf; every global function folds its own constants."""
    rng = _rng(24)
    mod = tvm.IRModule()
    leaf, helper = relay.GlobalVar("leaf"), relay.GlobalVar("helper")
    z = _var("z", (4,))
    mod[leaf] = _fn(
        [z], relay.multiply(z, relay.negative(_f32(rng, 4))), _vec4()
    )  # stock: negative folds
    y = _var("y", (4,))
    helper_body = relay.add(relay.Call(leaf, [y]), relay.abs(_f32(rng, 4)))  # stock: abs folds
    mod[helper] = _fn([y], helper_body, _vec4())
    x = _var("x", (4,))
    # stock: exp folds; @helper(const) stays (a call to a global function is never evaluated)
    main_body = relay.subtract(relay.Call(helper, [x]), relay.exp(_f32(rng, 4)))
    mod["main"] = _fn([x], relay.Tuple([main_body, relay.Call(helper, [_f32(rng, 4)])]))
    return mod


def _external(func: relay.Function, name: str) -> relay.Function:
    func = _primitive(func)
    func = func.with_attr("Inline", tvm.tir.IntImm("int32", 1))
    func = func.with_attr("Compiler", "ccompiler")
    return func.with_attr("global_symbol", name)


@_case(CHANGES, {"add": 2, "multiply": 1})
def compiler_function_skipped() -> tvm.IRModule:
    """A partitioned global function with Compiler="ccompiler": stock skips it; main folds."""
    rng = _rng(25)
    mod = tvm.IRModule()
    ext = relay.GlobalVar("ccompiler_0")
    a = _var("a", (4,))
    # stock: kept (the function pass skips functions with a Compiler attribute)
    body = relay.add(a, relay.multiply(_f32(rng, 4), _f32(rng, 4)))
    mod[ext] = _external(_fn([a], body, _vec4()), "ccompiler_0")
    x = _var("x", (4,))
    mod["main"] = _fn([x], relay.Call(ext, [relay.add(x, relay.exp(_f32(rng, 4)))]))  # exp folds
    return mod


@_case(UNCHANGED, {"add": 1, "multiply": 1, "exp": 1})
def compiler_function_only() -> tvm.IRModule:
    """All constant work sits in the Compiler="ccompiler" function: stock changes nothing."""
    rng = _rng(26)
    mod = tvm.IRModule()
    ext = relay.GlobalVar("ccompiler_0")
    a = _var("a", (4,))
    body = relay.add(a, relay.multiply(relay.exp(_f32(rng, 4)), _f32(rng, 4)))  # stock: kept
    mod[ext] = _external(_fn([a], body, _vec4()), "ccompiler_0")
    x = _var("x", (4,))
    mod["main"] = _fn([x], relay.Call(ext, [x]))
    return mod


# ---------------------------------------------------------------------------------------------
# QNN ops on constants: kept by default, folded with fold_qnn=True
# ---------------------------------------------------------------------------------------------


@_case(
    UNCHANGED,
    {"qnn.quantize": 1, "qnn.dense": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"qnn.dense": 1},
)
def qnn_quantize_const() -> relay.Function:
    """qnn.quantize(fp32 weight) feeding qnn.dense on an int8 activation."""
    rng = _rng(27)
    x = _var("x", (2, 16), "int8")
    wscale, wzp = _qparams(0.02)
    xscale, xzp = _qparams(0.05, 3)
    # stock default: kept (QNN op); fold_qnn: folds to an int8 constant
    w_q = relay.qnn.op.quantize(_f32(rng, 4, 16), wscale, wzp, out_dtype="int8")
    # stock: stays either way (x is a run-time input)
    return _fn([x], relay.qnn.op.dense(x, w_q, xzp, wzp, xscale, wscale, units=4))


@_case(
    UNCHANGED,
    {"qnn.dequantize": 1, "nn.dense": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"nn.dense": 1},
)
def qnn_dequantize_const() -> relay.Function:
    """QDQ weight: dense(x, dequantize(int8 const)). fold_qnn turns the weight into fp32."""
    rng = _rng(28)
    x = _var("x", (2, 16))
    scale, zp = _qparams(0.01, -2)
    # stock default: kept; fold_qnn: folds (the QDQ pattern a backend matches is gone)
    w = relay.qnn.op.dequantize(_int(rng, "int8", 8, 16, lo=-128, hi=128), scale, zp)
    return _fn([x], relay.nn.dense(x, w))  # stock: stays (x)


@_case(
    UNCHANGED,
    {"qnn.requantize": 1, "add": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"add": 1},
)
def qnn_requantize_const() -> relay.Function:
    """qnn.requantize of an int32 constant to int8."""
    rng = _rng(29)
    x = _var("x", (16,), "int8")
    in_scale, in_zp = _qparams(0.001)
    out_scale, out_zp = _qparams(0.1, 5)
    acc = _int(rng, "int32", 16, lo=-20000, hi=20000)
    # stock default: kept; fold_qnn: folds
    r = relay.qnn.op.requantize(acc, in_scale, in_zp, out_scale, out_zp, out_dtype="int8")
    return _fn([x], relay.add(x, r))  # stock: stays (x)


@_case(
    UNCHANGED,
    {"qnn.dequantize": 2, "qnn.quantize": 1, "nn.dense": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"nn.dense": 1},
)
def qnn_requantize_chain_const() -> relay.Function:
    """A weight requantized in the graph: dense(x, dequantize(quantize(dequantize(W, s1), s2), s2))."""
    rng = _rng(36)
    x = _var("x", (2, 16))
    s1, zp = _qparams(0.01)
    s2, _ = _qparams(0.03)
    # stock default: all three kept (QNN ops); fold_qnn: all fold into an fp32 weight
    w1 = relay.qnn.op.dequantize(_int(rng, "int8", 8, 16, lo=-127, hi=128), s1, zp)
    w2 = relay.qnn.op.quantize(w1, s2, zp, out_dtype="int8")
    w3 = relay.qnn.op.dequantize(w2, s2, zp)
    return _fn([x], relay.nn.dense(x, w3))  # stock: stays (x)


@_case(CHANGES, {"nn.dense": 1, "nn.bias_add": 1})
def cast_half_weight() -> relay.Function:
    """TFLite's float16 weights: dense(x, cast(<float16 W>)) with a cast(<float16 b>) bias."""
    rng = _rng(37)
    x = _var("x", (2, 16))
    w = relay.const(rng.standard_normal((8, 16)).astype("float16"))
    b = relay.const(rng.standard_normal(8).astype("float16"))
    # stock: both casts fold into float32 constants
    dense = relay.nn.dense(x, relay.cast(w, "float32"))
    return _fn([x], relay.nn.bias_add(dense, relay.cast(b, "float32")))


@_case(
    UNCHANGED,
    {"qnn.add": 2},
    fold_qnn=CHANGES,
    ops_fold_qnn={"qnn.add": 1},
)
def qnn_add_const() -> relay.Function:
    """qnn.add of two int8 constants, then qnn.add with an activation."""
    rng = _rng(30)
    x = _var("x", (8,), "int8")
    s0, z0 = _qparams(0.05, 1)
    s1, z1 = _qparams(0.04, -1)
    s2, z2 = _qparams(0.08)
    a = _int(rng, "int8", 8, lo=-128, hi=128)
    b = _int(rng, "int8", 8, lo=-128, hi=128)
    const_sum = relay.qnn.op.add(a, b, s0, z0, s1, z1, s2, z2)  # default: kept; fold_qnn: folds
    return _fn([x], relay.qnn.op.add(x, const_sum, s2, z2, s2, z2, s0, z0))  # stays (x)


@_case(
    UNCHANGED,
    {"qnn.conv2d": 1, "add": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"add": 1},
)
def qnn_conv2d_const() -> relay.Function:
    """qnn.conv2d of constant int8 data and weight."""
    rng = _rng(31)
    x = _var("x", (1, 4, 4, 4), "int32")
    data = _int(rng, "int8", 1, 3, 6, 6, lo=-128, hi=128)
    weight = _int(rng, "int8", 4, 3, 3, 3, lo=-128, hi=128)
    dscale, dzp = _qparams(0.05, 2)
    wscale, wzp = _qparams(0.02)
    conv = relay.qnn.op.conv2d(
        data, weight, dzp, wzp, dscale, wscale, kernel_size=(3, 3), channels=4
    )  # default: kept; fold_qnn: folds to an int32 constant
    return _fn([x], relay.add(x, conv))  # stays (x)


@_case(
    UNCHANGED,
    {"qnn.dense": 1, "qnn.requantize": 1, "add": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={"add": 1},
)
def qnn_dense_requantize_const() -> relay.Function:
    """qnn.dense of int8 constants, requantized to int8: a whole constant QNN subgraph."""
    rng = _rng(32)
    x = _var("x", (2, 4), "int8")
    data = _int(rng, "int8", 2, 8, lo=-128, hi=128)
    weight = _int(rng, "int8", 4, 8, lo=-128, hi=128)
    dscale, dzp = _qparams(0.05)
    wscale, wzp = _qparams(0.02)
    acc = relay.qnn.op.dense(data, weight, dzp, wzp, dscale, wscale, units=4)  # fold_qnn: folds
    out_scale, out_zp = _qparams(0.5, -3)
    r = relay.qnn.op.requantize(
        acc, _scalar(0.001, "float32"), _scalar(0, "int32"), out_scale, out_zp
    )
    return _fn([x], relay.add(x, r))  # stays (x)


@_case(UNCHANGED, {"qnn.conv2d": 1, "add": 1, "qnn.requantize": 2, "reshape": 1, "qnn.dense": 1})
def qnn_activation_int8_weights() -> relay.Function:
    """qnn.conv2d / qnn.dense / qnn.requantize on activations with int8 constant weights.

    Nothing folds with either setting: every QNN call has a run-time argument.
    """
    rng = _rng(33)
    x = _var("x", (1, 3, 8, 8), "int8")
    xscale, xzp = _qparams(0.05, 1)
    wscale, wzp = _qparams(0.02)
    w_conv = _int(rng, "int8", 4, 3, 3, 3, lo=-127, hi=128)
    conv = relay.qnn.op.conv2d(x, w_conv, xzp, wzp, xscale, wscale, kernel_size=(3, 3), channels=4)
    biased = relay.add(conv, _int(rng, "int32", 1, 4, 1, 1, lo=-500, hi=500))
    act_scale, act_zp = _qparams(0.1)
    r = relay.qnn.op.requantize(
        biased, _scalar(0.001, "float32"), _scalar(0, "int32"), act_scale, act_zp
    )
    flat = relay.reshape(r, (1, 144))
    w_dense = _int(rng, "int8", 5, 144, lo=-127, hi=128)
    dense = relay.qnn.op.dense(flat, w_dense, act_zp, wzp, act_scale, wscale, units=5)
    out = relay.qnn.op.requantize(
        dense, _scalar(0.002, "float32"), _scalar(0, "int32"), act_scale, act_zp
    )
    return _fn([x], out)


@_case(
    UNCHANGED,
    {"qnn.quantize": 3, "qnn.conv2d": 1, "add": 1, "qnn.requantize": 1, "qnn.dequantize": 1},
    fold_qnn=CHANGES,
    ops_fold_qnn={
        "qnn.quantize": 1,
        "qnn.conv2d": 1,
        "add": 1,
        "qnn.requantize": 1,
        "qnn.dequantize": 1,
    },
)
def qnn_constant_weights_activation_graph() -> relay.Function:
    """The TVM PR 11228 review case: quantize(const) weight and bias next to QNN ops on x.

    fold_qnn=True folds only the two constant qnn.quantize calls into int8 / int32 constants;
    qnn.quantize(x), qnn.conv2d, qnn.requantize and qnn.dequantize on the activation remain.
    """
    rng = _rng(34)
    x = _var("x", (1, 3, 8, 8))
    xscale, xzp = _qparams(0.05, 1)
    wscale, wzp = _qparams(0.02)
    q = relay.qnn.op.quantize(x, xscale, xzp)  # stays (x)
    w_q = relay.qnn.op.quantize(_f32(rng, 4, 3, 3, 3), wscale, wzp)  # fold_qnn: folds
    conv = relay.qnn.op.conv2d(q, w_q, xzp, wzp, xscale, wscale, kernel_size=(3, 3), channels=4)
    bias_scale, bias_zp = _qparams(0.001)
    bias = relay.qnn.op.quantize(
        _f32(rng, 1, 4, 1, 1), bias_scale, bias_zp, out_dtype="int32"
    )  # fold_qnn: folds
    out_scale, out_zp = _qparams(0.1, -2)
    r = relay.qnn.op.requantize(relay.add(conv, bias), bias_scale, bias_zp, out_scale, out_zp)
    return _fn([x], relay.qnn.op.dequantize(r, out_scale, out_zp))


@_case(
    CHANGES,
    {"qnn.dequantize": 1, "nn.dense": 1, "add": 1},
    ops_fold_qnn={"nn.dense": 1, "add": 1},
)
def qnn_mixed_float_and_qnn() -> relay.Function:
    """Float constants fold under both settings; the dequantize of the weight only with fold_qnn.

    dequantize(transpose(int8 const)): the transpose folds by default (a plain op), leaving
    dequantize(C); fold_qnn then also folds that.
    """
    rng = _rng(35)
    x = _var("x", (3, 8))
    scale, zp = _qparams(0.03)
    w_int = relay.transpose(_int(rng, "int8", 8, 6, lo=-128, hi=128), (1, 0))  # stock: folds
    w = relay.qnn.op.dequantize(w_int, scale, zp)  # default: kept; fold_qnn: folds
    bias = relay.sqrt(relay.abs(_f32(rng, 6)))  # stock: folds
    return _fn([x], relay.add(relay.nn.dense(x, w), bias))


# ---------------------------------------------------------------------------------------------
# Mixed cases
# ---------------------------------------------------------------------------------------------


@_case(CHANGES, {"nn.conv2d": 1, "nn.batch_norm": 1, "nn.relu": 1})
def mixed_conv_bn_runtime() -> relay.Function:
    """batch_norm on a run-time conv output stays; its constant parameter prep folds."""
    rng = _rng(36)
    x = _var("x", (1, 3, 6, 6))
    conv = relay.nn.conv2d(x, _f32(rng, 4, 3, 3, 3), channels=4, kernel_size=(3, 3))  # stays (x)
    gamma = relay.multiply(_f32(rng, 4), _scalar(2.0, "float32"))  # stock: folds
    var = relay.abs(_f32(rng, 4))  # stock: folds
    bn = relay.nn.batch_norm(conv, gamma, _f32(rng, 4), _f32(rng, 4), var)
    # stock: batch_norm (run-time data) and bn[0] stay
    return _fn([x], relay.nn.relu(bn[0]))


@_case(CHANGES, {"add": 1})
def mixed_tuple_output() -> relay.Function:
    """A tuple result: one field computed from x, one from constants only (folds)."""
    rng = _rng(37)
    x = _var("x", (2, 2))
    c0, c1, c2 = _f32(rng, 2, 2), _f32(rng, 2, 2), _f32(rng, 2, 2)
    return _fn([x], relay.Tuple([relay.add(x, c0), relay.multiply(c1, c2)]))


@_case(CHANGES, {"add": 1, "concatenate": 1})
def mixed_shared_const_subexpr() -> relay.Function:
    """One constant subexpression used three times (a DAG): it folds once, everywhere."""
    rng = _rng(38)
    x = _var("x", (2, 3))
    s = relay.exp(_f32(rng, 2, 3))  # stock: folds (memoized: evaluated once)
    a = relay.add(x, s)  # stays (x)
    b = relay.multiply(s, _f32(rng, 2, 3))  # stock: folds
    return _fn([x], relay.concatenate(relay.Tuple([a, b, s]), axis=0))


@_case(CHANGES, {"nn.conv2d": 1, "add": 1, "layout_transform": 2})
def mixed_layout_transform() -> relay.Function:
    """An NCHWc conv: layout_transform of the constant weight folds; of x it stays."""
    rng = _rng(39)
    x = _var("x", (1, 8, 6, 6))
    data = relay.layout_transform(x, "NCHW", "NCHW4c")  # stays (x)
    weight = relay.layout_transform(_f32(rng, 8, 8, 3, 3), "OIHW", "OIHW4i4o")  # stock: folds
    conv = relay.nn.conv2d(
        data,
        weight,
        channels=8,
        kernel_size=(3, 3),
        padding=(1, 1),
        data_layout="NCHW4c",
        kernel_layout="OIHW4i4o",
    )
    bias = relay.reshape(_f32(rng, 8), (1, 2, 1, 1, 4))  # stock: folds
    return _fn([x], relay.layout_transform(relay.add(conv, bias), "NCHW4c", "NCHW"))


@_case(CHANGES, {"add": 1, "multiply": 1, "expand_dims": 1})
def mixed_float16_chain() -> relay.Function:
    """float16 constants: casts and arithmetic fold in float16, bit for bit."""
    rng = _rng(40)
    x = _var("x", (4, 3), "float16")
    c = relay.cast(_f32(rng, 3, lo=-4, hi=4), "float16")  # stock: folds
    d = relay.divide(c, relay.cast(_f32(rng, 3, lo=1, hi=2), "float16"))  # stock: folds
    row = relay.expand_dims(x, 0)  # stays (x)
    return _fn([x], relay.add(relay.multiply(row, d), relay.sigmoid(d)))  # sigmoid folds


@_case(CHANGES, {})
def all_const_no_inputs() -> relay.Function:
    """A main without parameters whose whole body is constant: it folds to one constant."""
    rng = _rng(41)
    c0, c1 = _f32(rng, 3, 4), _f32(rng, 4)
    return _fn([], relay.nn.softmax(relay.multiply(relay.exp(c0), c1)))  # stock: all fold


@_case(CHANGES, {"add": 1})
def split_returned_tuple() -> relay.Function:
    """split(const) returned as part of a nested tuple result stays a literal Tuple of constants."""
    rng = _rng(42)
    x = _var("x", (2, 3))
    parts = relay.split(_f32(rng, 4, 3), 2, axis=0).astuple()  # stock: -> (C0, C1)
    return _fn([x], relay.Tuple([relay.add(x, _f32(rng, 2, 3)), parts]))  # add stays (x)


# ---------------------------------------------------------------------------------------------
# Device annotations: on_device (what PlanDevices reads; identity at run time)
# ---------------------------------------------------------------------------------------------


def on_cpu(
    expr: relay.Expr, *, constrain_result: bool = True, constrain_body: bool = True
) -> relay.Call:
    """``expr`` under an ``on_device`` for the CPU (both constraints unless told otherwise)."""
    return relay.op.annotation.on_device(
        expr, tvm.cpu(), constrain_result=constrain_result, constrain_body=constrain_body
    )


@_case(CHANGES, {"on_device": 2, "multiply": 1, "subtract": 0, "exp": 0}, executor="vm")
def on_device_let_chain() -> relay.Function:
    """Let-bound on_device values: stock sees through them and inlines each constant with its on_device."""
    rng = _rng(43)
    x = _var("x", (4,))
    sb = relay.ScopeBuilder()
    a = sb.let("a", on_cpu(_f32(rng, 4)))  # stock: a simple constant: inlined as on_device(C)
    b = sb.let(
        "b", on_cpu(relay.exp(relay.subtract(a, _f32(rng, 4))))
    )  # folds: inlined as on_device(C')
    y = sb.let("y", on_cpu(relay.multiply(x, b)))  # stays (x), with on_device(C') as its operand
    sb.ret(y)
    return _fn([x], sb.get())


@_case(CHANGES, {"on_device": 1, "add": 1})
def on_device_graph_result() -> relay.Function:
    """on_device(constrain_result) between constant calls: the chain folds; the last on_device stays."""
    rng = _rng(44)
    x = _var("x", (2, 3))
    c = on_cpu(relay.exp(on_cpu(_f32(rng, 2, 3))), constrain_body=False)  # stock: exp folds
    scaled = on_cpu(
        relay.multiply(c, _f32(rng, 3)), constrain_body=False
    )  # folds; on_device(C) stays
    return _fn([x], relay.add(x, scaled))  # stays (x)


@_case(CHANGES, {"on_device": 2, "add": 1, "nn.relu": 1, "negative": 0, "abs": 0})
def on_device_graph_body() -> relay.Function:
    """on_device(constrain_body), the annotation's default, around constant and run-time calls: stock folds through."""
    rng = _rng(45)
    x = _var("x", (5,))
    body_only = on_cpu(
        relay.negative(_f32(rng, 5)), constrain_result=False
    )  # stock: negative folds
    both = on_cpu(relay.abs(body_only), constrain_result=False)  # folds: on_device(C) stays
    runtime = on_cpu(relay.nn.relu(x), constrain_result=False)  # stays (x)
    return _fn([x], relay.add(runtime, both))


@_case(CHANGES, {"on_device": 0, "add": 2, "exp": 0})
def on_device_tuple_get_item() -> relay.Function:
    """on_device((C, exp(C), x)).i: stock takes the field and puts it under the tuple's on_device.

    A variable field comes out bare (``MaybeOnDevice``: its device is known where it is bound).
    """
    rng = _rng(46)
    x = _var("x", (3,))
    c = _f32(rng, 3)
    tup = on_cpu(relay.Tuple([c, relay.exp(c), x]))  # stock: exp folds; the tuple stays until read
    # stock: on_device(C') + on_device(C) folds, and its on_device annotations go with it
    first = relay.add(relay.TupleGetItem(tup, 1), relay.TupleGetItem(tup, 0))
    return _fn([x], relay.add(relay.add(first, relay.TupleGetItem(tup, 2)), x))  # .2 -> x


@_case(CHANGES, {"add": 1, "subtract": 1, "multiply": 0}, executor="vm")
def on_device_if_condition() -> relay.Function:
    """If on on_device(less(C0, C1)): the condition folds to on_device(C), and stock takes its branch."""
    rng = _rng(47)
    x = _var("x", (4,))
    cond = on_cpu(
        relay.less(_scalar(1.0, "float32"), relay.sum(_f32(rng, 4, lo=1, hi=2))),
        constrain_result=False,
    )  # folds: True
    taken = relay.add(x, relay.multiply(_f32(rng, 4), _f32(rng, 4)))  # multiply folds, add stays
    return _fn([x], relay.subtract(relay.If(cond, taken, relay.negative(x)), x))


@_case(CHANGES, {"on_device": 2, "add": 2, "exp": 0})
def on_device_nested() -> relay.Function:
    """on_device(on_device(...)): stock looks through one level only, so the outer one is not a constant."""
    rng = _rng(48)
    x = _var("x", (4,))
    inner = on_cpu(relay.exp(_f32(rng, 4)))  # stock: exp folds; on_device(C) is a constant
    outer = on_cpu(inner, constrain_result=False)  # not a constant to stock: on_device of a call
    return _fn([x], relay.add(x, relay.add(outer, _f32(rng, 4))))  # neither add folds


@_case(CHANGES, {"on_device": 1, "add": 1, "exp": 0}, executor="vm")
def on_device_let_tuple() -> relay.Function:
    """let t = on_device((exp(C0), C1)): a tuple is no simple constant, so the binding stays."""
    rng = _rng(49)
    x = _var("x", (4,))
    t = relay.var("t")
    value = on_cpu(relay.Tuple([relay.exp(_f32(rng, 4)), _f32(rng, 4)]))  # stock: exp folds
    return _fn([x], relay.Let(t, value, relay.add(relay.TupleGetItem(t, 0), x)))  # t.0 stays


@_case(CHANGES, {"on_device": 1, "add": 1})
def on_device_unconstrained_tuple() -> relay.Function:
    """on_device with neither constraint holds no device: reading its tuple gives the bare field."""
    rng = _rng(50)
    x = _var("x", (4,))
    tup = on_cpu(
        relay.Tuple([relay.sqrt(_f32(rng, 4, lo=1, hi=2)), x]),
        constrain_result=False,
        constrain_body=False,
    )
    # stock: sqrt folds; tup.0 -> C (no on_device), then add(C, C) folds too
    folded = relay.add(relay.TupleGetItem(tup, 0), _f32(rng, 4))
    return _fn([x], relay.Tuple([relay.add(folded, x), tup]))


# ---------------------------------------------------------------------------------------------
# Running a module on the CPU
# ---------------------------------------------------------------------------------------------


def _flatten(value: object) -> list[np.ndarray]:
    if isinstance(value, tvm.nd.NDArray):
        return [value.numpy()]
    if isinstance(value, (tvm.runtime.container.ADT, list, tuple)):
        return [array for item in value for array in _flatten(item)]
    raise TypeError(f"unexpected executor result {type(value).__name__}")


def run_module(name: str, mod: tvm.IRModule, *, force: bool = False) -> list[np.ndarray]:
    """Build ``mod`` for the x86 CPU and run ``@main`` on :func:`make_inputs`; the flat outputs.

    ``EXECUTOR[name]`` picks ``relay.build`` + graph executor or the Relay VM. A module in
    ``NOT_RUNNABLE`` raises ``ValueError`` unless ``force`` (to show that it indeed fails).
    """
    if name in NOT_RUNNABLE and not force:
        raise ValueError(f"{name} cannot be run here: {NOT_RUNNABLE[name]}")
    inputs = make_inputs(name, mod)
    dev = tvm.cpu(0)
    if EXECUTOR[name] == "graph":
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=TARGET)
        gmod = graph_executor.GraphModule(lib["default"](dev))
        gmod.set_input(**inputs)
        gmod.run()
        return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]
    with tvm.transform.PassContext(opt_level=3):
        executor = relay.create_executor("vm", mod=mod, device=dev, target=TARGET)
        result = executor.evaluate()(**inputs)
    return _flatten(result)
