"""Relay: releasing the barriers right before a partitioner, and partitioning with nothing folding.

RFC.md, guarantee 3 (barriers hold up to a backend's partitioner), guarantee 4 (the input is
never changed). The partitioner is Arm Compute Library's own ``partition_for_arm_compute_lib``
(pure Python: pattern matching and partitioning need no device) on a quantized NHWC conv as
``FakeQuantizationToInteger`` leaves it, and a QDQ table on a dense whose weight ``annotate``
guards.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from relay_ir import op_calls
from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard
from tvm.relay.op.contrib import arm_compute_lib

import fold_guard
import fold_guard.relay as fgr

RNG = np.random.default_rng(3)
W_FLOAT = RNG.uniform(-1, 1, (4, 3, 3, 3)).astype("float32")  # OHWI
W_INT8 = RNG.integers(-100, 100, (4, 4)).astype("int8")
W_INT8_CONV = RNG.integers(-100, 100, (4, 3, 3, 3)).astype("int8")  # OHWI


def qnn_conv(weight: relay.Expr) -> tvm.IRModule:
    """requantize(bias_add(qnn.conv2d(x: int8 NHWC, weight: OHWI))), s8 per-tensor, as ACL takes it."""
    x = relay.var("x", shape=(1, 8, 8, 3), dtype="int8")
    conv = relay.qnn.op.conv2d(
        x,
        weight,
        relay.const(0),
        relay.const(0),
        relay.const(0.05),
        relay.const(0.01),
        kernel_size=(3, 3),
        channels=4,
        padding=(1, 1),
        data_layout="NHWC",
        kernel_layout="OHWI",
        out_dtype="int32",
    )
    biased = relay.nn.bias_add(conv, relay.const(np.arange(4, dtype="int32")), axis=3)
    out = relay.qnn.op.requantize(
        biased,
        relay.const(0.0005),
        relay.const(0),
        relay.const(0.1),
        relay.const(0),
        out_dtype="int8",
    )
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def float_weight_conv() -> tvm.IRModule:
    """The weight as FQ2I leaves it: qnn.quantize(<fp32 const>)."""
    weight = relay.qnn.op.quantize(
        relay.const(W_FLOAT), relay.const(0.01), relay.const(0), out_dtype="int8"
    )
    return qnn_conv(weight)


def dequantized_dense(weight: relay.Expr) -> tvm.IRModule:
    x = relay.var("x", shape=(1, 4), dtype="float32")
    w = relay.qnn.op.dequantize(weight, relay.const(0.5), relay.const(0))
    return relay.transform.InferType()(
        tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w)))
    )


def acl_offloaded_int8(mod: tvm.IRModule) -> int:
    """qnn.conv2d calls inside ACL's functions whose weight is an int8 constant."""
    count = 0
    for gvar in mod.get_global_vars():
        attrs = mod[gvar].attrs
        if attrs is not None and "Compiler" in attrs.keys():
            for call in op_calls(mod[gvar], "qnn.conv2d"):
                weight = call.args[1]
                count += isinstance(weight, relay.Constant) and str(weight.data.dtype) == "int8"
    return count


# -------------------------------------------------------------------------------- release


def test_release_puts_the_constant_into_its_user():
    """qnn.dequantize(fold_barrier(<int8 W>)) ==> qnn.dequantize(<int8 W>)"""
    const = relay.const(W_INT8)
    before = dequantized_dense(fgr.fold_barrier(const))
    saved = tvm.ir.save_json(before)
    tvm.ir.assert_structural_equal(fgr.release_barriers(before), dequantized_dense(const))
    tvm.ir.assert_structural_equal(fgr.ReleaseBarriers()(before), dequantized_dense(const))
    assert tvm.ir.save_json(before) == saved  # RFC.md, guarantee 4


def test_release_of_a_barrier_on_a_parameter():
    """add(fold_barrier(%x), %x) ==> add(%x, %x)"""
    x = relay.var("x", shape=(4,), dtype="float32")
    guarded = tvm.IRModule.from_expr(relay.Function([x], relay.add(fgr.fold_barrier(x), x)))
    expected = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, x)))
    tvm.ir.assert_structural_equal(
        fgr.release_barriers(guarded), relay.transform.InferType()(expected)
    )


def test_release_of_a_module_without_barriers_is_unchanged():
    mod = dequantized_dense(relay.const(W_INT8))
    tvm.ir.assert_structural_equal(fgr.release_barriers(mod), mod)


# -------------------------------------------------------------------------------- partition


def test_acl_offloads_after_annotate_what_it_offloads_after_fold():
    """
    qnn.conv2d(x, qnn.quantize(<fp32 W>))  stock FoldConstant, ACL  ==>  0 offloaded (no constant)
      annotate, stock FoldConstant, partition(ACL)                   ==>  1, int8 weight; the same
                                                                          module as ACL after fold
    """
    mod = float_weight_conv()
    stock = relay.transform.FoldConstant()(mod)
    assert acl_offloaded_int8(arm_compute_lib.partition_for_arm_compute_lib(stock)) == 0
    piped = relay.transform.FoldConstant()(fgr.annotate(mod, policy="qdq-accelerator").mod)
    result = fgr.partition(piped, arm_compute_lib.partition_for_arm_compute_lib)
    # hhb's partition_for_arm_compute_lib runs a FoldConstant inside its passes: skipped
    assert acl_offloaded_int8(result.mod) == 1 and set(result.skipped) <= {"FoldConstant"}
    folded = fgr.fold(mod, policy="qdq-accelerator").mod
    tvm.ir.assert_structural_equal(
        result.mod, arm_compute_lib.partition_for_arm_compute_lib(folded)
    )


