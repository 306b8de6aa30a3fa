"""What stock normalizes in passing, fold_guard normalizes too (RFC.md, guarantee 1).

Relax's ONNX importer binds ``nonzero`` (Compress, NonZero) with the call nested in the match
cast. The stock pass's mutator gives the call a binding of its own::

    lv = match_cast(nonzero(c), R.Tensor((2, n)))   ==>   lv1 = nonzero(c)
                                                          lv = match_cast(lv1, R.Tensor((2, n)))

and folds a nested call that can fold (``match_cast(exp(c), ...)`` becomes a match cast of a
constant). fold_guard's output is structurally equal to stock's, by both engines, and the input
module is not changed.

White-box on purpose: it tests translation's normalization (``_translate.normalize``), a private
mechanism.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Reason
from fold_guard.relax._translate.normalize import hoist_match_cast_values


def _nested(make_call, ty) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            cast = bb.match_cast(make_call(), ty)  # the call stays nested, as the importer has it
            gv = bb.emit_output(relax.op.add(cast, cast))
        bb.emit_func_output(gv)
    return bb.get()


N = tvm.tirx.Var("n", "int64")
NESTED = {
    # stock cannot fold nonzero (its result shape depends on the data): only the normalization
    "nonzero": (
        lambda: relax.op.nonzero(relax.const(np.array([[1, 0], [0, 3]], "int64"))),
        relax.TensorType((2, N), "int64"),
    ),
    # a nested call stock folds: the match cast reads the constant
    "exp": (
        lambda: relax.op.exp(relax.const(np.arange(3, dtype="float32"))),
        relax.TensorType((N,), "float32"),
    ),
}


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("name", sorted(NESTED))
def test_a_call_nested_in_a_match_cast_is_normalized_and_folded_as_in_stock(name, reference):
    mod = _nested(*NESTED[name])
    before = mod.script(show_meta=True)
    (cast,) = mod["main"].body.blocks[0].bindings[:1]
    assert isinstance(cast, relax.MatchCast) and isinstance(cast.value, relax.Call)
    stock = relax.transform.FoldConstant()(mod)
    result = fgr.fold(mod, reference_engine=reference)
    assert tvm_ffi.structural_equal(result.mod, stock), result.mod.script()
    assert result.modified
    assert mod.script(show_meta=True) == before  # the input is untouched
    expected = Reason.FOLDED if name == "exp" else Reason.UNSUPPORTED
    assert result.plan.decisions[0].reason is expected, result.plan.explain()


def test_a_module_without_a_nested_call_is_not_rebuilt():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            cast = bb.match_cast(x, relax.TensorType((N,), "float32"))
            gv = bb.emit_output(relax.op.add(cast, cast))
        bb.emit_func_output(gv)
    mod = bb.get()
    assert hoist_match_cast_values(mod) is mod  # no copy of a module that needs none
    assert not fgr.fold(mod).modified
