"""The catalogue of bad and unusual input on Relay (RFC.md, guarantee 6), one parametrised test.

As ``tests/relax/test_bad_input_catalogue.py``: each kind raises a fold_guard error of the
stated class whose message names the offending expression or argument, or (valid but unusual
input) folds as the stock pass folds it; the caller's module is byte-for-byte unchanged. The
kinds both IRs share are :func:`support.ir_harness.common_kinds`; this file adds Relay's own.
RFC.md ("Errors and bad input") has it as a condensed table.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import pytest
import tvm
from harness_relay import RELAY, copy
from relay_ir import op_calls
from support.ir_harness import Kind, check_kind, common_kinds, exp_module, like_stock
from tvm import relax, relay

import fold_guard
import fold_guard.relay as fgr

A = RELAY.catalogue_constant
SHAPE = A.shape


def _x(shape=SHAPE, dtype="float32") -> relay.Var:
    return relay.var("x", shape=shape, dtype=dtype)


_module = RELAY.module


def _exp_module() -> tvm.IRModule:
    return exp_module(RELAY)


def _relax_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorStructInfo(SHAPE, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("encoder", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(A)))
        bb.emit_func_output(y)
    return bb.get()


def _ill_typed() -> tvm.IRModule:
    return _module(
        lambda x: relay.add(x, relay.add(relay.const(A), relay.const(np.ones((4, 5), "float32"))))
    )


def _tuple_annotation(annotate) -> tvm.IRModule:
    x = _x((2, 1))
    parts = relay.split(relay.const(A[:, :2]), 2, axis=1).astuple()
    return tvm.IRModule.from_expr(
        relay.Function([x], relay.add(x, relay.TupleGetItem(annotate(parts), 0)))
    )


def _dynamic_allow() -> tvm.IRModule:
    x = relay.var("x", shape=(relay.Any(), 3), dtype="float32")
    return tvm.IRModule.from_expr(
        relay.Function(
            [x], relay.multiply(fgr.fold_allow(relay.add(x, relay.const(A[0]))), relay.const(2.0))
        )
    )


def _primitive_module() -> tvm.IRModule:
    p = _x()
    mod = tvm.IRModule()
    mod["fused"] = relay.Function([p], relay.add(p, relay.exp(relay.const(A)))).with_attr(
        "Primitive", tvm.tir.IntImm("int32", 1)
    )
    mod["main"] = _exp_module()["main"]
    return mod


def _qnn_nonfinite_module() -> tvm.IRModule:
    w = relay.const(np.array([[np.nan, 1e30, -np.inf], [1, 2, 3]], "float32"))
    q = relay.qnn.op.quantize(w, relay.const(0.5), relay.const(0), out_dtype="int8")
    return _module(
        lambda x: relay.add(
            x, relay.qnn.op.dequantize(fgr.fold_allow(q), relay.const(0.5), relay.const(0))
        )
    )


def _like_stock_fold_qnn(result, mod) -> None:
    """The allowed ``qnn.quantize`` of NaN / huge values folds to the bits ``fold_qnn=True`` gives."""
    (quantize,) = op_calls(copy(mod), "qnn.quantize")
    alone = tvm.IRModule.from_expr(relay.Function([], quantize))
    want = relay.transform.FoldConstant(fold_qnn=True)(relay.transform.InferType()(alone))[
        "main"
    ].body
    (dequantize,) = op_calls(result.mod, "qnn.dequantize")
    np.testing.assert_array_equal(dequantize.args[0].data.numpy(), want.data.numpy())


FOLD = lambda mod: fgr.fold(mod)  # noqa: E731
STRICT = lambda mod: fgr.fold(mod, strict=True)  # noqa: E731

#: Relay's own kinds; :func:`common_kinds` adds those both IRs have (not a module, unknown
#: policy, annotating a non-expression, nested annotations, NaN, every dtype, the policies).
KINDS: Dict[str, Kind] = {
    # not a module at all, or not Relay
    "fold-function-of-a-module": Kind(
        _exp_module,
        fgr.fold_function,
        fold_guard.UnsupportedIRError,
        r"fold_function expects a relay.Function, got IRModule",
    ),
    "relax-module": Kind(
        _relax_module,
        FOLD,
        fold_guard.UnsupportedIRError,
        r"function encoder is a tvm\.relax.*Function.*fold_guard.relax",
    ),
    "does-not-type-check": Kind(
        _ill_typed,
        FOLD,
        fold_guard.PreconditionError,
        r"(?s)does not type-check.*(\[4, 5\]|\(4, 5\)).*InferType",
    ),
    # functions=
    "functions-names-a-missing-function": Kind(
        _exp_module,
        lambda m: fgr.fold(m, functions=["encoder"]),
        fold_guard.PreconditionError,
        r"functions names 'encoder'.*: main",
    ),
    "functions-of-wrong-type": Kind(
        _exp_module,
        lambda m: fgr.FoldConstant(functions=[3])(m),
        fold_guard.PreconditionError,
        r"functions must name global functions by string, got int 3",
    ),
    "functions-as-one-string": Kind(
        _exp_module, lambda m: fgr.fold(m, functions="main"), check=like_stock(RELAY)
    ),
    "primitive-function": Kind(_primitive_module, FOLD, check=like_stock(RELAY)),
    # policies
    "misspelt-policy": Kind(
        _exp_module,
        lambda m: fgr.fold(m, policy="fold_qnn"),
        fold_guard.UnknownPolicyError,
        r"'fold_qnn'; did you mean 'fold-qnn'\?",
    ),
    "misspelt-policy-in-pass": Kind(
        _exp_module,
        lambda m: fgr.FoldConstant("qdq-acclerator")(m),
        fold_guard.UnknownPolicyError,
        r"did you mean 'qdq-accelerator'\?",
    ),
    "policy-of-wrong-type": Kind(
        _exp_module,
        lambda m: fgr.plan(m, 3.5),
        fold_guard.PreconditionError,
        r"policy must be .*, got 3.5",
    ),
    "annotate-with-wrong-params": Kind(
        _exp_module,
        lambda m: fgr.annotate(m, params={"w": np.ones(2, "float32")}),
        fold_guard.PreconditionError,
        r"params \['w'\] are not parameters of main",
    ),
    # annotations
    "conflicting-annotations": Kind(
        lambda: _module(
            lambda x: relay.add(x, fgr.fold_allow(fgr.fold_barrier(relay.exp(relay.const(A)))))
        ),
        FOLD,
        fold_guard.ConflictingAnnotationsError,
        r"conflicting annotations in main: %\d+ = fold_allow\(%\d+\) where %\d+ = fold_barrier",
    ),
    "barrier-over-tuple": Kind(
        lambda: _tuple_annotation(fgr.fold_barrier),
        FOLD,
        fold_guard.UnsupportedIRError,
        r"function main: %\d+ = fold_barrier annotates tensors only, but its operand is a TupleType",
    ),
    "allow-over-tuple": Kind(
        lambda: _tuple_annotation(fgr.fold_allow),
        lambda m: fgr.FoldConstant()(m),
        fold_guard.UnsupportedIRError,
        r"function main: %\d+ = fold_allow annotates tensors only",
    ),
    "annotate-a-literal-tuple": Kind(
        lambda: relay.Tuple([relay.const(A)]),
        fgr.fold_barrier,
        fold_guard.UnsupportedIRError,
        r"fold_barrier annotates tensors only, got a relay.Tuple of 1 fields",
    ),
    # strict
    "allow-over-non-constant-strict": Kind(
        lambda: _module(lambda x: fgr.fold_allow(relay.exp(x))),
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: %\d+ = fold_allow\(\.\.\.\) cannot fold: not constant: input %\d+ is not constant",
    ),
    "allow-over-dynamic-shape-strict": Kind(
        _dynamic_allow,
        STRICT,
        fold_guard.FoldNotPossibleError,
        r"function main: %\d+ = fold_allow\(\.\.\.\) cannot fold: not constant: input %\d+ is not constant",
    ),
    # unusual but valid
    "qnn-quantize-of-nan-and-huge": Kind(_qnn_nonfinite_module, STRICT, check=_like_stock_fold_qnn),
}
KINDS.update(common_kinds(RELAY))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_input(kind):
    check_kind(KINDS[kind])