def _qdense_table(mod: tvm.IRModule) -> tvm.IRModule:
    """A partitioner that folds first, as ``partition_for_ethosn`` does (``fold_qnn=True``)."""
    weight = is_op("qnn.dequantize")(is_constant(), is_constant(), is_constant())
    pattern = is_op("nn.dense")(wildcard(), weight)
    mod = relay.transform.FoldConstant(fold_qnn=True)(mod)
    return relay.transform.MergeComposite([("npu.qdense", pattern)])(mod)


def test_partition_skips_the_partitioners_fold_and_binds_the_int8_weight():
    """
    dense(x, qnn.dequantize(fold_barrier(<int8 W>)))  partition(fold_qnn, MergeComposite)
      ==>  the composite holds qnn.dequantize(<int8 W>): the module MergeComposite alone gives
    """
    annotated = dequantized_dense(fgr.fold_barrier(relay.const(W_INT8)))
    result = fgr.partition(annotated, _qdense_table)
    assert (result.released, result.released_constants, result.skipped) == (1, 1, ("FoldConstant",))
    weight = is_op("qnn.dequantize")(is_constant(), is_constant(), is_constant())
    expected = relay.transform.MergeComposite(
        [("npu.qdense", is_op("nn.dense")(wildcard(), weight))]
    )(dequantized_dense(relay.const(W_INT8)))
    tvm.ir.assert_structural_equal(result.mod, expected)
    # without partition's skip, the partitioner's fold_qnn=True turns the weight into fp32
    unguarded = _qdense_table(fgr.release_barriers(annotated))
    assert not op_calls(unguarded["main"], "qnn.dequantize")


def test_partition_catches_a_fold_in_a_pass_context_of_its_own():
    annotated = dequantized_dense(fgr.fold_barrier(relay.const(W_INT8)))
    saved = tvm.ir.save_json(annotated)

    def folds_in_own_context(mod: tvm.IRModule) -> tvm.IRModule:
        with tvm.transform.PassContext(opt_level=3):  # as legalize_qnn_for_dnnl does
            return _qdense_table(mod)

    with pytest.raises(
        fold_guard.PreconditionError, match=r"1 of 1 released constants .* int8\[4, 4\]"
    ):
        fgr.partition(annotated, folds_in_own_context)
    assert tvm.ir.save_json(annotated) == saved


# ------------------------------------------------------------ examples/relay_intree_tables.py


def test_table_script_counts_what_each_flow_lets_acl_offload():
    """The script's row for one quantized conv: stock 0, fold and annotate + partition 1, int8."""
    import relay_intree_tables  # examples/ is on the test path (pyproject: pythonpath)

    flows = relay_intree_tables.Flows(float_weight_conv())
    partitioner, compiler = relay_intree_tables.TABLES["arm_compute_lib"]
    row = relay_intree_tables.run_flows(flows, partitioner, compiler)
    assert row == {"of": 1, "stock": (0, 0), "fold": (1, 1), "annotate": (1, 1), "released": 0}


def test_bias_add_from_add_restores_the_bias_add_both_tables_match():
    """add(qnn.conv2d(...), <int32 (1, 1, 1, 4)>)  ==>  nn.bias_add(qnn.conv2d(...), <int32 (4)>, axis=3)"""
    import relay_intree_tables

    expected = qnn_conv(relay.const(W_INT8_CONV))
    body = expected["main"].body  # requantize(bias_add(conv, b), ...)
    bias_add = body.args[0]
    as_add = relay.add(
        bias_add.args[0], relay.const(bias_add.args[1].data.numpy().reshape(1, 1, 1, 4))
    )
    x = expected["main"].params[0]
    rewritten = relay.qnn.op.requantize(as_add, *body.args[1:], out_dtype="int8")
    before = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], rewritten)))
    tvm.ir.assert_structural_equal(relay_intree_tables.bias_add_from_add(before), expected)


def _qnn_dense_plus(bias: np.ndarray, *, as_bias_add: bool = False) -> tvm.IRModule:
    """requantize(add(qnn.dense(x, <int8 (4, 4)>), <bias>)), or with ``nn.bias_add(axis=1)``."""
    x = relay.var("x", shape=(2, 4), dtype="int8")
    dense = relay.qnn.op.dense(
        x,
        relay.const(W_INT8),
        relay.const(0),
        relay.const(0),
        relay.const(0.5),
        relay.const(0.25),
        units=4,
        out_dtype="int32",
    )
    if as_bias_add:
        biased = relay.nn.bias_add(dense, relay.const(bias), axis=1)
    else:
        biased = relay.add(dense, relay.const(bias))
    out = relay.qnn.op.requantize(
        biased,
        relay.const(0.125),
        relay.const(0),
        relay.const(0.5),
        relay.const(0),
        out_dtype="int8",
    )
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


@pytest.mark.parametrize("bias_shape", [(4,), (1, 4)])
def test_bias_add_from_add_restores_a_dense_bias(bias_shape):
    """add(qnn.dense(...), <int32 (4,) or (1, 4)>)  ==>  nn.bias_add(qnn.dense(...), <int32 (4)>, axis=1)"""
    import relay_intree_tables

    bias = np.arange(4, dtype="int32")
    before = _qnn_dense_plus(bias.reshape(bias_shape))
    expected = _qnn_dense_plus(bias, as_bias_add=True)
    tvm.ir.assert_structural_equal(relay_intree_tables.bias_add_from_add(before), expected)


def test_bias_add_from_add_leaves_an_addend_that_is_not_a_bias():
    """A (2, 4) addend differs per row: it is not a bias, and the add stays."""
    import relay_intree_tables

    before = _qnn_dense_plus(np.arange(8, dtype="int32").reshape(2, 4))
    tvm.ir.assert_structural_equal(relay_intree_tables.bias_add_from_add(before), before)
