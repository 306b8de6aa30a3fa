"""A scalar folded earlier in the same pass, as the stock decision sees it (issue 33, item 1).

The stock pass legalizes a call with its scalar operands as constants, values included; for a
scalar fold_guard has not evaluated yet the decision used to see zero, so ``divide`` raised
"Divide by zero" and Gelu's expanded body folded less than stock::

    lv = sqrt(2.0)          folds
    lv1 = divide(c, lv)     ==> folds too, as in stock (the divisor is 1.414, not 0)
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fold_guard
import fold_guard.relax as fgr

C = np.arange(3, dtype="float32")


def _module(root: float) -> tvm.IRModule:
    @I.ir_module
    class Module:
        @R.function
        def main() -> R.Tensor((3,), "float32"):
            with R.dataflow():
                lv = R.sqrt(R.const(root, "float32"))  # folds
                lv1 = R.divide(R.const(C), lv)  # folds on the value lv has
                R.output(lv1)
            return lv1

    return Module


@pytest.mark.parametrize("reference", [False, True])
def test_divide_by_a_scalar_folded_before_folds_like_stock(reference: bool) -> None:
    mod = _module(2.0)
    result = fgr.fold(mod, reference_engine=reference)
    tvm.ir.assert_structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    assert [d.reason for d in result.plan.decisions] == [fold_guard.Reason.FOLDED] * 2


@pytest.mark.parametrize("reference", [False, True])
def test_divide_by_a_scalar_folded_to_zero_is_kept_where_stock_raises(reference: bool) -> None:
    mod = _module(0.0)
    with pytest.raises(Exception, match="Divide by zero"):
        relax.transform.FoldConstant()(mod)
    result = fgr.fold(mod, reference_engine=reference)
    divide = result.plan.decisions[1]
    assert divide.reason is fold_guard.Reason.EVAL_FAILED, result.plan.explain()
    assert "Divide by zero" in divide.detail and "stock raises" in divide.detail
    assert [c.op.name for c in _calls(result.mod)] == ["relax.divide"]


def _calls(mod: tvm.IRModule) -> list:
    return [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
