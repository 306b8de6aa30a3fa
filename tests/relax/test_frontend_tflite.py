"""TFLite models into Relax: full int8, int8 weights behind DEQUANTIZE, float16 weights.

The models are written without TensorFlow (``_common.tflite_models``, ``_common.tflite_weights``).
TVM 0.27's importer fails on int8 weights behind a DEQUANTIZE operator (a canary below records
it); ``fold_guard.relax.frontends.TFLiteOperatorConverter`` fixes that converter and changes no
other import. Each form then keeps its weights as the backend wants them under the QDQ policies
(``dequantize(<int8 constant>)``, or ``astype(<float16 constant>)``), folds as stock under
``default``, and the folded module computes the unfolded module's output bit for bit.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import tvm
from _common import tflite_models, tflite_weights
from build_once import run_mains
from golden import CONSTANT_TYPE, op_calls
from tvm import relax

import fold_guard.relax as fgr
from fold_guard.relax.frontends import TFLiteOperatorConverter

pytest.importorskip("tflite", reason="Relax's TFLite importer reads models with the tflite package")

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")
#: Weight layers of the weight-form model: conv, depthwise conv, dense.
WEIGHTS = 3


def imported(form: str) -> tvm.IRModule:
    model = tflite_weights.make_weight_form_model(form, seed=0)
    return tflite_weights.import_tflite_relax(model.buffer, TFLiteOperatorConverter)


def constant_dtypes(mod: tvm.IRModule, op_name: str) -> List[str]:
    """dtypes of the constant first operands of every ``op_name`` call (non-constant: "")."""
    return [
        str(call.args[0].ty.dtype) if isinstance(call.args[0], CONSTANT_TYPE) else ""
        for call in op_calls(mod, op_name)
    ]


@pytest.mark.stock
def test_stock_importer_still_fails_on_int8_weights_behind_dequantize():
    """TVM's ``convert_dequantize`` looks a constant up as an expression (RFC.md, Frontends).

    When this canary fails, TVM has fixed the importer and the override can go.
    """
    model = tflite_weights.make_weight_form_model("int8-dequantize", seed=0)
    with pytest.raises(KeyError, match="conv/weight_int8"):
        tflite_weights.import_tflite_relax(model.buffer)


@pytest.mark.parametrize("form", ["float32", "float16-dequantize"])
def test_the_override_changes_nothing_the_stock_importer_can_import(form):
    model = tflite_weights.make_weight_form_model(form, seed=0)
    tvm.ir.assert_structural_equal(
        tflite_weights.import_tflite_relax(model.buffer, TFLiteOperatorConverter),
        tflite_weights.import_tflite_relax(model.buffer),
    )


def test_the_override_changes_nothing_on_a_full_int8_model():
    """The full-int8 model's DEQUANTIZE reads an activation: TVM's own converter handles it."""
    model = tflite_models.make_quantized_tflite_model(0)
    tvm.ir.assert_structural_equal(
        tflite_models.import_tflite_relax(model, TFLiteOperatorConverter),
        tflite_models.import_tflite_relax(model),
    )


def test_int8_weights_behind_dequantize_import_as_qdq_weights():
    mod = imported("int8-dequantize")
    assert constant_dtypes(mod, "relax.dequantize") == ["int8"] * WEIGHTS
    model = tflite_weights.make_weight_form_model("int8-dequantize", seed=0)
    conv = op_calls(mod, "relax.dequantize")[0]
    # The converter's dequantize carries the tensor's own per-channel scales and axis.
    assert int(conv.attrs.axis) == 0
    dequantized = conv.args[0].value.numpy().astype(np.float32) * conv.args[
        1
    ].value.numpy().reshape(-1, 1, 1, 1)
    np.testing.assert_array_equal(dequantized, model.conv_weight)


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_qdq_policies_keep_every_int8_weight_behind_its_dequantize(policy):
    folded = fgr.FoldConstant(policy)(imported("int8-dequantize"))
    assert constant_dtypes(folded, "relax.dequantize") == ["int8"] * WEIGHTS


@pytest.mark.parametrize("form", ["int8-dequantize", "float16-dequantize"])
def test_default_is_stock(form):
    mod = imported(form)
    folded = fgr.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(mod))
    assert not op_calls(folded, "relax.dequantize") and not op_calls(folded, "relax.astype")


@pytest.mark.parametrize("policy", ("keep-low-precision-weights",) + QDQ_POLICIES)
def test_float16_weights_and_biases_keep_their_cast(policy):
    """Three weights and three biases: each stays ``astype(<float16 constant>)``, half the bytes."""
    mod = imported("float16-dequantize")
    result = fgr.fold(mod, policy=policy)
    assert constant_dtypes(result.mod, "relax.astype") == ["float16"] * 2 * WEIGHTS
    stock = fgr.fold(mod)  # default: every cast folded into float32
    assert result.report.constant_bytes_after * 2 == stock.report.constant_bytes_after


@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_full_int8_weights_stay_behind_their_dequantize(policy):
    """The conv weight imports as ``dequantize(<int8>)``, the dense one as
    ``dequantize(permute_dims(<int8>))``: the transpose folds, both dequantizes stay on int8
    constants, as do the two int32 biases'; stock folds all four (the three left read
    activations)."""
    mod = tflite_models.import_tflite_relax(tflite_models.make_quantized_tflite_model(0))
    assert constant_dtypes(mod, "relax.dequantize").count("int8") == 1
    folded = fgr.FoldConstant(policy)(mod)
    assert sorted(constant_dtypes(folded, "relax.dequantize")) == [
        "",
        "",
        "",
        "int32",
        "int32",
        "int8",
        "int8",
    ]
    assert not op_calls(folded, "relax.permute_dims")
    assert constant_dtypes(fgr.FoldConstant()(mod), "relax.dequantize") == ["", "", ""]


# Numerics: the built modules --------------------------------------------------------------------


def versions(mod: tvm.IRModule, policies) -> Dict[str, tvm.IRModule]:
    """The import unfolded, folded under each policy, and annotated for each (stock-built)."""
    mods = {"unfolded": mod}
    for policy in policies:
        mods[policy] = fgr.FoldConstant(policy)(mod)
        mods[f"annotated {policy}"] = fgr.annotate(mod, policy=policy).mod
    return mods


@pytest.mark.slow
@pytest.mark.parametrize("form", ["int8-dequantize", "float16-dequantize"])
def test_weight_forms_run_bit_identical_and_match_numpy(form):
    model = tflite_weights.make_weight_form_model(form, seed=0)
    x = np.random.default_rng(1).standard_normal(tflite_weights.INPUT_SHAPE).astype(np.float32)
    policies = ("default", "keep-low-precision-weights") + QDQ_POLICIES
    outputs = run_mains(versions(imported(form), policies), x)
    for name, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), name
    np.testing.assert_allclose(
        outputs["unfolded"], tflite_weights.reference_output(model, x), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_full_int8_runs_bit_identical_and_within_a_step_of_the_integer_reference():
    model = tflite_models.make_quantized_tflite_model(0)
    x = np.random.default_rng(1).standard_normal(tflite_models.INPUT_SHAPE).astype(np.float32)
    outputs = run_mains(versions(tflite_models.import_tflite_relax(model), QDQ_POLICIES), x)
    for name, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), name
    step = float(model.output_q.scale.item())
    reference = tflite_models.reference_output(model, x)
    assert np.abs(outputs["unfolded"] - reference).max() <= step * 1.01
