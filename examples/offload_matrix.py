"""TVM's own Relax pattern tables decide the fold: ``backend_policy`` against every other flow.

For each (table, model) cell, the calls the table offloads (``fold_guard.relax.explain_offload``'s
rows: calls of an op some pattern is built around that read run-time data) under stock
``relax.transform.FoldConstant``, every built-in policy and ``fold_guard.relax.backend_policy(
table)``, each followed by the table's ``FuseOpsByPattern`` (checks included; no device needed).
``ok`` says that backend_policy offloads at least as many as the best other flow, leaves no
dequantize of a constant to run time outside a composite, and gives every missed call a reason.

Tables: ``example_npu``, ``nnapi``, ``cublas``, ``clml`` (its ``OpenCLMLOffLoad`` pass list up
to ``MergeCompositeFunctions``: layout conversion, batch-norm folding and its reshape rewrite run
on the import, the flow's fold replaces its ``FoldConstant``), and ``cutlass.decode_matmul`` on
``examples/lowbit_llm.py``'s modules. Models: the examples' QDQ CNN (onnxruntime's defaults:
uint8 activations, per-channel weights; fp32 weights feeding QuantizeLinear), its per-tensor
int8-activation variant, and the ResNet-50, MobileNetV2 and BERT-tiny shapes of
``bench/real_models.py`` (``--scale N`` divides their widths); for CUTLASS the q4f16_1 decoder
block (MLC-LLM's layout) and TVM's CUTLASS-style encode -> decode -> matmul with the weight as
a parameter (``num_input``, lifted by ``LiftTransformParams``).

Run from the repository root: ``python examples/offload_matrix.py`` (every cell: several minutes
on 2 cores), ``--models qdq_cnn --tables clml --details`` for one, with two missed calls' reasons.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tvm
from _common import lowbit_llm, onnx_models
from _common.offload_cells import Cell, format_cells, measure
from tvm import relax

import fold_guard.relax as fgr
from fold_guard.relax._offload import ADAPTER
from fold_guard.relax._offload.table import resolve_table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import real_models

T = relax.transform


def _qdq_cnn_s8() -> tvm.IRModule:
    model = onnx_models.make_qdq_cnn(
        0, float_weights=True, activation_type="int8", per_channel=False
    )
    return onnx_models.import_relax(model)


def _real(name: str, scale: int) -> Callable[[], tvm.IRModule]:
    return lambda: onnx_models.import_relax(
        real_models.build_quantized(name, "float_weights", scale=scale)
    )


def models(scale: int) -> Dict[str, Callable[[], tvm.IRModule]]:
    """Model name -> its Relax import (built when called)."""
    return {
        "qdq_cnn": lambda: onnx_models.import_relax(
            onnx_models.make_qdq_cnn(0, float_weights=True)
        ),
        "qdq_cnn_s8": _qdq_cnn_s8,
        "resnet50": _real("resnet50", scale),
        "mobilenet_v2": _real("mobilenet_v2", scale),
        "bert_tiny": _real("bert_tiny", scale),
        "lowbit_block": lambda: lowbit_llm.build_decoder_block(
            hidden=64, intermediate=128, heads=2
        ),
        "cutlass_style": lambda: lowbit_llm.build_cutlass_style_module(k=64, n=96),
    }


#: The models each table runs on (CUTLASS's decode_matmul on the low-bit modules only).
LOWBIT = ("lowbit_block", "cutlass_style")


def clml_prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """``OpenCLMLOffLoad``'s passes before its ``FoldConstant`` (the flow folds instead)."""
    from tvm.relax.backend.adreno import clml

    return tvm.transform.Sequential(
        [
            T.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]}),
            T.Normalize(),
            T.FoldBatchnormToConv2D(),
            clml.AppendReshapeToBNRewriterPass(),
        ]
    )(mod)


#: table -> (the name backend_policy takes, the preparation of the import, the models)
TABLES: Dict[str, Tuple[str, Callable[[tvm.IRModule], tvm.IRModule], bool]] = {
    "example_npu": ("example_npu", lambda mod: mod, False),
    "nnapi": ("nnapi", lambda mod: mod, False),
    "cublas": ("cublas", lambda mod: mod, False),
    "clml": ("clml", clml_prepare, False),
    "cutlass.decode_matmul": ("cutlass.decode_matmul", lambda mod: mod, True),
}


def cell(model: str, mod: tvm.IRModule, table: str) -> Cell:
    """The cell of ``table`` (a :data:`TABLES` key) on ``mod``."""
    name, prepare, _ = TABLES[table]
    return measure(ADAPTER, model, prepare(mod), resolve_table(name), name, fgr.backend_policy)


def run(
    model_names: Sequence[str], tables: Sequence[str], scale: int, *, details: bool = False
) -> List[Cell]:
    """Every cell of ``model_names`` x ``tables``, each printed as soon as it is measured."""
    builders = models(scale)
    cells: List[Cell] = []
    print(format_cells([]), flush=True)
    for model in model_names:
        mod = builders[model]()
        for table in tables:
            if TABLES[table][2] == (model in LOWBIT):
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
    np.random.seed(0)
    cells = run(args.models.split(","), args.tables.split(","), args.scale, details=args.details)
    if not all(c.ok for c in cells):
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
