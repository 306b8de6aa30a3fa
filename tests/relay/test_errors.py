"""Guarantee 6 on Relay: bad input gets a clear fold_guard error naming the offending expression,
and the caller's module is never half-changed (compared with a ``tvm.ir.save_json`` copy taken
before the call).

Each case asserts the exception class, that the message names what is wrong (the op, the
function, the variable or the policy), and that the input module is byte-for-byte what it was.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import tvm
from tvm import relax, relay, te

import fold_guard
import fold_guard.relay as fgr
from fold_guard import Action, Reason

SHAPE = (2, 3)
A = np.arange(6, dtype="float32").reshape(SHAPE)
B = np.full(SHAPE, 2.0, dtype="float32")


def _module(params: list[relay.Var], body: relay.Expr, *, typed: bool = True) -> tvm.IRModule:
    mod = tvm.IRModule.from_expr(relay.Function(params, body))
    return relay.transform.InferType()(mod) if typed else mod


def _x(shape=SHAPE) -> relay.Var:
    return relay.var("x", shape=shape, dtype="float32")


def assert_input_unchanged(mod: tvm.IRModule, saved: str) -> None:
    """Guarantee 4: the caller's module is structurally what its ``save_json`` copy was.

    Structural equality ignores TVM's cached ``checked_type_`` fields; that the pass leaves even
    those alone (the module byte-for-byte unchanged) is checked once, in
    ``test_annotations.py::test_input_is_byte_for_byte_unchanged``, so that a type-cache rewrite
    shows up there and not as a failure of every golden test.
    """
    tvm.ir.assert_structural_equal(mod, tvm.ir.load_json(saved), map_free_vars=True)


class _Unchanged:
    """``with _Unchanged(mod):`` asserts that the block leaves ``mod`` exactly as it was."""

    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self.saved = tvm.ir.save_json(mod)

    def __enter__(self) -> _Unchanged:
        return self

    def __exit__(self, *exc: object) -> bool:
        assert_input_unchanged(self.mod, self.saved)
        return False


def _entries() -> list[Callable[[tvm.IRModule], object]]:
    """Every way a module reaches fold_guard: the functional API, the planner and the Pass."""
    return [fgr.fold, fgr.plan, fgr.FoldConstant()]


# ------------------------------------------------------------------ annotating a non-expression


@pytest.mark.parametrize("builder", [fgr.fold_barrier, fgr.fold_allow], ids=["barrier", "allow"])
@pytest.mark.parametrize(
    "operand, type_name", [(A, "ndarray"), (3, "int"), ("x", "str")], ids=["numpy", "int", "str"]
)
def test_annotating_a_non_expression(builder, operand, type_name):
    op_name = builder.__name__
    with pytest.raises(
        fold_guard.UnsupportedIRError,
        match=rf"{op_name} expects a Relay expression, got {type_name}",
    ) as info:
        builder(operand)
    assert isinstance(info.value, TypeError)
    assert "relay.const(" in str(info.value)  # the hint for NumPy data


# ------------------------------------------------------------------------------ not an IRModule


def _function() -> relay.Function:
    x = _x()
    return relay.Function([x], relay.add(x, relay.const(A)))


@pytest.mark.parametrize(
    "obj, type_name",
    [
        (_function(), "Function"),
        ("def @main() { 0 }", "str"),
        (None, "NoneType"),
        (relay.const(A), "Constant"),
    ],
    ids=["relay.Function", "str", "None", "Constant"],
)
@pytest.mark.parametrize("entry", ["fold", "plan"])
def test_not_an_irmodule(obj, type_name, entry):
    call = fgr.fold if entry == "fold" else fgr.plan
    with pytest.raises(
        fold_guard.UnsupportedIRError, match=f"expects a tvm.IRModule, got {type_name}"
    ) as info:
        call(obj)
    assert "fold_function" in str(info.value)  # the hint for a lone function
    assert isinstance(info.value, TypeError)


def test_not_an_irmodule_through_the_pass():
    """The Pass form never reaches fold_guard: TVM's RunPass rejects the argument itself (a TVMError)."""
    with pytest.raises(tvm.TVMError, match="IRModule"):
        fgr.FoldConstant()(_function())


@pytest.mark.parametrize(
    "obj",
    [tvm.IRModule.from_expr(_function()), relay.const(A), None],
    ids=["IRModule", "Constant", "None"],
)
def test_fold_function_wants_a_function(obj):
    with pytest.raises(
        fold_guard.UnsupportedIRError,
        match=rf"fold_function expects a relay.Function, got {type(obj).__name__}",
    ):
        fgr.fold_function(obj)


# ------------------------------------------------------------------------------ unknown policy


