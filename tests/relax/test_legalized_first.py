"""Legalized first, same decisions (issue 32, item 3): a policy reads kernels as it reads ops.

A pipeline that legalizes before it folds (MLC-LLM's phase 2, ``LegalizeOps -> FoldConstant``)
hands the pass ``call_tir(dequantize, ...)`` instead of ``R.dequantize``. The QDQ policies keep
the same weights int8 either way::

    import --annotate(keep-qdq-weights)--> LegalizeOps --> stock FoldConstant   (the barrier flow)
    import --LegalizeOps--> fold(keep-qdq-weights)                             (the kernel flow)
    import --LegalizeOps--> annotate(keep-qdq-weights) --> stock FoldConstant  (annotate late)

All three leave every weight's dequantize kernel reading the same int8 constants, byte for byte,
and run bit for bit as the unfolded legalized module does.
"""

from __future__ import annotations

import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import List

import numpy as np
import onnx  # noqa: F401 - a test dependency; missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from golden import CONSTANT_TYPE
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import list_policies

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models

KEEP = "keep-qdq-weights"
BARRIER = "relax.fold_barrier"
#: bench/real_models.py's widths divided by this (the layer structure is the full model's).
TINY = 8


@cache
def _imported(name: str, form: str) -> tvm.IRModule:
    if name == "qdq_cnn":
        return onnx_models.import_relax(onnx_models.make_qdq_cnn(float_weights=form != "int8"))
    return onnx_models.import_relax(real_models.build_quantized(name, form, scale=TINY))


def _dequantize_weights(mod: tvm.IRModule) -> Counter:
    """A digest of every integer constant a dequantize kernel reads as its data operand in main,
    directly or under a fold_barrier: (dtype, shape, bytes)."""
    bound = {}
    found: List[np.ndarray] = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            bound[binding.var] = binding.value
    for value in bound.values():
        if not (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.call_tir"
            and value.args[0].name_hint.startswith("dequantize")
        ):
            continue
        data = value.args[1].fields[0]
        data = bound.get(data, data)
        if isinstance(data, relax.Call) and data.op.name == BARRIER:
            data = data.args[0]
        if isinstance(data, CONSTANT_TYPE):
            array = data.value.numpy()
            found.append(array)
    return Counter((str(a.dtype), a.shape, a.tobytes()) for a in found)


def _run(mod: tvm.IRModule, inputs: List[np.ndarray]) -> List[np.ndarray]:
    return onnx_models.run_relax(mod, inputs)


MODELS = [
    pytest.param("qdq_cnn", "int8", id="qdq_cnn-int8"),
    pytest.param("qdq_cnn", "float_weights", id="qdq_cnn-float_weights"),
    pytest.param("resnet50", "float_weights", id="resnet50-float_weights", marks=pytest.mark.slow),
    pytest.param("bert_tiny", "int8", id="bert_tiny-int8", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "form"), MODELS)
def test_legalized_module_keeps_the_weights_annotate_keeps(name, form):
    imported = _imported(name, form)
    legalized = relax.transform.LegalizeOps()(imported)
    saved = tvm.ir.save_json(legalized)

    by_kernel = fgr.fold(legalized, policy=KEEP, strict=True).mod
    annotated_early = fgr.annotate(imported, policy=KEEP).mod
    barrier_flow = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(annotated_early))
    annotated_late = fgr.annotate(legalized, policy=KEEP).mod
    late_flow = relax.transform.FoldConstant()(annotated_late)

    weights = _dequantize_weights(by_kernel)
    assert weights, "the QDQ policy keeps the weights' dequantize kernels"
    assert {dtype for dtype, _, _ in weights} <= {"int8", "uint8", "int32"}  # weights, biases
    assert weights == _dequantize_weights(barrier_flow)
    assert weights == _dequantize_weights(late_flow)
    assert tvm.ir.save_json(legalized) == saved, "the pass mutated its input"


@pytest.mark.parametrize(("name", "form"), MODELS[:2])
def test_legalized_module_folded_by_a_qdq_policy_runs_bit_for_bit(name, form):
    legalized = relax.transform.LegalizeOps()(_imported(name, form))
    inputs = [
        np.random.default_rng(3).uniform(-1, 1, tuple(int(d) for d in p.ty.shape)).astype("float32")
        for p in legalized["main"].params
    ]
    reference = _run(legalized, inputs)
    for folded in (
        fgr.fold(legalized, policy=KEEP, strict=True).mod,
        relax.transform.FoldConstant()(fgr.annotate(legalized, policy=KEEP).mod),
    ):
        for got, want in zip(_run(folded, inputs), reference):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("policy", [policy.name for policy in list_policies()])
def test_every_policy_folds_a_legalized_module_without_an_error(policy):
    """No built-in policy refuses a lowered module (a lowered call no rule recognises follows the
    policy's fallback); default stays structurally equal to stock."""
    legalized = relax.transform.LegalizeOps()(_imported("qdq_cnn", "float_weights"))
    result = fgr.fold(legalized, policy=policy, strict=True)
    assert result.report is not None
    if policy == "default":
        tvm.ir.assert_structural_equal(result.mod, relax.transform.FoldConstant()(legalized))
