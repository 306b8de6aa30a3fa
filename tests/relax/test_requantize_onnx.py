"""An ONNX QDQ model whose weights arrive through requantize chains, imported with ``from_onnx``.

``_common.onnx_chains``: a conv weight (per channel) and a matmul weight (per tensor), each
stored as int8 at scale s1 and requantized to s2 in the graph (DQ -> Q -> DQ). Under the QDQ
policies each chain folds to one int8 constant at s2, equal to NumPy's requantization, behind
the last dequantize; ``keep-requantize`` composed first keeps the chains; every version runs to
the unfolded import's output bit for bit, and that is onnxruntime's within one output step.
"""

from __future__ import annotations

from typing import List

import numpy as np
import pytest
import tvm
from _common import onnx_chains, onnx_models
from build_once import run_mains
from golden import CONSTANT_TYPE, op_calls
from tvm import relax

import fold_guard.relax as fgr

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")


@pytest.fixture(scope="module")
def model():
    return onnx_chains.make_requantize_chain_model(0)


@pytest.fixture(scope="module")
def mod(model) -> tvm.IRModule:
    return onnx_models.import_relax(model)


def integer_constant_dequantizes(mod: tvm.IRModule) -> List[np.ndarray]:
    return [
        call.args[0].value.numpy()
        for call in op_calls(mod, "relax.dequantize")
        if isinstance(call.args[0], CONSTANT_TYPE)
    ]


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_each_chain_folds_to_numpys_int8_weight_behind_one_dequantize(model, mod, policy):
    folded = fgr.FoldConstant(policy)(mod)
    constants = integer_constant_dequantizes(folded)
    int8 = [c for c in constants if c.dtype == np.int8]
    assert [c.dtype.name for c in constants].count("int32") == 1  # the conv bias
    want = onnx_chains.chain_weights(model)
    assert len(int8) == 2
    np.testing.assert_array_equal(int8[0], want["conv.weight"])
    np.testing.assert_array_equal(int8[1], want["fc.weight"])
    # no quantize of a constant is left: every quantize reads an activation
    assert all(
        not isinstance(call.args[0], CONSTANT_TYPE) for call in op_calls(folded, "relax.quantize")
    )


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_keep_requantize_keeps_both_chains(mod, policy):
    folded = fgr.FoldConstant(["keep-requantize", policy])(mod)
    stored = [c for c in integer_constant_dequantizes(folded) if c.dtype == np.int8]
    assert len(stored) == 2  # the first dequantize of each chain, on the stored int8 weight
    # each chain's quantize and last dequantize are still there, on its first dequantize
    assert len(op_calls(folded, "relax.quantize")) == len(op_calls(mod, "relax.quantize"))


def test_default_is_stock(mod):
    folded = fgr.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(mod))
    assert integer_constant_dequantizes(folded) == []


@pytest.mark.slow
def test_every_version_runs_bit_identical_and_within_a_step_of_onnxruntime(model, mod):
    x = np.random.default_rng(1).standard_normal(onnx_chains.INPUT_SHAPE).astype(np.float32)
    mods = {"unfolded": mod, "default": fgr.FoldConstant()(mod)}
    for policy in QDQ_POLICIES + ("keep-requantize",):
        mods[policy] = fgr.FoldConstant(policy)(mod)
        mods[f"annotated {policy}"] = fgr.annotate(mod, policy=policy).mod
    outputs = run_mains(mods, x)
    for key, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), key
    reference = onnx_models.run_onnxruntime(model, {onnx_chains.INPUT_NAME: x})[0]
    assert np.abs(outputs["unfolded"] - reference).max() <= onnx_chains.OUTPUT_SCALE * 1.001
