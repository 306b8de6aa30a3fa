"""``max_fold_bytes``: an absolute budget that refuses, from the types and before allocating, any
fold whose results would be larger; it outranks ``fold_allow``, and ``default`` without a budget
keeps stock's behaviour.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
import tvm
from golden import op_calls
from tvm import relax

import fold_guard
import fold_guard.relax as fgr
from fold_guard import Reason

#: float32[32768, 32768]: a 4 GiB broadcast of one scalar, which the stock pass would allocate
HUGE = (1 << 15, 1 << 15)
HUGE_BYTES = 4 * HUGE[0] * HUGE[1]


def _broadcast_module(*, allow: bool) -> tvm.IRModule:
    """``main(x) = add(x, broadcast_to(2.0, HUGE))`` (optionally inside fold_allow), plus a small
    ``exp`` that does fold, so the budget is seen to refuse one call, not the module."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(HUGE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            big = bb.emit(relax.op.broadcast_to(relax.const(np.float32(2.0)), HUGE))
            if allow:
                big = bb.emit(fgr.fold_allow(big))
            small = bb.emit(relax.op.exp(relax.const(np.ones(4, "float32"))))
            y = bb.emit_output(relax.op.add(relax.op.add(x, big), relax.op.sum(small)))
        bb.emit_func_output(y)
    return bb.get()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.parametrize("allow", [False, True], ids=["default", "fold_allow"])
@pytest.mark.parametrize(
    "entry",
    [
        lambda mod: fgr.fold(mod, max_fold_bytes=1 << 20),
        lambda mod: fgr.fold(mod, policy=["default", fold_guard.memory_budget(1 << 20)]),
    ],
    ids=["option", "policy"],
)
def test_multi_gib_fold_is_refused_in_milliseconds(entry, allow):
    """A 4 GiB broadcast is refused ("over budget") before anything is allocated, even inside
    fold_allow, while the small exp still folds; peak memory does not grow by the fold."""
    mod = _broadcast_module(allow=allow)
    peak_before = _peak_rss_bytes()
    start = time.perf_counter()
    result = entry(mod)
    seconds = time.perf_counter() - start
    (big,) = [d for d in result.plan.decisions if d.op == "relax.broadcast_to"]
    assert big.reason is Reason.OVER_BUDGET and big.rule == "max_fold_bytes"
    assert f"would take {HUGE_BYTES} bytes, more than max_fold_bytes=1048576" in big.detail
    assert {d.op: d.reason for d in result.plan.decisions}["relax.exp"] is Reason.FOLDED
    assert len(op_calls(result.mod, "relax.broadcast_to")) == 1
    if allow:
        (allow_decision,) = [d for d in result.plan.decisions if d.op == "relax.fold_allow"]
        assert allow_decision.reason is Reason.OVER_BUDGET
        assert len(op_calls(result.mod, "relax.fold_allow")) == 1
    assert seconds < 2.0, f"refusing took {seconds:.2f} s"
    assert _peak_rss_bytes() - peak_before < 256 << 20


def test_strict_allow_over_budget_raises():
    mod = _broadcast_module(allow=True)
    with pytest.raises(
        fold_guard.FoldNotPossibleError, match=r"fold_allow\(\.\.\.\) cannot fold: over budget"
    ):
        fgr.fold(mod, strict=True, max_fold_bytes=1 << 20)


def test_budget_through_the_pass_and_plan_and_the_tighter_budget_wins():
    mod = _broadcast_module(allow=False)
    plan = fgr.plan(mod, fold_guard.memory_budget(HUGE_BYTES * 2), max_fold_bytes=1 << 20)
    assert {d.op: d.reason for d in plan.decisions}["relax.broadcast_to"] is Reason.OVER_BUDGET
    assert plan.policy_name == f"max-fold-bytes-{HUGE_BYTES * 2}"
    folded = fgr.FoldConstant(max_fold_bytes=1 << 20)(mod)
    assert len(op_calls(folded, "relax.broadcast_to")) == 1 and not op_calls(folded, "relax.exp")


def test_a_budget_that_fits_changes_nothing():
    """Under a budget the calls fit in, the result is the stock pass's (the budget only refuses)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            b = bb.emit(relax.op.broadcast_to(relax.const(np.float32(2.0)), (64,)))
            y = bb.emit_output(relax.op.add(x, b))
        bb.emit_func_output(y)
    mod = bb.get()
    tvm.ir.assert_structural_equal(
        fgr.fold(mod, max_fold_bytes=256).mod, relax.transform.FoldConstant()(mod)
    )
    assert {d.op: d.reason for d in fgr.plan(mod, max_fold_bytes=255).decisions}[
        "relax.broadcast_to"
    ] is Reason.OVER_BUDGET


@pytest.mark.parametrize("bad", [-1, 1.5, "1G", True])
def test_a_malformed_budget_is_refused(bad):
    with pytest.raises(fold_guard.PreconditionError, match=r"max_fold_bytes must be a byte count"):
        fgr.FoldConstant(max_fold_bytes=bad)
    with pytest.raises(fold_guard.PreconditionError, match=r"max_fold_bytes must be a byte count"):
        fold_guard.memory_budget(bad)
