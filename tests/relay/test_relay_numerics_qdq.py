"""The QDQ CNN with int8 weights through Relay: policy ``fold-qnn`` against stock ``fold_qnn=True``.

Guarantees 1 and 2 on a real quantized model rather than a builder-made one:

- the import (``relay.frontend.from_onnx``, params bound) keeps ONNX's QDQ form, each weight and
  bias a ``qnn.dequantize(<int8 / int32 const>)``: ``fold-qnn`` folds those 10 calls into fp32
  constants exactly as stock ``FoldConstant(fold_qnn=True)`` does (structurally equal, hence
  bit-identical constants), and the built module gives bit-identical outputs before and after;
- after ``FakeQuantizationToInteger`` the int8 weights are plain constants under ``qnn.conv2d`` /
  ``qnn.dense``: no QNN op is all-constant, so both passes leave the module as it is.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

import numpy as np
import pytest
import tvm
from _common import onnx_models
from relay_ir import op_calls
from tvm import relay

import fold_guard.relay as fgr

#: In the import: one dequantize per weight and per bias of the 4 convolutions and the classifier.
CONSTANT_DEQUANTIZES = 10


# Every test here imports, builds or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def _calls(mod: tvm.IRModule) -> List[relay.Call]:
    return op_calls(mod["main"])


def constant_qnn_calls(mod: tvm.IRModule) -> Dict[str, int]:
    """QNN calls whose arguments are all constants (what fold_qnn=True evaluates)."""
    return dict(
        Counter(
            call.op.name
            for call in _calls(mod)
            if call.op.name.startswith("qnn.")
            and all(isinstance(arg, relay.Constant) for arg in call.args)
        )
    )


def qnn_counts(mod: tvm.IRModule) -> Dict[str, int]:
    return dict(Counter(call.op.name for call in _calls(mod) if call.op.name.startswith("qnn.")))


def assert_equal(actual: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(actual, expected, map_free_vars=True)


class _Model:
    def __init__(self) -> None:
        self.onnx = onnx_models.make_qdq_cnn(0)
        self.imported = onnx_models.import_relay(self.onnx)
        self.fq2i = relay.transform.InferType()(
            relay.transform.FakeQuantizationToInteger()(self.imported)
        )


@pytest.fixture(scope="module")
def model() -> _Model:
    return _Model()


@pytest.fixture(scope="module")
def folded_import(model: _Model) -> tvm.IRModule:
    return fgr.FoldConstant("fold-qnn")(model.imported)


def test_fold_qnn_on_the_import_equals_stock(model: _Model, folded_import: tvm.IRModule) -> None:
    assert constant_qnn_calls(model.imported) == {"qnn.dequantize": CONSTANT_DEQUANTIZES}
    stock = relay.transform.FoldConstant(fold_qnn=True)(model.imported)
    assert_equal(folded_import, stock)
    assert constant_qnn_calls(folded_import) == {}
    before, after = qnn_counts(model.imported), qnn_counts(folded_import)
    assert after == {**before, "qnn.dequantize": before["qnn.dequantize"] - CONSTANT_DEQUANTIZES}


def test_default_on_the_import_keeps_every_qnn_op_like_stock(model: _Model) -> None:
    assert_equal(fgr.FoldConstant()(model.imported), relay.transform.FoldConstant()(model.imported))
    assert constant_qnn_calls(fgr.FoldConstant()(model.imported)) == {
        "qnn.dequantize": CONSTANT_DEQUANTIZES
    }


@pytest.mark.parametrize("policy", ["default", "fold-qnn"])
def test_after_fq2i_nothing_is_left_to_fold(model: _Model, policy: str) -> None:
    assert constant_qnn_calls(model.fq2i) == {}
    stock = relay.transform.FoldConstant(fold_qnn=policy == "fold-qnn")(model.fq2i)
    result = fgr.FoldConstant(policy)(model.fq2i)
    assert_equal(result, stock)
    assert_equal(result, model.fq2i)


@pytest.mark.slow
def test_folded_import_runs_bit_identically(model: _Model, folded_import: tvm.IRModule) -> None:
    feed = onnx_models.sample_input()
    before = onnx_models.run_relay(model.imported, feed)[0]
    after = onnx_models.run_relay(folded_import, feed)[0]
    np.testing.assert_array_equal(after, before)
    expected = onnx_models.run_onnxruntime(model.onnx, feed)[0]
    np.testing.assert_allclose(after, expected, rtol=0, atol=onnx_models.output_atol(model.onnx))