def _foldable() -> tvm.IRModule:
    x = _x()
    return _module([x], relay.add(x, relay.add(relay.const(A), relay.const(B))))


def test_unknown_policy_lists_known_names():
    mod = _foldable()
    with _Unchanged(mod):
        for call in (
            lambda: fgr.fold(mod, policy="fold-everything"),
            lambda: fgr.plan(mod, "fold-everything"),
        ):
            with pytest.raises(fold_guard.UnknownPolicyError, match="'fold-everything'") as info:
                call()
            message = str(info.value)
            for known in ("default", "fold-qnn"):
                assert known in message, f"{known} missing from {message!r}"
            assert "register_policy" in message  # the hint


def test_unknown_policy_raises_when_the_pass_is_made():
    """Before any module is seen, so a pipeline with a typo fails at construction."""
    with pytest.raises(fold_guard.UnknownPolicyError, match="'fold_qnn'") as info:
        fgr.FoldConstant("fold_qnn")  # the stock keyword, not our policy name
    assert "fold-qnn" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_fold_function_unknown_policy():
    with pytest.raises(fold_guard.UnknownPolicyError, match="'npu'"):
        fgr.fold_function(_foldable()["main"], policy="npu")


# ----------------------------------------------------------------------------- wrong IR


def _relax_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorStructInfo(SHAPE, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("encoder", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.op.add(relax.const(A), relax.const(B))))
        bb.emit_func_output(y)
    return bb.get()


def test_relax_module_is_refused_by_name():
    """TVM 0.16 has Relax too; a Relax function is named, and the hint points to fold_guard.relax."""
    mod = _relax_module()
    with _Unchanged(mod):
        for entry in _entries():
            with pytest.raises(
                fold_guard.UnsupportedIRError, match=r"function encoder is a tvm\.relax.*Function"
            ) as info:
                entry(mod)
            assert "fold_guard.relax" in str(info.value)


def test_mixed_relay_and_relax_module_is_refused_whole():
    """One Relax function makes the module unreadable; nothing in it is folded half-way."""
    mixed = _relax_module()
    mixed["main"] = _foldable()["main"]
    with _Unchanged(mixed), pytest.raises(fold_guard.UnsupportedIRError, match="function encoder"):
        fgr.fold(mixed)


def test_tir_functions_beside_relay_are_left_alone():
    """Not an error: stock folds the Relay functions and ignores PrimFuncs; so do we."""
    a = te.placeholder(SHAPE, name="a")
    doubled = te.compute(SHAPE, lambda i, j: a[i, j] * 2.0, name="doubled")
    prim = te.create_prim_func([a, doubled])
    mod = relay.transform.InferType()(tvm.IRModule({"main": _foldable()["main"], "double": prim}))
    with _Unchanged(mod):
        ours = fgr.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(ours, relay.transform.FoldConstant()(mod), map_free_vars=True)
    assert ours["double"].same_as(prim)


# -------------------------------------------------------------------- strict and fold_allow


def _allow_over_runtime() -> tvm.IRModule:
    x = _x()
    kept = relay.multiply(x, relay.const(A))  # not constant: x is a run-time input
    return _module([x], relay.add(fgr.fold_allow(kept), relay.const(B)))


def test_strict_allow_that_cannot_fold():
    mod = _allow_over_runtime()
    with _Unchanged(mod):
        for entry in (lambda m: fgr.fold(m, strict=True), fgr.FoldConstant(strict=True)):
            with pytest.raises(
                fold_guard.FoldNotPossibleError, match=r"function main: %\d+ = fold_allow"
            ) as info:
                entry(mod)
            assert "not constant" in str(info.value)
            assert isinstance(info.value, RuntimeError)


def test_lenient_allow_that_cannot_fold_is_reported():
    """The same module without strict: nothing changes, and the plan says why."""
    mod = _allow_over_runtime()
    with _Unchanged(mod):
        result = fgr.fold(mod)
    assert not result.modified
    tvm.ir.assert_structural_equal(result.mod, mod, map_free_vars=True)
    (allow,) = [d for d in result.plan.decisions if d.op == "fold_allow"]
    assert allow.action is Action.KEEP and allow.reason is Reason.NOT_CONSTANT
    assert "not constant" in result.plan.explain()


def test_strict_fold_function_names_the_function():
    func = _allow_over_runtime()["main"].with_attr("Compiler", "my_npu")
    with pytest.raises(fold_guard.FoldNotPossibleError, match="fold_allow"):
        fgr.fold_function(func, strict=True)


# ------------------------------------------------------------------ modules that do not type-check


