"""ONNX weights that arrive through requantize chains, folded into one int8 constant each.

``_common/onnx_chains.py`` writes a QDQ model whose conv weight (per channel) and matmul weight
(per tensor) are stored as int8 at one scale and requantized to another in the graph:
``DequantizeLinear(int8 W, s1) -> QuantizeLinear(s2) -> DequantizeLinear(s2) -> Conv / MatMul``.
Under ``keep-qdq-weights`` (and ``qdq-accelerator``) each chain folds to one int8 constant at
``s2`` with only the last dequantize kept; composed first, ``keep-requantize`` keeps the chain;
stock folds everything to float32. Every module is built and compared with onnxruntime.

Run: python examples/requantize_chains.py
"""

from __future__ import annotations

import numpy as np
from _common import onnx_chains, onnx_models
from _common.relax_calls import calls_of
from tvm import relax

import fold_guard.relax as fgr


def main() -> None:
    model = onnx_chains.make_requantize_chain_model(0)
    mod = onnx_models.import_relax(model)
    x = np.random.default_rng(1).standard_normal(onnx_chains.INPUT_SHAPE).astype(np.float32)
    reference = onnx_models.run_onnxruntime(model, {onnx_chains.INPUT_NAME: x})[0]

    result = fgr.fold(mod, policy="keep-qdq-weights")
    print("== keep-qdq-weights: its decision on every dequantize of a constant ==")
    for line in result.report.explain(verbose=True).splitlines():
        if "relax.dequantize: folded" in line or "relax.dequantize: kept by policy" in line:
            print(line)
    print()
    rows = [
        ("imported", mod),
        ("stock FoldConstant", relax.transform.FoldConstant()(mod)),
        ("keep-qdq-weights", result.mod),
        (
            "keep-requantize + keep-qdq-weights",
            fgr.FoldConstant(["keep-requantize", "keep-qdq-weights"])(mod),
        ),
    ]
    print(
        f"{'module':36s} {'quantize':>8s} {'dequantize':>10s} {'DQ(int8 const)':>14s} "
        f"{'max |out - onnxruntime|':>24s}"
    )
    unfolded = onnx_models.run_relax(mod, [x])[0]
    for name, module in rows:
        out = onnx_models.run_relax(module, [x])[0]
        same = "bit-identical to imported" if out.tobytes() == unfolded.tobytes() else "DIFFERENT"
        print(
            f"{name:36s} {len(calls_of(module, 'relax.quantize')):>8d} "
            f"{len(calls_of(module, 'relax.dequantize')):>10d} "
            f"{len(calls_of(module, 'relax.dequantize', dtype='int8')):>14d} "
            f"{float(np.abs(out - reference).max()):>24.6f}  {same}"
        )
    folded = [
        call.args[0].value.numpy()
        for call in calls_of(result.mod, "relax.dequantize", dtype="int8")
    ]
    want = onnx_chains.chain_weights(model)
    equal = all(np.array_equal(a, want[name]) for a, name in zip(folded, onnx_chains.CHAIN_WEIGHTS))
    print(f"folded int8 weights equal NumPy's requantization: {equal}")


if __name__ == "__main__":
    main()
