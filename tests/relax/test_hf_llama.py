"""A Hugging Face decoder end to end: a tiny ``transformers`` Llama, quantized two ways.

``support.hf_llama``: ``LlamaForCausalLM`` from a config (2 layers, hidden size 64, random
seeded weights, nothing downloaded), with a ready causal mask (TorchScript's ONNX exporter and
TVM's torch frontend both fail on the model's own boolean mask code). Two import paths:

* ONNX: exported, quantized by onnxruntime (QDQ, per-channel int8 weights), ``from_onnx`` with
  the weights as constants and as parameters (``keep_params_in_input=True``);
* PT2E: ``torch.export`` + ``torchao``'s XNNPACK quantizer, ``from_exported_program`` with the
  weights as constants and as parameters (``keep_params_as_input=True``).

Each path: ``default`` is structurally equal to stock (RFC.md, guarantee 1; with the ready mask
these imports have no call that reads only a run-time value's shape: ``test_runtime_operands``
and the ONNX corpus as shipped cover those); ``keep-qdq-weights`` keeps every linear layer's
weight int8 behind its dequantize and folds the embedding table's (read by ``take``, no weight;
onnxruntime quantizes the table, XNNPACK does not); built, the folded modules compute the
unfolded one's logits bit for bit. Whole models: full lane only (1-3 minutes a path on two
loaded cores).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import tvm
from build_once import run_mains
from golden import CONSTANT_TYPE, op_calls
from tvm import relax

import fold_guard.relax as fgr

pytestmark = pytest.mark.slow
pytest.importorskip("torch", reason="the Llama tests need torch==2.13.0 (the test extra)")
pytest.importorskip("transformers", reason="the Llama tests need transformers (the test extra)")
hf_llama = pytest.importorskip("support.hf_llama")

#: q, k, v, o, gate, up, down per layer, and the output projection
LINEAR_LAYERS = 7 * hf_llama.LAYERS + 1
IMPORTS = ("onnx", "onnx as parameters", "pt2e", "pt2e as parameters")

_MODULES: Dict[str, tvm.IRModule] = {}


def imported(how: str) -> tvm.IRModule:
    """The Relax import ``how`` (one of :data:`IMPORTS`), made once per session."""
    if how not in _MODULES:
        as_params = how.endswith("as parameters")
        if how.startswith("onnx"):
            from tvm.relax.frontend.onnx import from_onnx

            model = hf_llama.onnx_qdq().onnx_model
            _MODULES[how] = from_onnx(model, keep_params_in_input=as_params)
        else:
            from tvm.relax.frontend.torch import from_exported_program

            from fold_guard.relax.frontends import torch_quantized_convert_map

            _MODULES[how] = from_exported_program(
                hf_llama.pt2e().exported,
                custom_convert_map=torch_quantized_convert_map(),
                keep_params_as_input=as_params,
            )
    return _MODULES[how]


def _example(how: str) -> np.ndarray:
    forms = hf_llama.onnx_qdq() if how.startswith("onnx") else hf_llama.pt2e()
    return forms.example


def linear_weight_dequantizes(mod: tvm.IRModule) -> List[relax.Call]:
    """``dequantize(<int8 constant>)`` calls that a ``matmul`` reads as its weight (directly or
    through ``permute_dims``), as PT2E's and onnxruntime's linear layers import."""
    producers = {
        binding.var: binding.value
        for block in mod["main"].body.blocks
        for binding in block.bindings
    }

    def source(expr):
        value = producers.get(expr, expr)
        if isinstance(value, relax.Call) and value.op.name == "relax.permute_dims":
            return source(value.args[0])
        return value

    found = []
    for call in op_calls(mod, "relax.matmul"):
        weight = source(call.args[1])
        if (
            isinstance(weight, relax.Call)
            and weight.op.name == "relax.dequantize"
            and isinstance(weight.args[0], CONSTANT_TYPE)
            and str(weight.args[0].ty.dtype) == "int8"
        ):
            found.append(weight)
    return found


@pytest.mark.parametrize("how", IMPORTS)
def test_default_is_stock(how):
    mod = imported(how)
    stock = relax.transform.FoldConstant()(mod)
    result = fgr.fold(mod)
    tvm.ir.assert_structural_equal(result.mod, stock)


@pytest.mark.parametrize("how", ["onnx", "pt2e"])
def test_keep_qdq_weights_keeps_every_linear_weight_int8_and_folds_the_embedding(how):
    mod = imported(how)
    result = fgr.fold(mod, policy="keep-qdq-weights")
    assert len(linear_weight_dequantizes(result.mod)) == LINEAR_LAYERS, result.plan.explain()
    if how == "pt2e":
        return  # XNNPACK's quantizer leaves the embedding table float
    # onnxruntime quantizes the table too: its dequantize is read by take, no weight, and folds
    # as the default does
    embedding = [
        d
        for d in result.plan.decisions
        if d.op == "relax.dequantize"
        and d.action.value == "fold"
        and hf_llama.VOCAB in (result.plan.graph.nodes[d.node].outputs[0].shape or ())
    ]
    assert len(embedding) == 1, result.plan.explain()


@pytest.mark.parametrize("how", ["onnx", "pt2e"])
def test_built_folds_compute_the_unfolded_logits_bit_for_bit(how):
    mod = imported(how)
    mods = {
        "unfolded": mod,
        "default": fgr.FoldConstant()(mod),
        "keep-qdq-weights": fgr.FoldConstant("keep-qdq-weights")(mod),
        "annotated": fgr.annotate(mod, policy="keep-qdq-weights").mod,
    }
    outputs = run_mains(mods, _example(how))
    assert outputs["unfolded"].shape[-1] == hf_llama.VOCAB
    for key, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), key
