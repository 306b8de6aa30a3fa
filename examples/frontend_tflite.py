"""TFLite models into Relax: full int8, int8 weights behind DEQUANTIZE, float16 weights.

The models are written without TensorFlow (``_common/tflite_models.py``,
``_common/tflite_weights.py``). TVM 0.27's ``from_tflite`` fails on int8 weights behind a
DEQUANTIZE operator; ``from_tflite(..., op_converter=TFLiteOperatorConverter)`` imports them. Each
import is folded by stock ``FoldConstant`` and by ``fold_guard.relax.FoldConstant`` under
``keep-qdq-weights`` (which also keeps float16 weight casts), built, and compared with a NumPy
reference: the integer model for full int8, the float network on the stored weights otherwise.

Run: python examples/frontend_tflite.py
"""

from __future__ import annotations

import numpy as np
import tvm
from _common import tflite_models, tflite_weights
from _common.relax_calls import calls_of
from tvm import relax

import fold_guard.relax as fgr
from fold_guard.relax.frontends import TFLiteOperatorConverter


def weight_forms(mod: tvm.IRModule) -> str:
    """How the weights reach the graph: ``dequantize(<int8>)`` and ``astype(<float16>)`` counts."""
    counts = {
        "int8 DQ": len(calls_of(mod, "relax.dequantize", dtype="int8")),
        "float16 cast": len(calls_of(mod, "relax.astype", dtype="float16")),
    }
    return ", ".join(f"{n} {name}" for name, n in counts.items() if n) or "-"


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def main() -> None:
    full = tflite_models.make_quantized_tflite_model(0)
    models = {
        "full-int8": (full.buffer, lambda x: tflite_models.reference_output(full, x)),
    }
    for form in ("int8-dequantize", "float16-dequantize"):
        model = tflite_weights.make_weight_form_model(form, seed=0)
        models[form] = (
            model.buffer,
            lambda x, model=model: tflite_weights.reference_output(model, x),
        )
    x = np.random.default_rng(1).standard_normal(tflite_weights.INPUT_SHAPE).astype(np.float32)

    for form, (buffer, _) in models.items():
        try:
            tflite_weights.import_tflite_relax(buffer)
            status = "imports"
        except KeyError as err:
            status = f"fails: KeyError {err}"
        print(f"{form:20s} TVM's from_tflite: {status}")
    print()
    print(
        f"{'model':20s} {'module':30s} {'weights':28s} {'constant bytes':>14s} "
        f"{'max |out - numpy|':>18s}"
    )
    for form, (buffer, reference) in models.items():
        mod = tflite_weights.import_tflite_relax(buffer, TFLiteOperatorConverter)
        want = reference(x)
        outputs = {}
        for name, policy in (
            ("stock FoldConstant", None),
            ("fold_guard keep-qdq-weights", "keep-qdq-weights"),
        ):
            # Under "default" fold_guard's module is stock's (structurally equal), so its report
            # gives stock's constant bytes too.
            result = fgr.fold(mod, policy=policy or "default")
            module = relax.transform.FoldConstant()(mod) if policy is None else result.mod
            outputs[name] = run(module, x)
            print(
                f"{form:20s} {name:30s} {weight_forms(module):28s} "
                f"{result.report.constant_bytes_after:>14d} "
                f"{float(np.abs(outputs[name] - want).max()):>18.6f}"
            )
        same = outputs["fold_guard keep-qdq-weights"].tobytes() == run(mod, x).tobytes()
        print(
            f"{form:20s} keep-qdq-weights vs unfolded: {'bit-identical' if same else 'DIFFERENT'}"
        )


if __name__ == "__main__":
    main()
