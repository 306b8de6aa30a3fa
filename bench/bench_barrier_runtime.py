"""What a fold_barrier costs at run time: the same folded model built with and without barriers.

For each QDQ model (weights as fp32 initializers feeding QuantizeLinear, quantized by onnxruntime
in the run):

* ``barriers``: ``annotate(mod, policy="qdq-accelerator")`` then fold_guard's ``FoldConstant()``: every
  weight and bias is ``dequantize(fold_barrier(<int const>))``;
* ``plain``: ``fold(mod, policy="qdq-accelerator")``: the same folds, no annotations;
* ``stock``: stock ``relax.transform.FoldConstant()``: the weights folded to fp32 (no Q/DQ left).

Each is built with ``tvm.compile(target="llvm")``. The script prints the VM's time per inference
(``time_evaluator``, min over repeats) with the ratios barriers / plain and barriers / stock, the
bytes of storage the VM allocates (summed over ``relax.vm.alloc_storage`` in the module VM codegen
receives), and the number of barrier views (``vm.builtin.reshape`` of a constant). A barrier is a
view, so storage must be equal to ``plain``'s and the time ratio within noise of 1.0. The outputs
of all three are compared: ``barriers`` and ``plain`` must be bit-identical.

Run: .venv/bin/python bench/bench_barrier_runtime.py [--number 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import tvm
from tvm import relax

ROOT = Path(__file__).resolve().parents[1]
# fold_guard from this checkout, and examples/_common: the QDQ ONNX models and the codegen-input
# instrument the examples, the benchmarks and the tests share.
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from _common import onnx_models  # noqa: E402
from _common.codegen_input import compile_with_codegen_input  # noqa: E402

import fold_guard.relax as fgr  # noqa: E402

MODELS = {
    "qdq_cnn": onnx_models.make_qdq_cnn,
    "residual_cnn": onnx_models.make_residual_cnn,
    "transformer_block": onnx_models.make_transformer_block,
}
VIEW_BUILTIN = "vm.builtin.reshape"


def _storage_bytes_and_views(mod: tvm.IRModule) -> Tuple[int, int]:
    totals = [0, 0]

    def visit(node: object) -> None:
        if not isinstance(node, relax.Call):
            return
        if isinstance(node.op, tvm.ir.Op) and node.op.name == "relax.vm.alloc_storage":
            totals[0] += int(np.prod([int(v) for v in node.args[0].values]))
        elif isinstance(node.op, relax.ExternFunc) and node.op.global_symbol == VIEW_BUILTIN:
            totals[1] += isinstance(node.args[0], tvm.ir.GenericConst)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return totals[0], totals[1]


def _measure(
    mod: tvm.IRModule, inputs: List[np.ndarray], number: int, repeat: int
) -> Dict[str, object]:
    exe, codegen_input = compile_with_codegen_input(mod)
    storage, views = _storage_bytes_and_views(codegen_input)
    device = tvm.cpu()
    vm = relax.VirtualMachine(exe, device)
    args = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs]
    output = vm["main"](*args).numpy()
    timer = vm.time_evaluator("main", device, number=number, repeat=repeat)
    seconds = min(timer(*args).results)
    return {"seconds": seconds, "storage": storage, "views": views, "output": output}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200, help="runs per timing (default 200)")
    parser.add_argument(
        "--repeat", type=int, default=5, help="timings; the minimum is kept (default 5)"
    )
    options = parser.parse_args()

    print(
        f"{'model':<18} {'variant':<9} {'us/run':>9} {'vs plain':>9} {'vs stock':>9} "
        f"{'storage B':>10} {'views':>6}  output"
    )
    failed = False
    for name, make in MODELS.items():
        model = make(float_weights=True)
        imported = onnx_models.import_relax(model)
        inputs = list(onnx_models.input_feed(model).values())
        variants = {
            "barriers": fgr.FoldConstant()(fgr.annotate(imported, policy="qdq-accelerator").mod),
            "plain": fgr.fold(imported, policy="qdq-accelerator").mod,
            "stock": relax.transform.FoldConstant()(imported),
        }
        results = {
            label: _measure(mod, inputs, options.number, options.repeat)
            for label, mod in variants.items()
        }
        same = np.array_equal(results["barriers"]["output"], results["plain"]["output"])
        same_storage = results["barriers"]["storage"] == results["plain"]["storage"]
        failed |= not (same and same_storage)
        for label, result in results.items():
            ratio_plain = result["seconds"] / results["plain"]["seconds"]
            ratio_stock = result["seconds"] / results["stock"]["seconds"]
            verdict = "bit-identical to plain" if label == "barriers" and same else ""
            if label == "barriers" and not same:
                verdict = "DIFFERENT from plain"
            print(
                f"{name:<18} {label:<9} {result['seconds'] * 1e6:>9.1f} {ratio_plain:>8.2f}x {ratio_stock:>8.2f}x "
                f"{result['storage']:>10} {result['views']:>6}  {verdict}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
