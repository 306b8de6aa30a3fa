"""Fuzzing random well-formed Relax modules against the stock pass (RFC.md, guarantees 1 to 4).

A module is one or two functions over a run-time input ``x`` of a random 2-D shape (zero-size and
size-1 dims included), built from random steps over a pool of same-shaped values (constants,
``x``, earlier results)::

    unary / binary elementwise, matmul by a constant, reshape and permute_dims round trips,
    concat + split (tuples), zeros / ones / full, quantize -> dequantize per tensor and per axis,
    a requantize chain (dequantize(int8 constant) -> quantize -> dequantize) added to a value,
    matmul by a float16 constant cast to float32, conv2d (1x1, where the shape is not empty);
    any result may be wrapped in fold_barrier or fold_allow.

Invariants on each example (:func:`support.ir_harness.check_fuzzed`, shared with Relay): with
the annotations left out, ``default`` is structurally equal to stock (and, one example in four,
to the reference engine's fold); the folded module computes bit-identical outputs to the
unfolded one (both compiled for the CPU); every barrier survives our pass and a later stock
pass, with nothing downstream of it folded; the input is untouched (JSON bytes); folding is
deterministic and idempotent; ``fold(annotate(m, P))`` under default keeps and folds the same
calls as ``fold(m, P)``.

Examples per test: ``FOLD_GUARD_FUZZ_EXAMPLES`` (default 200 under the full hypothesis profile,
CI's draws a quarter: ``support.profiles``); the long profile is
``FOLD_GUARD_FUZZ_EXAMPLES=10000 FOLD_GUARD_FUZZ_RUN_EVERY=1``. By default one example in four
(by seed) that folded something is also compiled and run: compiling is most of an example's
cost.
"""

from __future__ import annotations

from typing import List

import numpy as np
import pytest
import tvm
from harness_relax import RELAX
from hypothesis import given
from hypothesis import strategies as st
from support.ir_harness import FUZZ_POLICIES, FUZZ_SHAPE, check_fuzzed, fuzz_settings, fuzz_step
from tvm import relax

import fold_guard.relax as fgr

POLICIES = FUZZ_POLICIES + (("keep-requantize", "keep-qdq-weights"),)

UNARY = (
    relax.op.exp,
    relax.op.negative,
    relax.op.abs,
    relax.op.sigmoid,
    relax.op.tanh,
    relax.op.floor,
)
BINARY = (relax.op.add, relax.op.multiply, relax.op.subtract, relax.op.maximum, relax.op.minimum)
KINDS = (
    "unary",
    "binary",
    "matmul",
    "reshape",
    "permute",
    "concat_split",
    "creation",
    "qdq",
    "qdq_axis",
    "conv2d",
    "requantize",
    "half_matmul",
)

_FUNCTION = st.lists(fuzz_step(KINDS), min_size=1, max_size=8)
_MODULE = st.fixed_dictionaries(
    {
        "shape": FUZZ_SHAPE,
        "seed": st.integers(0, 2**31 - 1),
        "functions": st.lists(_FUNCTION, min_size=1, max_size=2),
        "policy": st.sampled_from(POLICIES),
    }
)


