"""Frontend annotation: an ONNX QDQ import that keeps its weight patterns through any FoldConstant.

Three models are built in ONNX and quantized to QDQ form by onnxruntime, with their weights left
as fp32 initializers feeding ``QuantizeLinear`` (a small CNN, a CNN with residual adds, and a
transformer encoder block). Each is imported with Relax's ``from_onnx(...,
keep_params_in_input=False)`` and then:

* folded by the **stock** ``relax.transform.FoldConstant``, as a pipeline you do not control would
  do: every ``quantize(fp32 const)`` *and* every ``dequantize`` of a weight or bias folds into an
  fp32 constant, so no QDQ weight pattern is left for a backend;
* annotated right after the import with ``fold_guard.relax.annotate(mod, policy="qdq-accelerator")``,
  which puts ``R.fold_barrier`` on the operand of every weight and bias ``dequantize``, and *then*
  folded by the same stock pass: the weights become int8 constants, and every
  ``dequantize(fold_barrier(<int constant>))`` survives.

Both folded modules are built for the CPU and compared with the import (bit for bit) and with
onnxruntime (within the quantization tolerance of ``onnx_models.output_atol``).

Run: python examples/frontend_annotation.py
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import tvm
from _common import onnx_models
from tvm import relax

import fold_guard.relax as fgr

MODELS: List[Tuple[str, Callable]] = [
    ("qdq_cnn", onnx_models.make_qdq_cnn),
    ("residual_cnn", onnx_models.make_residual_cnn),
    ("transformer_block", onnx_models.make_transformer_block),
]


def qdq_constants(mod: tvm.IRModule) -> Dict[str, int]:
    """How many ``quantize`` of a constant, and ``dequantize`` of an integer constant (seen through
    a ``fold_barrier``), ``main`` still has: what a QDQ backend's pattern table can match."""
    bound: Dict[relax.Var, relax.Expr] = {}
    counts = {"quantize(const)": 0, "dequantize(int const)": 0}

    def resolve(expr: relax.Expr) -> relax.Expr:
        while isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        return expr

    def constant_operand(call: relax.Call) -> relax.Expr:
        data = resolve(call.args[0])
        if isinstance(data, relax.Call) and data.op.name == "relax.fold_barrier":
            data = resolve(data.args[0])
        return data

    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            bound[binding.var] = binding.value
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            data = constant_operand(call)
            if not isinstance(data, tvm.ir.GenericConst):
                continue
            if call.op.name == "relax.quantize":
                counts["quantize(const)"] += 1
            elif call.op.name == "relax.dequantize" and data.value.dtype.startswith(
                ("int", "uint")
            ):
                counts["dequantize(int const)"] += 1
    return counts


def main() -> None:
    header = (
        f"{'model':<18} {'module':<30} {'quantize(const)':>15} {'dequantize(int const)':>21}"
        "  max |out - onnxruntime|"
    )
    print(header)
    print("-" * len(header))
    all_ok = True
    for name, make in MODELS:
        model = make(float_weights=True)
        mod = onnx_models.import_relax(model)
        feed = onnx_models.input_feed(model)
        inputs = list(feed.values())
        expected = onnx_models.run_onnxruntime(model, feed)[0]
        atol = onnx_models.output_atol(model)
        reference = onnx_models.run_relax(mod, inputs)[0]

        start = time.perf_counter()
        annotated = fgr.annotate(mod, policy="qdq-accelerator")
        annotate_seconds = time.perf_counter() - start
        rows = [
            ("imported", mod),
            ("stock FoldConstant", relax.transform.FoldConstant()(mod)),
            ("annotated, stock FoldConstant", relax.transform.FoldConstant()(annotated.mod)),
        ]
        for label, candidate in rows:
            out = onnx_models.run_relax(candidate, inputs)[0]
            diff = float(np.max(np.abs(out - expected)))
            ok = diff <= atol and (label == "stock FoldConstant" or np.array_equal(out, reference))
            all_ok &= ok
            counts = qdq_constants(candidate)
            print(
                f"{name:<18} {label:<30} {counts['quantize(const)']:>15} {counts['dequantize(int const)']:>21}"
                f"  {diff:.6f} ({'ok' if ok else 'MISMATCH'})"
            )
        print(
            f"{'':<18} annotate placed {len(annotated.barriers)} fold_barrier, "
            f"{len(annotated.allows)} fold_allow in {annotate_seconds:.2f} s"
        )
    print()
    print("first placements on the last model:")
    print("\n".join(annotated.explain().splitlines()[:4]))
    print("ok" if all_ok else "MISMATCH")


if __name__ == "__main__":
    main()
