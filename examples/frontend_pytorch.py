"""PyTorch PT2E models into Relax, with their weights kept int8 behind their dequantize.

Four small models (conv, linear, depthwise, residual: ``_common/torch_models.py``) are quantized
with PyTorch's PT2E flow (``torchao``: ``prepare_pt2e`` / ``convert_pt2e`` with the XNNPACK
quantizer, per-channel int8 weights), exported, and imported with
``from_exported_program(..., custom_convert_map=torch_quantized_convert_map())``. Each import is
folded by stock ``FoldConstant`` and by ``fold_guard.relax.FoldConstant("keep-qdq-weights")``;
both are built and compared with the PyTorch model's own output. One model converted with
``fold_quantize=False`` shows ``quantize(<float32 weight>)`` folding into int8.

Needs torch 2.13 (CPU) and torchao (the ``test`` extra installs both).

Run: python examples/frontend_pytorch.py
"""

from __future__ import annotations

import warnings

import numpy as np
import tvm
from _common import torch_models
from _common.relax_calls import calls_of
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

import fold_guard.relax as fgr
from fold_guard.relax.frontends import torch_quantized_convert_map


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    (out,) = vm["main"](tvm.runtime.tensor(x))  # PyTorch imports return a tuple
    return out.numpy()


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export's own pytree notes
    header = (
        f"{'model':10s} {'module':30s} {'quantize(const)':>15s} {'int8 weight DQ':>15s} "
        f"{'max |out - torch|':>18s}"
    )
    print(header)
    cases = [(name, True) for name in torch_models.MODELS] + [("residual", False)]
    for name, fold_quantize in cases:
        model = torch_models.quantize_model(name, seed=0, fold_quantize=fold_quantize)
        mod = from_exported_program(
            model.exported, custom_convert_map=torch_quantized_convert_map()
        )
        reference = model.run_torch(model.example)
        label = name if fold_quantize else f"{name}*"
        rows = [
            ("imported", mod),
            ("stock FoldConstant", relax.transform.FoldConstant()(mod)),
            ("fold_guard keep-qdq-weights", fgr.FoldConstant("keep-qdq-weights")(mod)),
        ]
        outputs = {}
        for module_name, module in rows:
            outputs[module_name] = run(module, model.example)
            error = float(np.abs(outputs[module_name] - reference).max())
            quantizes = calls_of(module, "relax.quantize", on_constant=True)
            weights = calls_of(module, "relax.dequantize", dtype="int8")
            print(
                f"{label:10s} {module_name:30s} {len(quantizes):>15d} "
                f"{len(weights):>15d} {error:>18.6f}"
            )
        same = outputs["fold_guard keep-qdq-weights"].tobytes() == outputs["imported"].tobytes()
        print(
            f"{label:10s} keep-qdq-weights vs imported: {'bit-identical' if same else 'DIFFERENT'}"
        )
    print("* converted with convert_pt2e(fold_quantize=False): weights as quantize(<float32>)")


if __name__ == "__main__":
    main()
