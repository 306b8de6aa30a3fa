"""Folded values that nothing needs any more are dropped during evaluation, and only those.

    e = exp(C); n = negative(e); y = x + n      ==>  e's value is dropped once n has its own;
                                                     the module is stock's
    e also returned / in a tuple / matched / captured by a branch / read by a kept call
                                                ==>  e's value stays (the rewrite needs it)

The values dropped are the intermediate constants of a chain (a model's int8 weights between
quantize and dequantize), so they need not all stay alive until the rewrite.

White-box on purpose: it tests the fast engine's early release of values (``_engine.fast``), a
private mechanism.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard.relax as fgr
from fold_guard import Reason
from fold_guard.relax._engine.fast import FastEngine

C = np.linspace(-1, 1, 4, dtype="float32")


def _values_after_fold(monkeypatch, mod: tvm.IRModule) -> Dict[str, bool]:
    """Fold ``mod``; per folded call's label, whether its value was still held at the end."""
    seen: List[dict] = []
    evaluate = FastEngine.evaluate

    def spy(engine, plan, values, **kwargs):
        seen.append(values)
        return evaluate(engine, plan, values, **kwargs)

    monkeypatch.setattr(FastEngine, "evaluate", spy)
    result = fgr.fold(mod, kernel_cache=False)
    assert tvm_ffi.structural_equal(result.mod, relax.transform.FoldConstant()(mod)), (
        result.mod.script()
    )
    values = seen[-1]
    return {d.label: d.node in values for d in result.plan.decisions if d.reason is Reason.FOLDED}


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            y = R.add(x, n)
            R.output(y)
        return y


def test_a_value_read_only_by_folded_calls_is_dropped(monkeypatch) -> None:
    assert _values_after_fold(monkeypatch, Chain) == {"e": False, "n": True}


@I.ir_module
class ReadAtTwoLevels:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(R.const(C))
            b = R.negative(e)
            c = R.abs(b)
            d = R.add(e, c)  # reads e two levels after b does
            y = R.add(x, d)
            R.output(y)
        return y


def test_a_value_read_at_two_levels_is_dropped_after_the_last(monkeypatch) -> None:
    """b's own value is gone by the time d runs: e still counts b as having read it."""
    held = _values_after_fold(monkeypatch, ReadAtTwoLevels)
    assert held == {"e": False, "b": False, "c": False, "d": True}


@I.ir_module
class Returned:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            y = R.add(x, n)
            R.output(e, y)
        return (e, y)


@I.ir_module
class InATuple:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            t = (e, x)
            y = R.add(t[1], n)
            R.output(y)
        return y


@I.ir_module
class MatchCast:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            m = R.match_cast(e, R.Tensor((4,), "float32"))
            y = R.add(m, n)
            R.output(y)
        return y


@I.ir_module
class CapturedByABranch:
    @R.function
    def main(x: R.Tensor((4,), "float32"), c: R.Tensor((), "bool")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            R.output(e, n)
        if c:
            y = R.add(x, e)
        else:
            y = R.add(x, n)
        return y


@I.ir_module
class ReadByAKeptCall:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            e = R.exp(R.const(C))
            n = R.negative(e)
            k = R.add(x, e)
            y = R.add(k, n)
            R.output(y)
        return y


@pytest.mark.parametrize(
    "mod",
    [Returned, InATuple, MatchCast, CapturedByABranch, ReadByAKeptCall],
    ids=["returned", "in_a_tuple", "match_cast", "captured_by_a_branch", "read_by_a_kept_call"],
)
def test_a_value_used_outside_folded_calls_stays(monkeypatch, mod) -> None:
    held = _values_after_fold(monkeypatch, mod)
    assert held["e"], held


def test_a_second_round_computes_dropped_values_again(monkeypatch) -> None:
    """e is dropped once n has its value; the failing take sends the fold round again.

    In the second round e has no value, so it is evaluated again (values are never read from a
    dropped entry), and everything but the take is folded as stock folds it.
    """
    table = np.arange(8, dtype="float32").reshape(2, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(relax.const(C)))
            n = bb.emit(relax.op.negative(e))
            bad = bb.emit(relax.op.take(relax.const(table), relax.const(np.array([5], "int64")), 0))
            y = bb.emit(relax.op.add(x, n))
            out = bb.emit_output(relax.Tuple([y, bad]))
        bb.emit_func_output(out)
    mod = bb.get()
    calls: List[int] = []
    evaluate = FastEngine.evaluate

    def counting(engine, plan, *args, **kwargs):
        calls.append(len(plan.folded))
        return evaluate(engine, plan, *args, **kwargs)

    monkeypatch.setattr(FastEngine, "evaluate", counting)
    result = fgr.fold(mod, kernel_cache=False)
    assert len(calls) == 2  # the take failed: a second round
    assert [d.reason for d in result.plan.decisions] == [
        Reason.FOLDED,
        Reason.FOLDED,
        Reason.EVAL_FAILED,
        Reason.NOT_CONSTANT,
    ]
    expected = relax.transform.FoldConstant()(mod)
    # stock folds what its kernel read past the table; fold_guard keeps the take (RFC.md): the
    # rest is the same
    assert "R.take" in result.mod.script()
    assert tvm_ffi.structural_equal(
        result.mod["main"].body.blocks[0].bindings[-2].value,
        expected["main"].body.blocks[0].bindings[-2].value,
    )
