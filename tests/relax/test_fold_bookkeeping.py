"""The bookkeeping a fold does around TVM gives the answers it gave before it was made cheap.

A warm fold (every kernel cached) spends its time reading TVM objects: the per-fold memo of type
facts, identity keys for Relax variables and call attributes read on first use must not change
what a fold reads or leaves behind (RFC.md, guarantees 1 and 4; the corpus checks the folded
output itself); and a fold leaves the process's garbage collector alone.

White-box on purpose: it tests translation's bookkeeping (``_translate``, ``_compat``), a private
mechanism.
"""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import tvm
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Action, FoldPolicy, Rule, UnsupportedIRError
from fold_guard.relax import _compat, _translate


def _module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.exp(relax.const(np.ones((2, 3), "float32"))))
            s = bb.emit(relax.op.sum(w, axis=[1], keepdims=True))
            y = bb.emit_output(relax.op.add(x, s))
        bb.emit_func_output(y)
    return bb.get()


def test_type_facts_are_the_same_inside_and_outside_the_memo():
    ty = relax.TensorType((4, tvm.tirx.Var("n", "int64"), 1), "int8")
    outside = (_compat.static_shape(ty), _compat.dtype_of(ty))
    with _compat.remembering_types():
        first = (_compat.static_shape(ty), _compat.dtype_of(ty))
        again = (_compat.static_shape(ty), _compat.dtype_of(ty))
        with _compat.remembering_types():  # nested: the same memo
            nested = (_compat.static_shape(ty), _compat.dtype_of(ty))
    assert outside == first == again == nested == ((4, None, 1), "int8")
    assert _compat.static_shape(relax.TensorType(ndim=2, dtype="float32")) is None
    assert _compat.static_shape(relax.ShapeType([2, 3])) is None


def test_memo_is_dropped_after_the_block():
    with _compat.remembering_types():
        assert _compat._TYPE_MEMO.get() is not None
    assert _compat._TYPE_MEMO.get() is None


def test_remembered_reads_once_per_object_and_fact():
    reads = []
    ty = relax.TensorType((2,), "float32")
    with _compat.remembering_types():
        for _ in range(3):
            _compat.remembered(ty, "probe", lambda t: reads.append(t) or len(reads))
        # another wrapper of the same object (a field read gives a new one) hits the memo too
        const = relax.const(np.zeros(2, "float32"))
        assert _compat.remembered(const.ty, "probe2", lambda t: "a") == "a"
        assert _compat.remembered(const.ty, "probe2", lambda t: "b") == "a"
    assert len(reads) == 1
    # outside a block nothing is remembered
    assert _compat.remembered(ty, "probe", lambda t: "fresh") == "fresh"


def test_handle_identifies_the_object_not_the_wrapper():
    mod = _module()
    bindings = mod["main"].body.blocks[0].bindings
    w_var, s_call = bindings[0].var, bindings[1].value
    assert s_call.args[0] is not w_var
    assert _compat.handle(s_call.args[0]) == _compat.handle(w_var)
    assert _compat.handle(bindings[1].var) != _compat.handle(w_var)


def test_call_attributes_read_late_equal_read_early():
    mod = _module()
    translation = _translate.analyse(mod, "default").translation
    nodes = translation.nodes
    sum_node = next(node for node in nodes if node.op == "relax.sum")
    eager = _compat.read_attrs(translation.sites[sum_node.id].call.attrs)
    assert eager["keepdims"] is True and eager["axis"] == (1,)
    assert dict(sum_node.attrs) == eager
    assert sum_node.attrs == eager and len(sum_node.attrs) == len(eager)
    assert sum_node.attrs["keepdims"] is True
    assert repr(sum_node.attrs) == repr(eager)
    assert pickle.loads(pickle.dumps(sum_node.attrs)) == eager
    exp_node = next(node for node in nodes if node.op == "relax.exp")
    assert dict(exp_node.attrs) == {}


@pytest.mark.parametrize("enabled", [True, False])
def test_fold_leaves_the_garbage_collector_alone(enabled):
    """The collector is never switched, not even while the fold runs (other threads share it)."""
    seen = []
    watching = FoldPolicy(
        "watch-gc",
        "notes the collector's state",
        (Rule("watch", Action.FOLD, "", lambda call: seen.append(gc.isenabled()) is None),),
    )
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        result = fgr.fold(_module(), policy=watching, kernel_cache=False)
        assert gc.isenabled() is enabled
        fgr.plan(_module(), policy=watching)
        assert gc.isenabled() is enabled
        with pytest.raises(UnsupportedIRError):
            fgr.fold("not a module")  # type: ignore[arg-type]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and set(seen) == {enabled}
    assert [d.reason.text for d in result.plan.decisions] == ["folded", "folded", "not constant"]
