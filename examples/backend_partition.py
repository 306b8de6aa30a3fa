"""The backend path: fold a QDQ model for an accelerator, then partition it with the backend's patterns.

A BYOC backend that runs quantized convs and matmuls (the test backend "qdq_npu" of
``_common.relax_byoc``) claims ``op(dequantize(x_q), dequantize(<int8 const>)) [+ bias]``
with a pattern table (``relax.transform.FuseOpsByPattern`` + ``MergeCompositeFunctions``). The
reference models, quantized by onnxruntime to QDQ form with their weights stored in float
(``quantize(<fp32 const>) -> dequantize``), are imported into Relax and taken three ways:

* imported, not folded: the weights are no int8 constants yet, nothing can be offloaded;
* stock ``relax.transform.FoldConstant()``: it folds the ``quantize`` *and* the ``dequantize``, so
  the weights become fp32 constants and nothing can be offloaded either;
* ``fold_guard.relax.FoldConstant("qdq-accelerator")``: the ``quantize`` calls fold into int8
  constants, each ``dequantize`` stays, and every quantized conv / matmul is offloaded.

For each, the table shows the quantized convs + matmuls offloaded out of those in the model,
the bytes of constants in the module, and the time the fold took; then the fold plan under the
backend policy. Finally the partitioned module is built for the CPU, its offloaded regions
compiled by TVM (``relax_byoc.strip_codegen``), and checked against the unfolded module (bit for
bit) and against onnxruntime (within ``onnx_models.output_atol``).

Run from the repository root: ``python examples/backend_partition.py`` (about 20 s).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Tuple, TypeVar

import numpy as np
import tvm
from _common import onnx_models, relax_byoc
from tvm import relax

import fold_guard.relax as fgr

T = TypeVar("T")
POLICY = "qdq-accelerator"
MODELS: Dict[str, Callable[..., Any]] = {
    "qdq_cnn": onnx_models.make_qdq_cnn,
    "residual_cnn": onnx_models.make_residual_cnn,
    "transformer_block": onnx_models.make_transformer_block,
}


def constant_bytes(mod: tvm.IRModule) -> int:
    """Bytes of every constant literal in the module's Relax functions (composites included)."""
    total = 0

    def visit(expr: relax.Expr) -> None:
        nonlocal total
        if isinstance(expr, tvm.ir.GenericConst):
            total += expr.value.numpy().nbytes

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return total


def timed(step: Callable[[tvm.IRModule], T], mod: tvm.IRModule) -> Tuple[T, float]:
    """``step(mod)`` and the seconds it took."""
    start = time.perf_counter()
    result = step(mod)
    return result, time.perf_counter() - start


def main() -> None:
    print(f"{'model':18s} {'path':28s} {'offloaded':>9s} {'constants':>12s} {'fold time':>10s}")
    plans: List[str] = []
    checks: List[Tuple[str, Any, tvm.IRModule, tvm.IRModule]] = []
    for name, make in MODELS.items():
        model = make(0, float_weights=True)
        imported = onnx_models.import_relax(model)
        # The ops the backend could take once the weights are int8 constants.
        total = relax_byoc.count_quantized_ops(imported, through_quantize=True)

        stock, stock_seconds = timed(relax.transform.FoldConstant(), imported)
        result, ours_seconds = timed(lambda mod: fgr.fold(mod, policy=POLICY), imported)
        rows = [
            ("imported (not folded)", imported, None),
            ("stock FoldConstant", stock, stock_seconds),
            (f"fold_guard {POLICY}", result.mod, ours_seconds),
        ]
        for path, mod, seconds in rows:
            partitioned = relax_byoc.partition_for_qdq_npu(mod)
            offloaded = relax_byoc.count_offloaded(partitioned)["offloaded"]
            when = "-" if seconds is None else f"{seconds * 1000:.0f} ms"
            print(
                f"{name:18s} {path:28s} {f'{offloaded} / {total}':>9s} {constant_bytes(mod):>10d} B {when:>10s}"
            )
        plans.append(f"{name}: {result.plan.explain(verbose=False)}")
        checks.append((name, model, imported, relax_byoc.partition_for_qdq_npu(result.mod)))

    print()
    for line in plans:
        print(line)

    print()
    failed = False
    for name, model, imported, partitioned in checks:
        feed = onnx_models.input_feed(model)
        (expected,) = onnx_models.run_onnxruntime(model, feed)
        (unfolded,) = onnx_models.run_relax(imported, list(feed.values()))
        (ours,) = onnx_models.run_relax(relax_byoc.strip_codegen(partitioned), list(feed.values()))
        atol = onnx_models.output_atol(model)
        error = float(np.max(np.abs(ours - expected)))
        identical = np.array_equal(ours, unfolded)
        status = "ok" if identical and error <= atol else "MISMATCH"
        failed = failed or status != "ok"
        print(
            f"{name:18s} partitioned vs unfolded: {'bit-identical' if identical else 'DIFFERENT'}; "
            f"max |out - onnxruntime| = {error:.6f} (atol {atol:.6f}): {status}"
        )
    if failed:
        raise SystemExit("backend_partition: an output check failed")


if __name__ == "__main__":
    main()
