"""The real-architecture builders of bench/real_models.py still build, import and fold like stock.

At a tiny width (every channel count divided by 8) so the test is quick; the layer structure
(and so the number of folded calls) is the full model's. Every builder is checked for its layer
count, one model end to end against stock; the benchmark itself checks all ten full-size
models and forms against stock on every run.

    float graph --quantize_static--> QDQ ONNX --from_onnx--> Relax --fold(default)--> == stock
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common.onnx_models import import_relax
from tvm import relax

import fold_guard.relax as fgr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models

TINY = 8

#: Weight layers of each architecture: Conv / Gemm on a weight, embedding Gather (BERT's word,
#: position and token-type tables). The same at every width.
LAYERS = {
    "resnet50": 54,
    "mobilenet_v2": 53,
    "efficientnet_b0": 82,
    "vit_small": 74,
    "bert_tiny": 16,
}


@pytest.mark.parametrize("name", sorted(real_models.MODELS))
def test_float_model_has_the_architecture_layers(name):
    model = real_models.build_float(name, scale=TINY)  # onnx.checker ran inside
    assert real_models.model_stats(model)["layers"] == LAYERS[name]


@pytest.mark.slow
def test_quantized_model_folds_like_stock():
    """BERT-tiny with fp32 weights feeding QuantizeLinear: embeddings, layer norms, attention.

    The model with the fewest folded calls (100): the stock pass costs about 0.1 s per call, so
    even MobileNetV2 (212) takes over 20 s on a loaded machine; the benchmark checks all of them.
    """
    name = "bert_tiny"
    mod = import_relax(real_models.build_quantized(name, "float_weights", scale=TINY))
    result = fgr.fold(mod, policy="default", strict=True)
    assert len(result.plan.folded) > LAYERS[name]  # every weight, and more (biases, reshapes)
    tvm.ir.assert_structural_equal(result.mod, relax.transform.FoldConstant()(mod))
