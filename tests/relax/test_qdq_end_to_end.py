"""The issue's Q/DQ case end to end on the reference QDQ CNN (guarantees 1 and 2).

    import (int8 weights)        : w = dequantize(<int8>, s, zp) -> conv2d
      stock FoldConstant         : w = <fp32>                    -> conv2d   (pattern gone)
      fold_guard keep-qdq-weights: w = dequantize(<int8>, s, zp) -> conv2d   (pattern kept)

    import (float_weights=True)  : q = quantize(<fp32>); w = dequantize(q) -> conv2d
      fold_guard keep-qdq-weights: w = dequantize(<int8>, s, zp) -> conv2d   (quantize folded)

Every variant is built for the CPU and compared with onnxruntime within ``output_atol``; under
the ``default`` policy our output is structurally equal to stock's and runs bit-identically.
"""

from __future__ import annotations

import numpy as np
import onnx  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import onnxruntime  # noqa: F401 - a test dependency (pip install -e '.[test]'); missing it must fail, not skip
import pytest
import tvm
from _common import onnx_models
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import Reason

KEEP = "keep-qdq-weights"
KEEP_RULE = "keep-dequantize-of-integer-constant"
FOLD_Q_RULE = "fold-quantize-of-constant"
VARIANTS = {"int8-weights": {}, "float-weights": {"float_weights": True}}
SEEDS = (1, 2, 3)


# ----------------------------------------------------------------------------------- helpers


# Every test here builds, imports or runs whole models (seconds each): full lane only.
pytestmark = pytest.mark.slow


def _bindings(mod):
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def _is_const(expr):
    return isinstance(expr, tvm.ir.GenericConst)


def _calls(mod, op_name):
    return [
        b
        for b in _bindings(mod)
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, tvm.ir.Op)
        and b.value.op.name == op_name
    ]


def _const_data_calls(mod, op_name):
    """Bindings of ``op_name`` whose data argument is a constant literal."""
    return [b for b in _calls(mod, op_name) if _is_const(b.value.args[0])]


def _weight_dequantizes(mod):
    """Dequantize bindings fed by a constant, or by quantize(constant): the weights and biases."""
    quantized_constants = {b.var for b in _const_data_calls(mod, "relax.quantize")}
    return [
        b
        for b in _calls(mod, "relax.dequantize")
        if _is_const(b.value.args[0]) or b.value.args[0] in quantized_constants
    ]


class _Model:
    """One QDQ model, its import, and every fold of it (computed once, never mutated)."""

    def __init__(self, variant):
        self.variant = variant
        self.onnx = onnx_models.make_qdq_cnn(0, **VARIANTS[variant])
        self.imported = onnx_models.import_relax(self.onnx)
        self.saved = tvm.ir.save_json(self.imported)
        self.stock = relax.transform.FoldConstant()(self.imported)
        self.default = fgr.fold(self.imported)
        self.keep = fgr.fold(self.imported, policy=KEEP, strict=True)
        self._built = {}

    def run(self, stage, feed):
        if stage not in self._built:
            mod = {
                "unfolded": self.imported,
                "stock": self.stock,
                "ours-default": self.default.mod,
                "ours-keep": self.keep.mod,
            }[stage]
            exe = tvm.compile(mod, target="llvm")
            self._built[stage] = relax.VirtualMachine(exe, tvm.cpu())
        return self._built[stage]["main"](tvm.runtime.tensor(feed)).numpy()


_MODELS = {}


def _model(variant):
    if variant not in _MODELS:
        _MODELS[variant] = _Model(variant)
    return _MODELS[variant]


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def model(request):
    return _model(request.param)


# ------------------------------------------------------------------------------- structure


def test_import_counts(model):
    """The starting point, per variant: 5 weights + 5 biases reach a dequantize from constants."""
    assert len(_weight_dequantizes(model.imported)) == 10
    n_quantize = len(_const_data_calls(model.imported, "relax.quantize"))
    assert n_quantize == (5 if model.variant == "float-weights" else 0)
    assert len(_const_data_calls(model.imported, "relax.dequantize")) == 10 - n_quantize


@pytest.mark.stock
def test_stock_destroys_the_weight_pattern(model):
    assert _const_data_calls(model.stock, "relax.dequantize") == []
    assert _const_data_calls(model.stock, "relax.quantize") == []
    assert _weight_dequantizes(model.stock) == []


def test_default_is_stock(model):
    tvm.ir.assert_structural_equal(model.default.mod, model.stock)
    assert [b.var.name for b in _bindings(model.default.mod)] == [
        b.var.name for b in _bindings(model.stock)
    ]


