"""The built-in example: keep a QDQ model's weight patterns while folding its int8 weights.

A small CNN is built in ONNX, quantized to QDQ format by onnxruntime (per-channel int8 weights,
fixed seeds), and imported into Relax with its weights as constants. The weights are left as
fp32 constants feeding QuantizeLinear, so the import holds ``quantize(fp32 const)`` (to fold into
int8 constants) followed by ``dequantize`` (which a QDQ backend must still see).

* Stock ``relax.transform.FoldConstant`` folds every constant ``quantize`` *and* ``dequantize``:
  no ``dequantize(int8 constant) -> conv2d`` pattern is left for a backend to match.
* ``fold_guard.relax.FoldConstant("keep-qdq-weights")`` folds the ``quantize`` calls into int8
  constants and keeps each ``dequantize(int8 constant)``.

Both folded models are built for the CPU and checked against onnxruntime.

Run: python examples/qdq_cnn.py
"""

from __future__ import annotations

import time

import numpy as np
from _common import onnx_models
from _common.relax_calls import calls_of
from tvm import relax

import fold_guard.relax as fgr


def main() -> None:
    model = onnx_models.make_qdq_cnn(seed=0, float_weights=True)
    mod = onnx_models.import_relax(model)
    inputs = onnx_models.sample_input(seed=1)
    reference = onnx_models.run_onnxruntime(model, inputs)[0]
    atol = onnx_models.output_atol(model)

    start = time.perf_counter()
    stock = relax.transform.FoldConstant()(mod)
    stock_seconds = time.perf_counter() - start
    result = fgr.fold(mod, policy="keep-qdq-weights")

    print("== fold_guard, policy 'keep-qdq-weights' ==")
    print(result.report.explain(verbose=True))
    print()
    rows = [
        ("imported", mod),
        ("stock FoldConstant", stock),
        ("fold_guard keep-qdq-weights", result.mod),
    ]
    print(
        f"{'module':30s} {'quantize(const)':>16s} {'dequantize(const)':>18s} {'max |out - onnxruntime|':>24s}"
    )
    for name, module in rows:
        output = onnx_models.run_relax(module, list(inputs.values()))[0]
        error = float(np.max(np.abs(output - reference)))
        status = "ok" if error <= atol else f"ABOVE tolerance {atol:.4g}"
        quantizes = calls_of(module, "relax.quantize", on_constant=True)
        dequantizes = calls_of(module, "relax.dequantize", on_constant=True)
        print(f"{name:30s} {len(quantizes):>16d} {len(dequantizes):>18d} {error:>17.6f} ({status})")
    print()
    print(
        f"stock FoldConstant took {stock_seconds * 1000:.0f} ms; "
        f"fold_guard took {result.report.total_seconds * 1000:.0f} ms "
        f"({result.report.kernels_compiled} kernels compiled once, "
        f"{result.report.kernels_cached} loaded from the kernel cache)"
    )


if __name__ == "__main__":
    main()
