"""After FakeQuantizationToInteger: fold the weights FQ2I leaves as qnn.quantize(<fp32 constant>).

A small CNN is built in ONNX and quantized to QDQ form by onnxruntime, with its weights left as
fp32 initializers feeding QuantizeLinear. Imported into Relay and run through
``relay.transform.FakeQuantizationToInteger``, it becomes ``qnn.conv2d`` / ``qnn.dense`` /
``qnn.requantize``, but every weight is still ``qnn.quantize(<fp32 constant>)``:

* stock ``FoldConstant()`` keeps them (it never evaluates QNN ops), so no quantized op has a
  constant int8 weight;
* stock ``FoldConstant(fold_qnn=True)`` folds them, and with them every other all-constant QNN op;
* ``fold_guard.relay.allow_constant_qnn(mod)`` marks exactly those constant QNN subgraphs with
  ``fold_allow``, and one ``fold_guard.relay.FoldConstant()`` folds what is marked and nothing else.

The table counts, for each, the ``qnn.quantize`` calls of constants left and the quantized
convs / denses with an int8 constant weight, with the time each fold took (2 shared cores: expect
+-30% run to run). fold_guard's module is then built for the CPU and checked against the unfolded
module (bit for bit) and onnxruntime (within the output's quantization step tolerance).

Needs the Relay environment (Python 3.10, hhb-tvm). Run from the repository root:

    .venv310/bin/python examples/fq2i_post_step.py
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable, List, Tuple

import numpy as np
import tvm
from _common import onnx_models
from _common.relay_byoc import has_int8_constant_weight, quantized_calls
from tvm import relay

import fold_guard.relay as fgr
from fold_guard import FoldPlan, Reason


def count_calls(mod: tvm.IRModule, op_name: str, *, constant_args: bool = False) -> int:
    """Calls of ``op_name`` in ``main`` (with ``constant_args``: only those whose arguments are all constants)."""
    count = 0

    def visit(expr: relay.Expr) -> None:
        nonlocal count
        if (
            isinstance(expr, relay.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == op_name
            and (not constant_args or all(isinstance(arg, relay.Constant) for arg in expr.args))
        ):
            count += 1

    relay.analysis.post_order_visit(mod["main"], visit)
    return count


def summarize(plan: FoldPlan) -> str:
    """What folded, and what was constant but kept (and why), by op."""
    folded = Counter(d.op for d in plan.folded)
    kept = Counter(
        f"{d.op} ({d.reason.text})"
        for d in plan.decisions
        if d.reason not in (Reason.FOLDED, Reason.NOT_CONSTANT)
    )
    return (
        f"folded: {', '.join(f'{n} {op}' for op, n in sorted(folded.items())) or 'nothing'}; "
        f"constant but kept: {', '.join(f'{n} {op}' for op, n in sorted(kept.items())) or 'nothing'}"
    )


def timed(step: Callable[[], tvm.IRModule]) -> Tuple[tvm.IRModule, float]:
    start = time.perf_counter()
    mod = step()
    return mod, time.perf_counter() - start


def main() -> None:
    model = onnx_models.make_qdq_cnn(seed=0, float_weights=True)
    fq2i = relay.transform.InferType()(
        relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(model))
    )
    n_quantized = len(quantized_calls(fq2i["main"]))

    stock, stock_seconds = timed(lambda: relay.transform.FoldConstant()(fq2i))
    stock_qnn, stock_qnn_seconds = timed(lambda: relay.transform.FoldConstant(fold_qnn=True)(fq2i))
    start = time.perf_counter()
    annotated = fgr.allow_constant_qnn(fq2i)
    # fold() is what the fgr.FoldConstant() pass runs; it also returns the plan and report.
    result = fgr.fold(annotated)
    ours_seconds = time.perf_counter() - start

    print(f"QDQ CNN after FakeQuantizationToInteger: {n_quantized} quantized convs/denses")
    print(
        f"allow_constant_qnn wrapped {count_calls(annotated, 'fold_allow')} constant QNN subgraphs in fold_allow"
    )
    print()
    print("== fold_guard FoldConstant() after allow_constant_qnn ==")
    print(result.report.explain(verbose=False))
    print(summarize(result.plan))
    print()
    rows: List[Tuple[str, tvm.IRModule, str]] = [
        ("FQ2I output (no fold)", fq2i, "-"),
        ("stock FoldConstant()", stock, f"{stock_seconds:.3f} s"),
        ("stock FoldConstant(fold_qnn=True)", stock_qnn, f"{stock_qnn_seconds:.3f} s"),
        ("fold_guard allow_constant_qnn+FoldConstant()", result.mod, f"{ours_seconds:.3f} s"),
    ]
    print(f"{'module':46s} {'quantize(const)':>15s} {'int8 const weights':>19s} {'fold time':>10s}")
    for name, mod, seconds in rows:
        calls = quantized_calls(mod["main"])
        ready = sum(has_int8_constant_weight(call) for call in calls)
        quantizes = count_calls(mod, "qnn.quantize", constant_args=True)
        print(f"{name:46s} {quantizes:>15d} {f'{ready} of {len(calls)}':>19s} {seconds:>10s}")
    same = tvm.ir.structural_equal(result.mod, stock_qnn, map_free_vars=True)
    print(
        f"fold_guard's module {'equals' if same else 'differs from'} stock fold_qnn=True's "
        "(here the weight quantizes are the only constant QNN calls)"
    )
    print()

    feed = onnx_models.sample_input(seed=1)
    unfolded = onnx_models.run_relay(fq2i, feed)[0]
    folded = onnx_models.run_relay(result.mod, feed)[0]
    reference = onnx_models.run_onnxruntime(model, feed)[0]
    # The FQ2I module computes in integers, which round differently from the float reference.
    atol = onnx_models.output_atol(model, onnx_models.INTEGER_TOLERANCE_STEPS)
    error = float(np.max(np.abs(folded - reference)))
    identical = "identical" if np.array_equal(folded, unfolded) else "DIFFERENT"
    print(f"fold_guard's module vs the unfolded module: {identical}")
    status = "ok" if error <= atol else f"ABOVE tolerance {atol:.4g}"
    print(f"fold_guard's module vs onnxruntime: max |diff| {error:.6f} (atol {atol:.6f}): {status}")


if __name__ == "__main__":
    main()
