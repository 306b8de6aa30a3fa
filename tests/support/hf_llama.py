"""A tiny Hugging Face ``transformers`` Llama, quantized two ways, for the end-to-end tests.

``LlamaForCausalLM`` built from a :class:`~transformers.LlamaConfig` with random (seeded)
weights: nothing is downloaded. 2 layers, hidden size 64 (the issue's report used 256; 64 keeps
the ONNX export, the quantization and the builds to seconds), 4 heads over 2 key-value heads,
a 256-token vocabulary and 8 tokens in.

The model gets a *ready* causal mask: a float tensor of ``-inf`` above the diagonal, held as a
buffer and passed as ``attention_mask`` (and the positions as ``position_ids``). With the
model's own mask code the TorchScript ONNX exporter stops at ``aten::diff`` (transformers'
packed-sequence check) and TVM's torch frontend fails on the boolean mask ops; a mask made at
run time with ``torch.full(..., -inf)`` imports as ``R.full`` with a ``PrimValue`` fill, which
TVM 0.27's legalizer (and so its build and stock ``FoldConstant``) rejects. With a ready mask
both exports go through.

* :func:`onnx_qdq`: exported to ONNX (TorchScript exporter, opset 17) and quantized by
  onnxruntime's ``quantize_static`` in QDQ form, per-channel int8 weights, uint8 activations
  (the project's one quantizer call, ``examples/_common/onnx_models.py``); imported with
  ``from_onnx(..., keep_params_in_input=False)`` or ``True``.
* :func:`pt2e`: ``torch.export`` + PT2E (``torchao``'s XNNPACK quantizer, symmetric per-channel
  int8 weights), imported with ``from_exported_program`` and fold_guard's
  ``torch_quantized_convert_map()``.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

__all__ = ["HIDDEN", "LAYERS", "SEQUENCE", "VOCAB", "LlamaModels", "llama", "onnx_qdq", "pt2e"]

VOCAB = 256
HIDDEN = 64
LAYERS = 2
SEQUENCE = 8
CALIBRATION_BATCHES = 4


def _config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4 * SEQUENCE,
        use_cache=False,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )


def llama(seed: int = 0) -> Any:
    """The float model, wrapped to take ``input_ids`` only and return every position's logits."""
    import torch
    from transformers import LlamaForCausalLM

    class WithReadyMask(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model
            # a buffer, so both exports see a constant: made at run time, torch's full(-inf)
            # imports as R.full with a PrimValue fill, which TVM 0.27's legalizer rejects
            causal = torch.triu(torch.full((SEQUENCE, SEQUENCE), float("-inf")), diagonal=1)
            self.register_buffer("mask", causal[None, None])
            self.register_buffer("positions", torch.arange(SEQUENCE).unsqueeze(0))

        def forward(self, input_ids: Any) -> Any:
            out = self.model(
                input_ids=input_ids, attention_mask=self.mask, position_ids=self.positions
            )
            return out.logits

    torch.manual_seed(seed)
    return WithReadyMask(LlamaForCausalLM(_config()).eval()).eval()


def token_ids(rng: np.random.Generator) -> np.ndarray:
    """A batch of one sequence of token ids in ``[0, VOCAB)``."""
    return rng.integers(0, VOCAB, (1, SEQUENCE), dtype=np.int64)


@dataclass(frozen=True)
class LlamaModels:
    """What the tests read of one quantized form."""

    onnx_model: Any = None  # the QDQ ModelProto (ONNX form)
    exported: Any = None  # the ExportedProgram (PT2E form)
    example: Any = None  # token ids, int64 (1, SEQUENCE)


@functools.lru_cache(maxsize=1)
def onnx_qdq(seed: int = 0) -> LlamaModels:
    """The model exported to ONNX and quantized to QDQ (per-channel int8 weights)."""
    import io

    import onnx
    import torch
    from _common.onnx_models import _quantize_qdq

    model = llama(seed)
    rng = np.random.default_rng(seed)
    example = token_ids(rng)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.from_numpy(example),),
            buffer,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamo=False,
            opset_version=17,
        )
    float_model = onnx.load_from_string(buffer.getvalue())
    calibration: List[Dict[str, np.ndarray]] = [
        {"input_ids": token_ids(rng)} for _ in range(CALIBRATION_BATCHES)
    ]
    quantized = _quantize_qdq(
        float_model, calibration, activation_type="uint8", float_weights=False
    )
    return LlamaModels(onnx_model=quantized, example=example)


@functools.lru_cache(maxsize=1)
def pt2e(seed: int = 0) -> LlamaModels:
    """The model through ``torch.export`` and PT2E (XNNPACK quantizer, per-channel int8)."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.testing.pt2e._xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    model = llama(seed)
    rng = np.random.default_rng(seed)
    example = token_ids(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantizer = XNNPACKQuantizer()
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
        graph = torch.export.export(model, (torch.from_numpy(example),)).module()
        prepared = prepare_pt2e(graph, quantizer)
        with torch.no_grad():
            for _ in range(CALIBRATION_BATCHES):
                prepared(torch.from_numpy(token_ids(rng)))
        converted = convert_pt2e(prepared)
        exported = torch.export.export(converted, (torch.from_numpy(example),))
    return LlamaModels(exported=exported, example=example)
