"""Hostile inputs found by review: each is refused untouched, folds as stock, or names its culprit.

    relax.Function([x], add(x, exp(c)))      (no BlockBuilder)  ==>  PreconditionError, untouched
    x: (0, 4);  sum(exp(x))                                      ==>  0.0, as stock folds it
    FoldPolicy subclass: decide -> (FOLD, None) / "fold"        ==>  PolicyRuleError naming it

(The NaN bits of a kernel shared between shapes: ``test_engines.py``.)
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Action, CallView, FoldPolicy, PolicyRuleError, PreconditionError, Rule


def _unnormalized() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    body = relax.op.add(x, relax.op.exp(relax.const(np.ones(2, "float32"))))
    return tvm.IRModule({"main": relax.Function([x], body, relax.TensorType((2,), "float32"))})


@pytest.mark.parametrize("entry", ["fold", "pass", "plan", "annotate"])
def test_a_function_built_without_a_block_builder_is_refused_untouched(entry) -> None:
    mod = _unnormalized()
    before = tvm.ir.save_json(mod)
    run = {
        "fold": lambda: fgr.fold(mod),
        "pass": lambda: fgr.FoldConstant()(mod),
        "plan": lambda: fgr.plan(mod),
        "annotate": lambda: fgr.annotate(mod),
    }[entry]
    with pytest.raises(PreconditionError, match=r"main: its result = relax.add.*Normalize"):
        run()
    assert tvm.ir.save_json(mod) == before


def test_a_zero_size_parameter_folds_a_reduction_as_stock_does() -> None:
    """exp(x) reads x and stays; sum over its zero elements legalizes to full(0): it folds."""
    mod = _zero_size_module()
    result = fgr.fold(mod)
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    assert [d.reason.text for d in result.plan.decisions] == ["not constant", "folded"]


def _zero_size_module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((0, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x))
            s = bb.emit_output(relax.op.sum(e))
        bb.emit_func_output(s)
    return bb.get()


class _WrongAnswer(FoldPolicy):
    def __init__(self, answer: object) -> None:
        super().__init__("wrong-answer", "decide returns something else", ())
        object.__setattr__(self, "_answer", answer)

    def decide(self, call: CallView) -> Optional[Tuple[Action, Rule]]:
        return self._answer  # type: ignore[return-value]


@pytest.mark.parametrize("answer", [(Action.FOLD, None), "fold", Action.KEEP, (Action.FOLD,)])
def test_a_policy_whose_decide_answers_wrongly_is_named(answer) -> None:
    mod = _exp_plus_x()
    before = tvm.ir.save_json(mod)
    with pytest.raises(
        PolicyRuleError, match=re.escape("policy 'wrong-answer' (_WrongAnswer.decide)")
    ):
        fgr.fold(mod, policy=_WrongAnswer(answer))
    assert tvm.ir.save_json(mod) == before


def _exp_plus_x() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(relax.const(np.ones(2, "float32"))))
            y = bb.emit_output(relax.op.add(x, e))
        bb.emit_func_output(y)
    return bb.get()
