"""TVM's own Relay pattern tables decide the fold: ``backend_policy`` against every other flow.

The Relay half of ``examples/offload_matrix.py``: per (table, model) cell, the calls the table
offloads (``fold_guard.relay.explain_offload``'s rows) under stock ``FoldConstant``, every
built-in policy and ``fold_guard.relay.backend_policy(table)``, each followed by the table's
``MergeComposite`` (checks included; no device or vendor library needed). ``ok``: backend_policy
offloads at least the best other flow, leaves no ``qnn.dequantize`` of a constant to run time
outside a composite, and gives every missed call a reason.

Tables, as ``get_pattern_table`` has them: ``cmsis-nn``, ``arm_compute_lib``, ``ethos-n`` (its
checks ask the Ethos-N driver stack, which hhb-tvm lacks: they refuse, and say so) and
``dnnl``. Models, after ``FakeQuantizationToInteger`` and Arm Compute Library's
``preprocess_module`` (NHWC; a conv's bias ``add`` written back as ``nn.bias_add`` as in
``examples/relay_intree_tables.py``): the examples' QDQ CNN (onnxruntime's defaults: uint8
activations, per-channel weights: CMSIS-NN's and ACL's checks refuse it), its per-tensor
int8-activation variant, and the ResNet-50, MobileNetV2 and BERT-tiny shapes of
``bench/real_models.py`` quantized per-tensor with int8 activations (``--scale N`` divides
their widths).

Needs the Relay environment (Python 3.10, hhb-tvm). Run from the repository root:
``.venv310/bin/python examples/relay_offload_matrix.py [--models ...] [--tables ...] [--scale N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import onnx
import tvm
from _common import onnx_models
from _common.offload_cells import Cell, format_cells, measure
from relay_intree_tables import bias_add_from_add
from tvm import relay
from tvm.relay.op.contrib import arm_compute_lib

import fold_guard.relay as fgr
from fold_guard.relay._offload import ADAPTER
from fold_guard.relay._offload.table import resolve_table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import real_models

TABLES = ("cmsis-nn", "arm_compute_lib", "ethos-n", "dnnl")


def prepare(model: onnx.ModelProto) -> tvm.IRModule:
    """Relay import, ``FakeQuantizationToInteger``, ACL's layout conversion, ``nn.bias_add``."""
    mod = relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(model))
    with tvm.transform.PassContext(opt_level=3):
        mod = arm_compute_lib.preprocess_module(relay.transform.InferType()(mod))
    return bias_add_from_add(mod)


def _real(name: str, scale: int) -> Callable[[], onnx.ModelProto]:
    return lambda: real_models.build_quantized(
        name, "float_weights", activation_type="int8", per_channel=False, scale=scale
    )


def models(scale: int) -> Dict[str, Callable[[], onnx.ModelProto]]:
    """Model name -> its quantized ONNX model (built when called)."""
    return {
        "qdq_cnn": lambda: onnx_models.make_qdq_cnn(0, float_weights=True),
        "qdq_cnn_s8": lambda: onnx_models.make_qdq_cnn(
            0, float_weights=True, activation_type="int8", per_channel=False
        ),
        "resnet50": _real("resnet50", scale),
        "mobilenet_v2": _real("mobilenet_v2", scale),
        "bert_tiny": _real("bert_tiny", scale),
    }


def cell(model: str, mod: tvm.IRModule, table: str) -> Cell:
    return measure(ADAPTER, model, mod, resolve_table(table), table, fgr.backend_policy)


def run(
    model_names: Sequence[str], tables: Sequence[str], scale: int, *, details: bool = False
) -> List[Cell]:
    """Every cell of ``model_names`` x ``tables``, each printed as soon as it is measured."""
    builders = models(scale)
    cells: List[Cell] = []
    print(format_cells([]), flush=True)
    for model in model_names:
        mod = prepare(builders[model]())
        for table in tables:
            cells.append(cell(model, mod, table))
            print(format_cells(cells[-1:], details=details, header=False), flush=True)
    return cells


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models(1)))
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--scale", type=int, default=1, help="divide the real models' widths")
    parser.add_argument("--details", action="store_true", help="two missed calls' reasons")
    args = parser.parse_args(list(argv))
    cells = run(args.models.split(","), args.tables.split(","), args.scale, details=args.details)
    if not all(c.ok for c in cells):
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