def _build(spec: dict, *, annotate: bool) -> tvm.IRModule:
    """The module of ``spec``, with its annotations or (``annotate=False``) without."""
    rows, cols = spec["shape"]
    rng = np.random.default_rng(spec["seed"])
    bb = relax.BlockBuilder()
    for f_index, steps in enumerate(spec["functions"]):
        name = "main" if f_index == 0 else f"helper{f_index}"
        x = relax.Var("x", relax.TensorType((rows, cols), "float32"))

        def const(shape, scale=2.0):
            return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

        with bb.function(name, [x]):
            with bb.dataflow():
                pool: List[relax.Expr] = [const((rows, cols)), x, const((rows, cols))]
                outputs = []
                for k, (kind, first, second, wrap) in enumerate(steps):
                    a, b = pool[first % len(pool)], pool[second % len(pool)]
                    if kind == "unary":
                        value = bb.emit(UNARY[second % len(UNARY)](a), f"v{k}")
                    elif kind == "binary":
                        value = bb.emit(BINARY[second % len(BINARY)](a, b), f"v{k}")
                    elif kind == "matmul":
                        value = bb.emit(relax.op.matmul(a, const((cols, cols), 0.5)), f"v{k}")
                    elif kind == "reshape" and rows * cols:
                        flat = bb.emit(relax.op.reshape(a, (rows * cols,)), f"r{k}")
                        value = bb.emit(relax.op.reshape(flat, (rows, cols)), f"v{k}")
                    elif kind == "permute" and rows * cols:
                        t = bb.emit(relax.op.permute_dims(a, [1, 0]), f"t{k}")
                        value = bb.emit(relax.op.permute_dims(t, [1, 0]), f"v{k}")
                    elif kind == "concat_split":
                        both = bb.emit(relax.op.concat([a, b], axis=1), f"c{k}")
                        parts = bb.emit(relax.op.split(both, 2, axis=1), f"s{k}")
                        value = bb.emit(relax.TupleGetItem(parts, 0), f"v{k}")
                    elif kind == "creation":
                        which = second % 3
                        if which == 0:
                            value = bb.emit(relax.op.zeros((rows, cols), "float32"), f"v{k}")
                        elif which == 1:
                            value = bb.emit(relax.op.ones((rows, cols), "float32"), f"v{k}")
                        else:
                            value = bb.emit(
                                relax.op.full(
                                    (rows, cols), relax.const(np.float32(1.5)), "float32"
                                ),
                                f"v{k}",
                            )
                    elif kind in ("qdq", "qdq_axis"):
                        per_axis = kind == "qdq_axis"
                        scale = relax.const(np.full((cols,) if per_axis else (), 0.05, "float32"))
                        zero = relax.const(np.zeros((cols,) if per_axis else (), "int8"))
                        axis = 1 if per_axis else -1
                        q = bb.emit(
                            relax.op.quantize(a, scale, zero, axis=axis, out_dtype="int8"), f"q{k}"
                        )
                        value = bb.emit(
                            relax.op.dequantize(q, scale, zero, axis=axis, out_dtype="float32"),
                            f"v{k}",
                        )
                    elif kind == "requantize":
                        stored = relax.const(rng.integers(-127, 128, (rows, cols)).astype("int8"))
                        zero = relax.const(np.int8(0))
                        s1, s2 = relax.const(np.float32(0.01)), relax.const(np.float32(0.03))
                        w1 = bb.emit(relax.op.dequantize(stored, s1, zero), f"w{k}")
                        w2 = bb.emit(relax.op.quantize(w1, s2, zero, out_dtype="int8"), f"q{k}")
                        w3 = bb.emit(relax.op.dequantize(w2, s2, zero), f"d{k}")
                        value = bb.emit(relax.op.add(a, w3), f"v{k}")
                    elif kind == "half_matmul":
                        half = relax.const(rng.standard_normal((cols, cols)).astype("float16"))
                        weight = bb.emit(relax.op.astype(half, "float32"), f"h{k}")
                        value = bb.emit(relax.op.matmul(a, weight), f"v{k}")
                    elif rows * cols and kind == "conv2d":
                        image = bb.emit(relax.op.reshape(a, (1, 1, rows, cols)), f"i{k}")
                        conv = bb.emit(relax.op.nn.conv2d(image, const((1, 1, 1, 1))), f"k{k}")
                        value = bb.emit(relax.op.reshape(conv, (rows, cols)), f"v{k}")
                    else:
                        value = bb.emit(relax.op.negative(a), f"v{k}")
                    outputs.append(value)
                    if annotate and wrap == "allow":
                        value = bb.emit(fgr.fold_allow(value), f"a{k}")
                        outputs.append(value)
                    elif annotate and wrap == "barrier":
                        value = bb.emit(fgr.fold_barrier(value), f"b{k}")
                        outputs.append(value)
                    pool.append(value)
                out = bb.emit_output(relax.Tuple(outputs), "out")
            bb.emit_func_output(out)
    return bb.get()


@pytest.mark.slow
@fuzz_settings(200)
@given(_MODULE)
def test_fuzzed_relax_modules(spec):
    check_fuzzed(RELAX, _build(spec, annotate=False), _build(spec, annotate=True), spec)
