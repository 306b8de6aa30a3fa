"""PyTorch PT2E models into Relax through ``torch_quantized_convert_map``.

PT2E's ``quantized_decomposed`` quantize / dequantize calls import as Relax Q/DQ with the map
(TVM 0.27 rejects them without it: the canary below); then ``keep-qdq-weights`` and
``qdq-accelerator`` keep every weight as ``dequantize(<int8 constant>)``, ``quantize(<float32
weight>)`` folds into the int8 weight PyTorch computes, ``default`` is stock, and the built
module computes PyTorch's converted model's output within one output quantization step and the
unfolded import's bit for bit. Models: ``_common.torch_models`` (conv, linear, depthwise,
residual; XNNPACK's quantizer, symmetric per-channel int8 weights in [-127, 127]).

Every test imports torch (about ten seconds) and most quantize a model: full lane only.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest
import tvm
from build_once import run_mains
from golden import CONSTANT_TYPE, op_calls
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import UnsupportedIRError
from fold_guard.relax.frontends import torch_quantized_convert_map

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the PT2E tests need torch==2.13.0 (the test extra)")
pytest.importorskip("torchao", reason="PT2E lives in torchao since torch 2.6 (the test extra)")
torch_models = pytest.importorskip("_common.torch_models")

QDQ_POLICIES = ("keep-qdq-weights", "qdq-accelerator")
WEIGHT_OPS = ("relax.nn.conv2d", "relax.matmul")
#: Weight layers per model (each weight is one per-channel int8 tensor).
WEIGHT_LAYERS = {"conv": 1, "linear": 2, "depthwise": 2, "residual": 3}


def import_program(exported) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(exported, custom_convert_map=torch_quantized_convert_map())


_CACHE: Dict[Tuple[str, bool], Tuple[object, tvm.IRModule]] = {}


def quantized(name: str, fold_quantize: bool = True):
    """(the quantized PyTorch model, its Relax import), made once per session."""
    key = (name, fold_quantize)
    if key not in _CACHE:
        model = torch_models.quantize_model(name, seed=0, fold_quantize=fold_quantize)
        _CACHE[key] = (model, import_program(model.exported))
    return _CACHE[key]


def int8_weight_dequantizes(mod: tvm.IRModule) -> List[relax.Call]:
    """The ``dequantize(<int8 constant>)`` calls whose value becomes a conv / matmul weight."""
    found = []
    for call in op_calls(mod, "relax.dequantize"):
        if isinstance(call.args[0], CONSTANT_TYPE) and str(call.args[0].ty.dtype) == "int8":
            found.append(call)
    return found


@pytest.mark.stock
def test_stock_import_rejects_pt2e_ops():
    """What the map is for: TVM 0.27 has no converter for PT2E's quantize / dequantize."""
    from tvm.relax.frontend.torch import from_exported_program

    model, _ = quantized("conv")
    with pytest.raises(AssertionError, match=r"Unsupported function types .*quantize_per_tensor"):
        from_exported_program(model.exported)


@pytest.mark.parametrize("name", torch_models.MODELS)
def test_import_gives_int8_weights_behind_dequantize(name):
    _, mod = quantized(name)
    weights = int8_weight_dequantizes(mod)
    assert len(weights) == WEIGHT_LAYERS[name]
    assert all(int(call.attrs.axis) == 0 for call in weights)  # per output channel
    for call in weights:
        values = call.args[0].value.numpy()
        assert values.min() >= -127  # XNNPACK's symmetric range, not int8's -128


@pytest.mark.parametrize("name", torch_models.MODELS)
@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_qdq_policies_keep_every_weight_int8_behind_its_dequantize(name, policy):
    _, mod = quantized(name)
    folded = fgr.FoldConstant(policy)(mod)
    assert len(int8_weight_dequantizes(folded)) == WEIGHT_LAYERS[name]


@pytest.mark.parametrize("name", torch_models.MODELS)
def test_default_is_stock_and_leaves_no_weight_dequantize(name):
    _, mod = quantized(name)
    folded = fgr.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(mod))
    assert int8_weight_dequantizes(folded) == []


