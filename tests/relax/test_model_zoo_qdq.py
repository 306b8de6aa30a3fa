"""The residual CNN and the transformer block of :mod:`_common.onnx_models` on Relax.

For each model: the same seed gives the same bytes; ``from_onnx(..., keep_params_in_input=False)``
turns every weight into ``R.dequantize(<int8 constant>)`` (``R.quantize(<fp32 constant>)`` with
``float_weights=True``), exactly as many as the float model has weights; stock
``relax.transform.FoldConstant`` folds every one of them away (the behaviour fold_guard exists to
control); and the imported module, built for the CPU, matches onnxruntime.

Expected counts come from the models themselves: the weights from :func:`weight_shapes` of the
float model, the other quantized constants (biases, ``LayerNormalization`` parameters, the
attention scale) from the ``DequantizeLinear`` / ``QuantizeLinear`` nodes on initializers in the
QDQ model, one Relax call each. The checks the Relay zoo makes too are in
:mod:`support.ir_harness`.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import onnxruntime  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from golden import constant_operands
from harness_relax import RELAX
from support import ir_harness as harness
from tvm import relax

# Every test here builds, imports or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


#: The model (seed 0) and its import, built once per module.
model_for = functools.partial(harness.zoo_model, RELAX)


@pytest.fixture(scope="module", autouse=True)
def _drop_cache():
    yield
    harness.zoo_model.cache_clear()


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_same_seed_gives_the_same_bytes(name: str) -> None:
    make, make_float = harness.zoo_builders(name)
    first = model_for(name).onnx.SerializeToString()
    assert make(0).SerializeToString() == first
    assert make(1).SerializeToString() != first
    assert make_float(0).SerializeToString() == model_for(name).float_model.SerializeToString()
    assert (
        make(0, float_weights=True).SerializeToString()
        == model_for(name, True).onnx.SerializeToString()
    )


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_model_is_qdq_with_every_weight_quantized(name: str) -> None:
    model = model_for(name)
    ops = {node.op_type for node in model.onnx.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert not any(op.startswith("QLinear") or op.endswith("Integer") for op in ops)  # QDQ format
    # Every weight of the float model became an int8 initializer behind a DequantizeLinear.
    assert model.weights
    assert sorted(onnx_models.weight_shapes(model.onnx)) == model.weights
    assert (
        harness.weights_among(
            onnx_models.initializer_inputs(model.onnx, "DequantizeLinear"), "int8"
        )
        == model.weights
    )
    assert onnx_models.output_scale(model.onnx) > 0
    feed = onnx_models.input_feed(model.onnx)
    assert {k: v.shape for k, v in feed.items()} == onnx_models.graph_inputs(model.onnx)
    assert list(onnx_models.sample_input(model=model.onnx)) == list(feed)


def test_input_feed_and_tolerance_generalise_the_cnn_helpers() -> None:
    cnn = onnx_models.make_qdq_cnn(0)
    for seed in (1, 2):
        feed, sample = onnx_models.input_feed(cnn, seed), onnx_models.sample_input(seed)
        assert list(feed) == list(sample) == [onnx_models.INPUT_NAME]
        np.testing.assert_array_equal(feed[onnx_models.INPUT_NAME], sample[onnx_models.INPUT_NAME])
    # Every model's tolerance is counted in steps of its own output scale.
    for name in harness.ZOO_MODELS:
        model = model_for(name).onnx
        steps = onnx_models.TOLERANCE_STEPS
        assert onnx_models.output_atol(model) == onnx_models.output_atol(model, steps)
        assert onnx_models.output_atol(model) > steps * onnx_models.output_scale(model)
        assert onnx_models.output_atol(model, onnx_models.INTEGER_TOLERANCE_STEPS) > (
            onnx_models.output_atol(model)
        )
    assert set(onnx_models.MODEL_BUILDERS.values()) >= {
        harness.zoo_builders(n)[0] for n in harness.ZOO_MODELS
    }


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_import_dequantizes_every_weight_constant(name: str) -> None:
    harness.check_import_dequantizes_every_weight(RELAX, model_for(name))


@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_float_weights_give_one_constant_quantize_per_weight(name: str) -> None:
    harness.check_float_weights_quantize_every_weight(RELAX, model_for(name, float_weights=True))


@pytest.mark.stock
@pytest.mark.parametrize("float_weights", [False, True], ids=["int8_weights", "float_weights"])
@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_stock_fold_constant_folds_every_constant_qdq(name: str, float_weights: bool) -> None:
    model = model_for(name, float_weights)
    before = len(constant_operands(model.imported, "relax.dequantize")) + len(
        constant_operands(model.imported, "relax.quantize")
    )
    assert before >= len(model.weights)
    folded = relax.transform.FoldConstant()(model.imported)
    assert constant_operands(folded, "relax.dequantize") == []
    assert constant_operands(folded, "relax.quantize") == []


@pytest.mark.slow
@pytest.mark.parametrize("name", harness.ZOO_MODELS)
def test_import_runs_like_onnxruntime(name: str) -> None:
    model = model_for(name)
    vm = relax.VirtualMachine(tvm.compile(model.imported, target="llvm"), tvm.cpu())

    def run(feed):
        return [vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()]).numpy()]

    harness.check_runs_like_onnxruntime(
        model, {"import": (run, onnx_models.output_atol(model.onnx))}
    )
    # run_relax is the same pipeline.
    feed = onnx_models.input_feed(model.onnx, 1)
    (via_helper,) = onnx_models.run_relax(model.imported, list(feed.values()))
    np.testing.assert_array_equal(via_helper, run(feed)[0])