def _ill_typed() -> tvm.IRModule:
    """add of (2, 3) and (4, 5): no broadcast exists. Built untyped, since InferType would raise."""
    x = _x()
    return _module(
        [x],
        relay.add(x, relay.add(relay.const(A), relay.const(np.ones((4, 5), "float32")))),
        typed=False,
    )


def test_ill_typed_module_is_a_precondition_error():
    mod = _ill_typed()
    with _Unchanged(mod):
        for entry in _entries():
            with pytest.raises(fold_guard.PreconditionError, match="does not type-check") as info:
                entry(mod)
            message = str(info.value)
            assert "[4, 5]" in message or "(4, 5)" in message, message  # names the offending type
            assert "InferType" in message  # the hint


def test_untyped_but_valid_module_is_typed_by_the_pass():
    """No precondition on the caller: the pass runs InferType itself, as stock FoldConstant does."""
    x = _x()
    untyped = _module([x], relay.add(x, relay.add(relay.const(A), relay.const(B))), typed=False)
    with _Unchanged(untyped):
        ours = fgr.FoldConstant()(untyped)
    expected = _module([x], relay.add(x, relay.const(A + B)))
    tvm.ir.assert_structural_equal(ours, expected, map_free_vars=True)


# --------------------------------------------------------------------------- dynamic shapes


def _allow_over_dynamic_input() -> tvm.IRModule:
    """x has shape (?, 3): the allowed subgraph reads a value only known at run time."""
    x = relay.var("x", shape=(relay.Any(), 3), dtype="float32")
    row = relay.const(np.arange(3, dtype="float32"))
    return _module([x], relay.multiply(fgr.fold_allow(relay.add(x, row)), relay.const(2.0)))


def test_strict_allow_over_dynamic_shape():
    mod = _allow_over_dynamic_input()
    with (
        _Unchanged(mod),
        pytest.raises(
            fold_guard.FoldNotPossibleError, match=r"fold_allow\(\.\.\.\) cannot fold"
        ) as info,
    ):
        fgr.fold(mod, strict=True)
    assert "not constant" in str(info.value) or "dynamic shape" in str(info.value)


def test_lenient_allow_over_dynamic_shape_keeps_everything():
    mod = _allow_over_dynamic_input()
    with _Unchanged(mod):
        result = fgr.fold(mod)
    tvm.ir.assert_structural_equal(result.mod, mod, map_free_vars=True)
    assert all(d.action is Action.KEEP for d in result.plan.decisions)


def test_allowed_constant_subgraph_with_dynamic_intermediate_shape_folds():
    """Not an error: dyn.reshape of constants has type (?, ?) but all its inputs are constants.

    Stock folds it (the interpreter evaluates shape functions); so must the allow, under strict.
    y = x + allow(dyn.reshape(A, [3, 2] + [0, 0]))  ==>  y = x + <A reshaped to (3, 2)>
    """
    x = _x((3, 2))
    new_shape = relay.add(
        relay.const(np.array([3, 2], "int64")), relay.const(np.array([0, 0], "int64"))
    )
    reshaped = relay.reshape(relay.const(A), new_shape)
    assert reshaped.op.name == "dyn.reshape"
    before = _module([x], relay.add(x, fgr.fold_allow(reshaped)))
    expected = _module([x], relay.add(x, relay.const(A.reshape(3, 2))))
    with _Unchanged(before):
        ours = fgr.FoldConstant(strict=True)(before)
    tvm.ir.assert_structural_equal(ours, expected, map_free_vars=True)
    unannotated = _module([x], relay.add(x, reshaped))
    tvm.ir.assert_structural_equal(
        relay.transform.FoldConstant()(unannotated), expected, map_free_vars=True
    )


# ------------------------------------------------------------------------ conflicting annotations


def test_conflicting_annotations_name_both_ops():
    x = _x()
    mod = _module(
        [x],
        relay.add(x, fgr.fold_allow(fgr.fold_barrier(relay.add(relay.const(A), relay.const(B))))),
    )
    with _Unchanged(mod):
        for entry in _entries():
            with pytest.raises(
                fold_guard.ConflictingAnnotationsError,
                match=r"fold_allow\(%\d+\) where %\d+ = fold_barrier",
            ):
                entry(mod)


# --------------------------------------------------------------------------- functions=[...]


def test_functions_naming_a_missing_function():
    mod = _foldable()
    with _Unchanged(mod):
        for entry in (
            lambda m: fgr.fold(m, functions=["encoder"]),
            fgr.FoldConstant(functions=["encoder"]),
        ):
            with pytest.raises(fold_guard.PreconditionError, match="'encoder'") as info:
                entry(mod)
            assert "main" in str(info.value)  # lists the functions that do exist
