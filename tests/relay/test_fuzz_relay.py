"""Fuzzing random well-formed Relay modules against the stock pass (RFC.md, guarantees 1 to 4).

A module is ``main(x)`` over a random 2-D shape (zero-size and size-1 dims included), in graph
form or let-bound (``ToANormalForm``), built from random steps over a pool of same-shaped values::

    unary / binary elementwise, dense by a constant, conv2d 1x1, reshape and transpose round
    trips, concatenate + split (tuples), zeros / ones / full, qnn.quantize -> qnn.dequantize per
    tensor and per axis, qnn.dense and qnn.conv2d with qnn.requantize, a requantize chain
    (qnn.dequantize(int8 constant) -> qnn.quantize -> qnn.dequantize) and a qnn.requantize of an
    int8 constant added to a value, dense by a float16 constant cast to float32; any result may
    be wrapped in fold_barrier or fold_allow.

Invariants on each example (:func:`support.ir_harness.check_fuzzed`, shared with Relax):
unannotated, ``default`` equals ``FoldConstant()`` and ``fold-qnn`` equals
``FoldConstant(fold_qnn=True)``; the calls downstream of a barrier (and the barriers) are all
still there after our pass and after a later stock pass; the built module computes the same bits
before and after our pass; the input is untouched (JSON bytes); folding is deterministic and
idempotent; ``fold(annotate(m, P))`` under default keeps and folds the same calls as
``fold(m, P)``. Where TVM itself fails (hhb's x86 ``dense`` schedule on a zero-size input, in the
stock pass and in ``relay.build``), ours must have kept what it could not evaluate.

``FOLD_GUARD_FUZZ_EXAMPLES`` (default 25 here, see ``EXAMPLES``, under the full hypothesis profile;
CI's draws a quarter: ``support.profiles``) and ``FOLD_GUARD_FUZZ_RUN_EVERY`` (default 4) as in
``tests/relax/test_fuzz_relax.py``.
"""

from __future__ import annotations

from typing import List

import numpy as np
import pytest
import tvm
from harness_relay import RELAY
from hypothesis import given
from hypothesis import strategies as st
from support.ir_harness import FUZZ_POLICIES, FUZZ_SHAPE, check_fuzzed, fuzz_settings, fuzz_step
from tvm import relay

import fold_guard.relay as fgr

#: Relay examples cost several seconds each (stock ``fold_qnn=True`` alone is ~0.6 s per QNN
#: block), so the normal run does fewer than on Relax; the long profile sets the count.
EXAMPLES = 25
POLICIES = FUZZ_POLICIES + (("keep-requantize", "qdq-accelerator"),)

UNARY = (relay.exp, relay.negative, relay.abs, relay.sigmoid, relay.tanh, relay.floor)
BINARY = (relay.add, relay.multiply, relay.subtract, relay.maximum, relay.minimum)
KINDS = (
    "unary",
    "binary",
    "dense",
    "conv2d",
    "reshape",
    "transpose",
    "concat_split",
    "creation",
    "qdq",
    "qdq_axis",
    "qnn_dense",
    "qnn_conv2d",
    "requantize",
    "half_dense",
)

_MODULE = st.fixed_dictionaries(
    {
        "shape": FUZZ_SHAPE,
        "seed": st.integers(0, 2**31 - 1),
        "steps": st.lists(fuzz_step(KINDS), min_size=1, max_size=8),
        "let": st.booleans(),
        "policy": st.sampled_from(POLICIES),
    }
)


def _qnn_tail(acc: relay.Expr, scale: float) -> relay.Expr:
    """int32 accumulator -> requantize to int8 -> dequantize to float32."""
    s, z = relay.const(np.float32(scale)), relay.const(0)
    r = relay.qnn.op.requantize(
        acc, relay.const(np.float32(scale * scale)), z, s, z, out_dtype="int8"
    )
    return relay.qnn.op.dequantize(r, s, z)


