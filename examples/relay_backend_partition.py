"""A Relay BYOC backend that needs int8 constant weights: what each fold lets it offload.

The QDQ CNN (ONNX, quantized by onnxruntime, weights left as fp32 initializers feeding
QuantizeLinear) is imported into Relay and run through ``FakeQuantizationToInteger``; every
``qnn.conv2d`` / ``qnn.dense`` weight is then ``qnn.quantize(<fp32 constant>)``. A test backend
(:mod:`_common.relay_byoc`) partitions it the way a ``partition_for_<backend>`` does:
``MergeComposite`` with a pattern table of ``qnn.conv2d`` / ``qnn.dense`` with an int8 *constant*
weight (optional constant bias) followed by ``qnn.requantize``, then ``AnnotateTarget``,
``MergeCompilerRegions``, ``PartitionGraph``.

1. Fold before partitioning. Stock ``FoldConstant()`` leaves the quantizes, so nothing matches;
   ``fold_guard.relay.FoldConstant("qdq-accelerator")`` folds the weights into int8 constants and
   keeps every other QNN op (and any ``qnn.dequantize`` of an integer constant) for the pattern
   table. Stock ``FoldConstant(fold_qnn=True)`` is shown too: on this model it offloads the same,
   because the weight quantizes are its only all-constant QNN calls.
2. Partition first, fold in the codegen. With a pattern table that also accepts a weight that is
   still ``qnn.quantize(<constant>)``, the backend's ``relay.ext`` hook folds each external
   function with ``fold_guard.relay.fold_function(func, policy="qdq-accelerator")`` before it
   compiles it. The partitioned module is built and run on the CPU (the test codegen compiles
   external functions with LLVM) and compared with the unfolded module and with onnxruntime.

Needs the Relay environment (Python 3.10, hhb-tvm). Run from the repository root:

    .venv310/bin/python examples/relay_backend_partition.py
"""

from __future__ import annotations

import time
from typing import Callable, Tuple, TypeVar

import numpy as np
from _common import onnx_models
from _common import relay_byoc as byoc
from tvm import relay

import fold_guard.relay as fgr

POLICY = "qdq-accelerator"
T = TypeVar("T")


def timed(step: Callable[[], T]) -> Tuple[T, float]:
    """``step()`` and the seconds it took."""
    start = time.perf_counter()
    value = step()
    return value, time.perf_counter() - start


def main() -> None:
    model = onnx_models.make_qdq_cnn(seed=0, float_weights=True)
    fq2i = relay.transform.InferType()(
        relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(model))
    )
    n_quantized = len(byoc.quantized_calls(fq2i["main"]))
    print(
        f"QDQ CNN after FakeQuantizationToInteger: {n_quantized} quantized convs/denses, "
        f"backend {byoc.NPU_TARGET!r}"
    )
    print()

    # 1. Fold, then partition.
    ours, ours_seconds = timed(lambda: fgr.fold(fq2i, policy=POLICY, strict=True))
    rows = [
        ("stock FoldConstant()", *timed(lambda: relay.transform.FoldConstant()(fq2i))),
        (
            "stock FoldConstant(fold_qnn=True)",
            *timed(lambda: relay.transform.FoldConstant(fold_qnn=True)(fq2i)),
        ),
        (f"fold_guard FoldConstant({POLICY!r})", ours.mod, ours_seconds),
    ]
    print("1. fold before partitioning")
    print(
        f"{'fold':44s} {'fold time':>9s}  {'offloaded with int8 constant weight':>35s}  {'external functions':>18s}"
    )
    for name, folded, seconds in rows:
        partitioned = byoc.partition_for_qnn_npu(folded)
        offload = byoc.count_offloaded(partitioned)
        external = len(byoc.external_functions(partitioned))
        print(f"{name:44s} {seconds:>7.3f} s  {offload!s:>35s}  {external:>18d}")
    print()
    print(f"fold_guard's plan ({POLICY}):")
    print(ours.plan.explain(verbose=False))
    kept = [d for d in ours.plan.kept if d.reason.text != "not constant"]
    print(
        f"folded: {len(ours.plan.folded)} x {', '.join(sorted({d.op for d in ours.plan.folded}))}; "
        f"constant but kept: {len(kept)}"
    )
    print()

    # 2. Partition, then fold each external function in the codegen.
    first = byoc.partition_for_qnn_npu(fq2i, fold_in_codegen=True)
    before = byoc.count_offloaded(first)
    print("2. partition first, fold in the codegen")
    print(
        f"partitioned before folding: {before.offloaded} of {before.total} quantized convs/denses offloaded, "
        f"{before.int8_weights} with an int8 constant weight"
    )
    codegen = byoc.QnnNpuCodegen(policy=POLICY)
    feed = onnx_models.sample_input(seed=1)
    with byoc.registered_codegen(codegen):
        output = onnx_models.run_relay(first, feed)[0]
    ready = sum(
        byoc.has_int8_constant_weight(call)
        for func in codegen.folded
        for call in byoc.quantized_calls(func)
    )
    total = sum(len(byoc.quantized_calls(func)) for func in codegen.folded)
    print(
        f"the codegen folded {len(codegen.folded)} external functions with fold_function: "
        f"{ready} of {total} offloaded convs/denses now have an int8 constant weight"
    )
    unfolded = onnx_models.run_relay(fq2i, feed)[0]
    reference = onnx_models.run_onnxruntime(model, feed)[0]
    # The FQ2I module computes in integers, which round differently from the float reference.
    atol = onnx_models.output_atol(model, onnx_models.INTEGER_TOLERANCE_STEPS)
    error = float(np.max(np.abs(output - reference)))
    print(
        f"partitioned module vs the unfolded module: {'identical' if np.array_equal(output, unfolded) else 'DIFFERENT'}"
    )
    status = "ok" if error <= atol else f"ABOVE tolerance {atol:.4g}"
    print(f"partitioned module vs onnxruntime: max |diff| {error:.6f} (atol {atol:.6f}): {status}")


if __name__ == "__main__":
    main()