@pytest.mark.parametrize("name", ["conv", "residual"])
@pytest.mark.parametrize("policy", QDQ_POLICIES)
def test_quantize_of_a_float_weight_folds_to_pytorchs_int8_weight(name, policy):
    """``convert_pt2e(fold_quantize=False)`` keeps ``quantize_per_channel(<float32 W>)`` (with
    XNNPACK's [-127, 127], a ``clip`` after it); the policy folds both into the int8 weights
    ``fold_quantize=True`` stores, and keeps their dequantize."""
    _, unfolded_weights = quantized(name, fold_quantize=False)
    assert len(op_calls(unfolded_weights, "relax.quantize")) > 0
    assert int8_weight_dequantizes(unfolded_weights) == []
    folded = fgr.FoldConstant(policy)(unfolded_weights)
    ours = [call.args[0].value.numpy() for call in int8_weight_dequantizes(folded)]
    _, stored = quantized(name, fold_quantize=True)
    pytorchs = [call.args[0].value.numpy() for call in int8_weight_dequantizes(stored)]
    assert len(ours) == len(pytorchs) == WEIGHT_LAYERS[name]
    for a, b in zip(ours, pytorchs):
        # PyTorch multiplies by 1/scale, Relax divides by scale: a value on a rounding boundary
        # could land one step apart. None of these weights does.
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", torch_models.MODELS)
def test_outputs_match_pytorch_within_a_step_and_the_unfolded_import_bit_for_bit(name):
    model, mod = quantized(name)
    mods = {"unfolded": mod, "default": fgr.FoldConstant()(mod)}
    for policy in QDQ_POLICIES:
        mods[policy] = fgr.FoldConstant(policy)(mod)
        mods[f"annotated {policy}"] = fgr.annotate(mod, policy=policy).mod
    outputs = run_mains(mods, model.example)
    for key, out in outputs.items():
        assert out.tobytes() == outputs["unfolded"].tobytes(), key
    # The output's quantization step: the scale of the model's last dequantize.
    last = op_calls(mod, "relax.dequantize")[-1]
    step = float(last.args[1].value.numpy())
    assert np.abs(outputs["unfolded"] - model.run_torch(model.example)).max() <= step * 1.001


# The converter on hand-written PT2E calls --------------------------------------------------------


class _Ops(torch.nn.Module):
    """Every overload the map converts, with the arguments real models rarely use."""

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        qd = torch.ops.quantized_decomposed
        scales = torch.tensor([0.02, 0.05, 0.1], dtype=torch.float32)
        zeros = torch.tensor([0, 3, -2], dtype=torch.int64)
        # quant_min / quant_max narrower than int8: values past them clip there
        narrow = qd.quantize_per_tensor.default(x, 0.01, 0, -100, 100, torch.int8)
        narrow_dq = qd.dequantize_per_tensor.default(narrow, 0.01, 0, -100, 100, torch.int8)
        # the .tensor overloads: scale and zero point as tensors
        scale_t, zero_t = torch.tensor([0.03]), torch.tensor([5], dtype=torch.int64)
        uint = qd.quantize_per_tensor.tensor(x, scale_t, zero_t, 0, 255, torch.uint8)
        uint_dq = qd.dequantize_per_tensor.tensor(uint, scale_t, zero_t, 0, 255, torch.uint8)
        # per channel along axis 1, int64 zero points; no zero points; float16 in and out
        per_axis = qd.quantize_per_channel.default(x, scales, zeros, 1, -128, 127, torch.int8)
        per_axis_dq = qd.dequantize_per_channel.default(
            per_axis, scales, zeros, 1, -128, 127, torch.int8
        )
        no_zero = qd.dequantize_per_channel.default(
            per_axis, scales, None, 1, -128, 127, torch.int8
        )
        half = qd.quantize_per_tensor.default(x.half(), 0.01, 0, -128, 127, torch.int8)
        half_out = qd.dequantize_per_tensor.default(
            half, 0.01, 0, -128, 127, torch.int8, out_dtype=torch.float16
        )
        return narrow, narrow_dq, uint, uint_dq, per_axis, per_axis_dq, no_zero, half, half_out


def test_every_overload_converts_to_pytorchs_values():
    """Inputs away from rounding boundaries: every output equal to PyTorch's, dtypes included."""
    rng = np.random.default_rng(3)
    # multiples of 0.001 plus a quarter step: never half way between two levels of any scale here
    x = ((rng.integers(-3000, 3000, size=(2, 3, 4)) + 0.25) * 0.001).astype(np.float32)
    x[0, 0, :2] = [5.0, -5.0]  # past quant_min / quant_max of the narrow range
    exported = torch.export.export(_Ops(), (torch.from_numpy(x),))
    mod = import_program(exported)
    assert op_calls(mod, "relax.clip")  # the narrow range, and only it
    assert len(op_calls(mod, "relax.clip")) == 1
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    ours = [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]
    with torch.no_grad():
        theirs = [t.numpy() for t in _Ops()(torch.from_numpy(x))]
    assert len(ours) == len(theirs) == 9
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype, index
        np.testing.assert_array_equal(a, b, err_msg=f"output {index}")
    assert theirs[0].min() == -100 and theirs[0].max() == 100


class _Int32Quantize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized_decomposed.quantize_per_tensor.default(
            x, 0.1, 0, -(2**31), 2**31 - 1, torch.int32
        )


def test_a_dtype_relax_cannot_quantize_to_names_the_node():
    exported = torch.export.export(_Int32Quantize(), (torch.zeros(2, 2),))
    with pytest.raises(
        UnsupportedIRError, match=r"quantize_per_tensor.*quantizing to int32 has no Relax op"
    ):
        import_program(exported)