def test_keep_qdq_weights_keeps_every_weight_dequantize(model):
    kept = _const_data_calls(model.keep.mod, "relax.dequantize")
    assert len(kept) == len(_weight_dequantizes(model.imported)) == 10
    dtypes = sorted(str(b.value.args[0].value.numpy().dtype) for b in kept)
    assert dtypes == ["int32"] * 5 + ["int8"] * 5  # biases and weights, still integer constants
    # Each kept dequantize still feeds what it fed in the import (conv2d / matmul through
    # reshape / permute_dims), and no quantize of a constant is left.
    assert _const_data_calls(model.keep.mod, "relax.quantize") == []
    consumers = {
        b.value.op.name
        for b in _bindings(model.keep.mod)
        if any(isinstance(arg, relax.Var) and arg in {k.var for k in kept} for arg in b.value.args)
    }
    assert consumers == {"relax.nn.conv2d", "relax.reshape", "relax.permute_dims", "relax.add"}


def test_quantized_weights_equal_onnxruntime_quantizer():
    """float_weights=True, folded by keep-qdq-weights, gives exactly the int8 weights that
    onnxruntime's own quantizer stored in the int8-weights model (same seed)."""
    int8_model = _model("int8-weights")
    float_model = _model("float-weights")

    def weights(mod):
        arrays = [b.value.args[0].value.numpy() for b in _const_data_calls(mod, "relax.dequantize")]
        return sorted(arrays, key=lambda a: (a.dtype.str, a.shape))

    ours, reference = weights(float_model.keep.mod), weights(int8_model.imported)
    assert [(a.dtype, a.shape) for a in ours] == [(a.dtype, a.shape) for a in reference]
    for got, want in zip(ours, reference):
        np.testing.assert_array_equal(got, want)


def test_input_module_unchanged(model):
    assert tvm.ir.save_json(model.imported) == model.saved


# ---------------------------------------------------------------------------------- report


def test_report_counts_match_the_ir(model):
    n_quantize = len(_const_data_calls(model.imported, "relax.quantize"))
    n_import, n_stock = len(_bindings(model.imported)), len(_bindings(model.stock))

    # default: exactly the calls stock removed were folded, nothing kept by policy.
    default_plan = model.default.report.plan
    assert len(default_plan.folded) == n_import - n_stock
    assert default_plan.count_by_reason().get(Reason.KEPT_BY_POLICY, 0) == 0

    # keep-qdq-weights: the quantize(constant)s fold, each weight/bias dequantize is kept by
    # the policy rule, and the reshape / permute_dims on top of a kept bias are kept because
    # their input was, naming the rule and the kept dequantize.
    plan = model.keep.report.plan
    assert [d.rule for d in plan.folded] == [FOLD_Q_RULE] * n_quantize
    kept_dequantize = [
        d for d in plan.kept if d.reason is Reason.KEPT_BY_POLICY and d.op == "relax.dequantize"
    ]
    assert len(kept_dequantize) == len(_weight_dequantizes(model.imported)) == 10
    assert {d.rule for d in kept_dequantize} == {KEEP_RULE}
    inherited = [d for d in plan.kept if d.reason is Reason.KEPT_WITH_INPUT]
    assert sorted(d.op for d in inherited) == ["relax.permute_dims"] + ["relax.reshape"] * 4
    assert {d.rule for d in inherited} == {KEEP_RULE}
    assert all(plan.decisions[d.root] in kept_dequantize for d in inherited)
    assert len(_bindings(model.keep.mod)) == n_import - n_quantize
    counts = plan.count_by_reason()
    assert (counts[Reason.KEPT_BY_POLICY], counts[Reason.KEPT_WITH_INPUT]) == (10, 5)
    assert counts.get(Reason.FOLDED, 0) == n_quantize
    assert sum(counts.values()) == n_import

    # Bytes: quantize folding shrinks fp32 weights to int8; keeping dequantize adds nothing.
    report = model.keep.report
    if n_quantize:
        assert report.constant_bytes_after < report.constant_bytes_before
    else:
        assert report.constant_bytes_after == report.constant_bytes_before
    assert model.default.report.constant_bytes_after > model.keep.report.constant_bytes_after


# -------------------------------------------------------------------------------- numerics


@pytest.mark.slow
def test_every_stage_matches_onnxruntime(model):
    atol = onnx_models.output_atol(model.onnx)
    for seed in SEEDS:
        feed = onnx_models.sample_input(seed)
        (expected,) = onnx_models.run_onnxruntime(model.onnx, feed)
        outputs = {
            stage: model.run(stage, feed["input"])
            for stage in ("unfolded", "stock", "ours-default", "ours-keep")
        }
        for stage, actual in outputs.items():
            np.testing.assert_allclose(
                actual, expected, rtol=0, atol=atol, err_msg=f"{stage}, seed {seed}"
            )
        # Guarantee 2: our default fold is bit-identical to stock's; keeping Q/DQ changes nothing.
        np.testing.assert_array_equal(outputs["ours-default"], outputs["stock"])
        np.testing.assert_array_equal(outputs["ours-keep"], outputs["unfolded"])


@pytest.mark.slow
def test_run_relax_helper_agrees(model):
    feed = onnx_models.sample_input()
    (via_helper,) = onnx_models.run_relax(model.keep.mod, [feed["input"]])
    np.testing.assert_array_equal(via_helper, model.run("ours-keep", feed["input"]))
