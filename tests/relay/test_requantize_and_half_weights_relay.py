"""Requantize chains and float16 weights on Relay, as on Relax (RFC.md, Frontends).

Relay's ONNX importer gives a requantize chain as ``qnn.dequantize -> qnn.quantize ->
qnn.dequantize``; after ``FakeQuantizationToInteger`` it is one ``qnn.requantize`` of the int8
constant feeding ``qnn.conv2d`` / ``qnn.dense``. Under the QDQ policies both fold into one int8
constant at the last scale (the core's ``fold-requantize-chain`` and
``fold-requantize-of-constant``), ``keep-requantize`` composed first keeps them, and ``default``
keeps every QNN op as stock does. Relay's TFLite importer gives float16 weights as
``cast(<float16 constant>)``: the same rule as on Relax keeps the cast. Relay's TFLite importer
also fails on int8 weights behind DEQUANTIZE, the same bug as Relax's (a canary below); fold_guard
ships the override for Relax only.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import tflite
import tvm
from _common import onnx_chains, onnx_models, tflite_weights
from relay_ir import op_calls
from tvm import relay

import fold_guard.relay as fgr

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")


@pytest.fixture(scope="module")
def chain_model():
    return onnx_chains.make_requantize_chain_model(0, per_channel=False)


@pytest.fixture(scope="module")
def chain_mod(chain_model) -> tvm.IRModule:
    return onnx_models.import_relay(chain_model)


@pytest.fixture(scope="module")
def fq2i_mod(chain_mod) -> tvm.IRModule:
    return relay.transform.FakeQuantizationToInteger()(chain_mod)


def constant_operands(mod: tvm.IRModule, op_name: str, index: int = 0) -> List[np.ndarray]:
    return [
        call.args[index].data.numpy()
        for call in op_calls(mod["main"], op_name)
        if isinstance(call.args[index], relay.Constant)
    ]


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_an_imported_chain_folds_to_numpys_int8_weight(chain_model, chain_mod, policy):
    folded = fgr.FoldConstant(policy)(chain_mod)
    int8 = [c for c in constant_operands(folded, "qnn.dequantize") if c.dtype == np.int8]
    want = onnx_chains.chain_weights(chain_model)
    assert len(int8) == 2
    np.testing.assert_array_equal(int8[0], want["conv.weight"])
    np.testing.assert_array_equal(int8[1], want["fc.weight"])
    assert constant_operands(folded, "qnn.quantize") == []


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_keep_requantize_keeps_the_imported_chains(chain_mod, policy):
    folded = fgr.FoldConstant(["keep-requantize", policy])(chain_mod)
    tvm.ir.assert_structural_equal(folded, relay.transform.FoldConstant()(chain_mod))
    assert len(op_calls(folded["main"], "qnn.quantize")) == len(
        op_calls(chain_mod["main"], "qnn.quantize")
    )


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_fq2i_requantize_of_a_weight_folds_to_the_int8_weight_stock_computes(fq2i_mod, policy):
    """``qnn.conv2d(x, qnn.requantize(<int8 W>))``: the requantize folds, bit for bit as
    ``FoldConstant(fold_qnn=True)`` evaluates it, and the quantized ops keep int8 weights."""
    assert len(constant_operands(fq2i_mod, "qnn.requantize")) == 2
    folded = fgr.FoldConstant(policy)(fq2i_mod)
    assert constant_operands(folded, "qnn.requantize") == []
    ours = constant_operands(folded, "qnn.conv2d", 1) + constant_operands(folded, "qnn.dense", 1)
    stock = relay.transform.FoldConstant(fold_qnn=True)(fq2i_mod)
    theirs = constant_operands(stock, "qnn.conv2d", 1) + constant_operands(stock, "qnn.dense", 1)
    assert [a.dtype.name for a in ours] == ["int8", "int8"]
    assert [a.tobytes() for a in ours] == [b.tobytes() for b in theirs]


def test_fq2i_requantize_stays_under_keep_requantize_and_default(fq2i_mod):
    for policy in (["keep-requantize", "qdq-accelerator"], "default"):
        folded = fgr.FoldConstant(policy)(fq2i_mod)
        assert len(constant_operands(folded, "qnn.requantize")) == 2, policy


def test_default_is_stock_on_the_chain(chain_mod, fq2i_mod):
    for mod in (chain_mod, fq2i_mod):
        tvm.ir.assert_structural_equal(fgr.FoldConstant()(mod), relay.transform.FoldConstant()(mod))


# float16 weights through Relay's TFLite importer ---------------------------------------------


def import_tflite(buffer: bytes) -> tvm.IRModule:
    mod, params = relay.frontend.from_tflite(
        tflite.Model.GetRootAsModel(buffer, 0),
        shape_dict={tflite_weights.INPUT_NAME: tflite_weights.INPUT_SHAPE},
        dtype_dict={tflite_weights.INPUT_NAME: "float32"},
    )
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
    return relay.transform.InferType()(mod)


@pytest.fixture(scope="module")
def half_mod() -> tvm.IRModule:
    model = tflite_weights.make_weight_form_model("float16-dequantize", seed=0)
    return import_tflite(model.buffer)


@pytest.mark.parametrize("policy", ("keep-low-precision-weights",) + QDQ_POLICIES)
def test_float16_weights_and_biases_keep_their_cast(half_mod, policy):
    folded = fgr.FoldConstant(policy)(half_mod)
    assert [c.dtype.name for c in constant_operands(folded, "cast")] == ["float16"] * 6


def test_default_folds_the_casts_as_stock_does(half_mod):
    folded = fgr.FoldConstant()(half_mod)
    tvm.ir.assert_structural_equal(folded, relay.transform.FoldConstant()(half_mod))
    assert op_calls(folded["main"], "cast") == []


@pytest.mark.stock
def test_relays_tflite_importer_fails_on_int8_weights_behind_dequantize():
    model = tflite_weights.make_weight_form_model("int8-dequantize", seed=0)
    with pytest.raises(KeyError, match="conv/weight_int8"):
        import_tflite(model.buffer)


@pytest.mark.slow
def test_every_version_runs_to_the_unfolded_output(chain_model, chain_mod, fq2i_mod, half_mod):
    """Folded under each policy, each module computes its unfolded output bit for bit."""
    x = np.random.default_rng(1).standard_normal(onnx_chains.INPUT_SHAPE).astype(np.float32)
    h = np.random.default_rng(2).standard_normal(tflite_weights.INPUT_SHAPE).astype(np.float32)
    cases: Dict[str, tuple] = {
        "chain": (chain_mod, x, QDQ_POLICIES + ("keep-requantize",)),
        "fq2i": (fq2i_mod, x, QDQ_POLICIES),
        "half": (half_mod, h, ("keep-low-precision-weights", "keep-qdq-weights")),
    }
    for name, (mod, data, policies) in cases.items():
        unfolded = onnx_models.run_relay(mod, [data])[0]
        for policy in policies:
            out = onnx_models.run_relay(fgr.FoldConstant(policy)(mod), [data])[0]
            assert out.tobytes() == unfolded.tobytes(), (name, policy)
    reference = onnx_models.run_onnxruntime(chain_model, {onnx_chains.INPUT_NAME: x})[0]
    chain_out = onnx_models.run_relay(chain_mod, [x])[0]
    assert np.abs(chain_out - reference).max() <= onnx_chains.OUTPUT_SCALE * 1.001