def build(spec: dict, *, annotate: bool) -> tvm.IRModule:
    """The module of ``spec``, with its annotations or (``annotate=False``) without."""
    rows, cols = spec["shape"]
    rng = np.random.default_rng(spec["seed"])
    nonempty = rows * cols > 0

    def const(shape, scale=2.0) -> relay.Expr:
        return relay.const((rng.standard_normal(shape) * scale).astype("float32"))

    x = relay.var("x", shape=(rows, cols), dtype="float32")
    pool: List[relay.Expr] = [const((rows, cols)), x, const((rows, cols))]
    outputs = []
    s, z = relay.const(np.float32(0.05)), relay.const(0)
    for kind, first, second, wrap in spec["steps"]:
        a, b = pool[first % len(pool)], pool[second % len(pool)]
        if kind == "unary":
            value = UNARY[second % len(UNARY)](a)
        elif kind == "binary":
            value = BINARY[second % len(BINARY)](a, b)
        elif kind == "dense":
            value = relay.nn.dense(a, const((cols, cols), 0.5))
        elif kind == "conv2d" and nonempty:
            image = relay.reshape(a, (1, 1, rows, cols))
            value = relay.reshape(
                relay.nn.conv2d(image, const((1, 1, 1, 1)), kernel_size=(1, 1)), (rows, cols)
            )
        elif kind == "reshape" and nonempty:
            value = relay.reshape(relay.reshape(a, (rows * cols,)), (rows, cols))
        elif kind == "transpose":
            value = relay.transpose(relay.transpose(a, (1, 0)), (1, 0))
        elif kind == "concat_split":
            both = relay.concatenate([a, b], axis=1)
            value = relay.TupleGetItem(relay.split(both, 2, axis=1).astuple(), 0)
        elif kind == "creation":
            which = second % 3
            value = (
                relay.zeros((rows, cols), "float32")
                if which == 0
                else relay.ones((rows, cols), "float32")
                if which == 1
                else relay.full(relay.const(np.float32(1.5)), (rows, cols), "float32")
            )
        elif kind in ("qdq", "qdq_axis"):
            per_axis = kind == "qdq_axis"
            scale = relay.const(np.full((cols,), 0.05, "float32")) if per_axis else s
            zero = relay.const(np.zeros((cols,), "int32")) if per_axis else z
            axis = 1 if per_axis else -1
            q = relay.qnn.op.quantize(a, scale, zero, axis=axis, out_dtype="int8")
            value = relay.qnn.op.dequantize(q, scale, zero, axis=axis)
        elif kind == "qnn_dense" and nonempty:
            q = relay.qnn.op.quantize(a, s, z, out_dtype="int8")
            w = relay.qnn.op.quantize(const((cols, cols), 0.5), s, z, out_dtype="int8")
            value = _qnn_tail(relay.qnn.op.dense(q, w, z, z, s, s, units=cols), 0.05)
        elif kind == "qnn_conv2d" and nonempty:
            q = relay.qnn.op.quantize(relay.reshape(a, (1, 1, rows, cols)), s, z, out_dtype="int8")
            w = relay.qnn.op.quantize(const((1, 1, 1, 1), 0.5), s, z, out_dtype="int8")
            acc = relay.qnn.op.conv2d(q, w, z, z, s, s, kernel_size=(1, 1), channels=1)
            value = relay.reshape(_qnn_tail(acc, 0.05), (rows, cols))
        elif kind == "requantize":
            stored = relay.const(rng.integers(-127, 128, (rows, cols)).astype("int8"))
            s2 = relay.const(np.float32(0.15))
            if second % 2:  # the chain as three ops, as an ONNX import gives it
                w1 = relay.qnn.op.dequantize(stored, s, z)
                w2 = relay.qnn.op.quantize(w1, s2, z, out_dtype="int8")
            else:  # in one op, as FakeQuantizationToInteger gives it
                w2 = relay.qnn.op.requantize(stored, s, z, s2, z, out_dtype="int8")
            value = relay.add(a, relay.qnn.op.dequantize(w2, s2, z))
        elif kind == "half_dense":
            half = relay.const(rng.standard_normal((cols, cols)).astype("float16"))
            value = relay.nn.dense(a, relay.cast(half, "float32"))
        else:
            value = relay.negative(a)
        outputs.append(value)
        if annotate and wrap == "allow":
            value = fgr.fold_allow(value)
            outputs.append(value)
        elif annotate and wrap == "barrier":
            value = fgr.fold_barrier(value)
            outputs.append(value)
        pool.append(value)
    mod = relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.Tuple(outputs)))
    )
    return relay.transform.ToANormalForm()(mod) if spec["let"] else mod


@pytest.mark.slow
@fuzz_settings(EXAMPLES)
@given(_MODULE)
def test_fuzzed_relay_modules(spec):
    check_fuzzed(RELAY, build(spec, annotate=False), build(spec, annotate=True), spec)
