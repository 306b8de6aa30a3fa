"""TVM's own Relay pattern tables on quantized real models: what each fold flow lets them offload.

The MobileNetV2 (default), ResNet-50 or BERT-tiny shapes of ``bench/real_models.py``, quantized
by onnxruntime to QDQ form with int8 activations and per-tensor int8 weights (what CMSIS-NN and
Arm Compute Library take), weights stored in fp32 (``QuantizeLinear(<fp32>) -> DequantizeLinear``),
imported with Relay's ``from_onnx``, then ``FakeQuantizationToInteger`` and Arm Compute Library's
own ``preprocess_module`` (``ConvertLayout`` to NHWC / OHWI, then stock ``FoldConstant``). That
layout conversion leaves each bias as ``add(qnn.conv2d(...), <int32 (1, 1, 1, C)>)``, which
neither table matches (both want ``nn.bias_add``): :func:`bias_add_from_add` writes it back as
``nn.bias_add(..., axis=3)``, the same for every flow; Relay's ONNX importer gives a Gemm's bias
the same ``add`` after ``qnn.dense``, written back as ``nn.bias_add(..., axis=1)``.

Every weight is then ``qnn.quantize(<fp32 const>)`` (after the layout conversion,
``layout_transform(qnn.quantize(...))``) under a ``qnn.conv2d`` / ``qnn.dense``, and both tables
take the weight with ``is_constant()``. Three flows, then the table:

* ``stock``: stock ``FoldConstant()`` (it keeps every QNN op, so the quantize stays);
* ``fold``: ``fold_guard.relay.fold(mod, policy="qdq-accelerator")``;
* ``annotate``: ``annotate(mod, policy="qdq-accelerator")``, stock ``FoldConstant()`` (a
  pipeline), then ``fold_guard.relay.partition(mod, partitioner)``.

The tables, run as far as they go without their device or vendor library:

* ``arm_compute_lib``: ``partition_for_arm_compute_lib`` as it ships (pure Python).
* ``cmsis-nn``: the first passes of ``partition_for_cmsisnn`` (``MergeComposite``,
  ``AnnotateTarget``, ``PartitionGraph``); the rest (``GenerateCMSISNNConstants`` ...) are C++
  passes of a TVM built with CMSIS-NN, which hhb-tvm is not.
* ``ethos-n`` and ``dnnl`` are not run: ``partition_for_ethosn`` refuses to start without the
  Ethos-N driver stack and its pattern checks call the driver's support library; DNNL's QNN
  patterns need ``legalize_qnn_for_dnnl`` first, which folds in a ``PassContext`` of its own
  (``partition`` would refuse it: it cannot skip that fold).

A cell is ``offloaded/int8``: quantized convs + denses inside the backend's functions, and of those
how many take their weight as an int8 constant; ``of`` is how many the module has.

Needs the Relay environment (Python 3.10, hhb-tvm). Run from the repository root:
``.venv310/bin/python examples/relay_intree_tables.py [--model NAME] [--scale N]`` (``--scale 8``
divides every width by 8 for a quick run; a full model takes minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, Sequence, Tuple

import tvm
from _common import onnx_models
from tvm import relay
from tvm.relay.dataflow_pattern import DFPatternCallback, is_constant, is_op, rewrite, wildcard
from tvm.relay.op.contrib import arm_compute_lib, cmsisnn

import fold_guard.relay as fgr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import real_models

POLICY = "qdq-accelerator"
QUANTIZED_OPS = ("qnn.conv2d", "qnn.dense")
Partitioner = Callable[[tvm.IRModule], tvm.IRModule]


def _cmsisnn(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(
        [
            relay.transform.InferType(),
            relay.transform.MergeComposite(cmsisnn.pattern_table()),
            relay.transform.AnnotateTarget("cmsis-nn"),
            relay.transform.PartitionGraph(),
        ]
    )(mod)


#: (partitioner, the Compiler attribute of its functions)
TABLES: Dict[str, Tuple[Partitioner, str]] = {
    "arm_compute_lib": (arm_compute_lib.partition_for_arm_compute_lib, "arm_compute_lib"),
    "cmsis-nn": (_cmsisnn, "cmsis-nn"),
}


class _BiasAddFromAdd(DFPatternCallback):
    """``add(qnn.conv2d(...), <const (1, 1, 1, C)>)`` as ``nn.bias_add(qnn.conv2d(...), <C>, axis=3)``."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.conv = is_op("qnn.conv2d")(*[wildcard() for _ in range(6)])
        self.bias = is_constant()
        self.pattern = is_op("add")(self.conv, self.bias)

    def callback(self, pre, post, node_map):
        bias = node_map[self.bias][0]
        conv = node_map[self.conv][0]
        shape = tuple(int(d) for d in bias.data.shape)
        if len(shape) != 4 or shape[:3] != (1, 1, 1) or conv.attrs.data_layout != "NHWC":
            return post
        flat = relay.const(bias.data.numpy().reshape(shape[3]))
        return relay.nn.bias_add(conv, flat, axis=3)


class _DenseBiasAddFromAdd(DFPatternCallback):
    """``add(qnn.dense(...), <const (C,) or (1, C)>)`` as ``nn.bias_add(qnn.dense(...), <C>)``."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.dense = is_op("qnn.dense")(*[wildcard() for _ in range(6)])
        self.bias = is_constant()
        self.pattern = is_op("add")(self.dense, self.bias)

    def callback(self, pre, post, node_map):
        bias = node_map[self.bias][0]
        units = int(pre.checked_type.shape[-1])
        shape = tuple(int(d) for d in bias.data.shape)
        if shape not in ((units,), (1, units)) or len(pre.checked_type.shape) != 2:
            return post
        flat = relay.const(bias.data.numpy().reshape(units))
        return relay.nn.bias_add(node_map[self.dense][0], flat, axis=1)


def bias_add_from_add(mod: tvm.IRModule) -> tvm.IRModule:
    """Every NHWC conv bias and 2-D dense bias written as ``nn.bias_add`` (module docstring)."""
    mod = relay.transform.InferType()(mod)
    functions = {gvar: func for gvar, func in mod.functions.items()}
    main = mod.get_global_var("main")
    functions[main] = rewrite(_DenseBiasAddFromAdd(), rewrite(_BiasAddFromAdd(), mod["main"]))
    return relay.transform.InferType()(tvm.IRModule(functions, mod.type_definitions))


#: --model choices: name in bench/real_models.py -> the name printed
MODELS: Dict[str, str] = {
    "mobilenet_v2": "MobileNetV2",
    "resnet50": "ResNet-50",
    "bert_tiny": "BERT-tiny",
}


def load_model(scale: int = 1, model: str = "mobilenet_v2") -> tvm.IRModule:
    """``model``, s8 per-tensor, after FQ2I, ACL's layout conversion and :func:`bias_add_from_add`."""
    quantized = real_models.build_quantized(
        model, "float_weights", activation_type="int8", per_channel=False, scale=scale
    )
    mod = relay.transform.FakeQuantizationToInteger()(onnx_models.import_relay(quantized))
    with tvm.transform.PassContext(opt_level=3):
        mod = arm_compute_lib.preprocess_module(relay.transform.InferType()(mod))
    return bias_add_from_add(mod)


def quantized_calls(expr: relay.Expr) -> list:
    found = []
    relay.analysis.post_order_visit(
        expr,
        lambda e: (
            found.append(e)
            if isinstance(e, relay.Call)
            and isinstance(e.op, tvm.ir.Op)
            and e.op.name in QUANTIZED_OPS
            else None
        ),
    )
    return found


def offload(mod: tvm.IRModule, compiler: str) -> Tuple[int, int]:
    """(quantized calls in ``compiler``'s functions, those with an int8 constant weight)."""
    offloaded = int8 = 0
    for gvar in mod.get_global_vars():
        func = mod[gvar]
        attrs = func.attrs
        if attrs is None or "Compiler" not in attrs.keys() or str(attrs["Compiler"]) != compiler:
            continue
        for call in quantized_calls(func):
            offloaded += 1
            weight = call.args[1]
            int8 += isinstance(weight, relay.Constant) and str(weight.data.dtype) == "int8"
    return offloaded, int8


class Flows:
    """The three flows' modules of one model, each made once: stock ``FoldConstant``, ``fold``,
    and ``annotate`` followed by a pipeline's stock ``FoldConstant``."""

    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self.stock = relay.transform.FoldConstant()(mod)
        self.folded = fgr.fold(mod, policy=POLICY).mod
        self.piped = relay.transform.FoldConstant()(fgr.annotate(mod, policy=POLICY).mod)


def run_flows(flows: Flows, partitioner: Partitioner, compiler: str) -> Dict[str, object]:
    """Quantized calls offloaded per flow (``(offloaded, int8)``), and what partition released."""
    result = fgr.partition(flows.piped, partitioner)
    return {
        "of": len(quantized_calls(flows.mod["main"])),
        "stock": offload(partitioner(flows.stock), compiler),
        "fold": offload(partitioner(flows.folded), compiler),
        "annotate": offload(result.mod, compiler),
        "released": result.released,
    }


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mobilenet_v2")
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this")
    args = parser.parse_args(list(argv))
    flows = Flows(load_model(args.scale, args.model))
    print(
        f"{MODELS[args.model]} (width / {args.scale}), s8 per-tensor, FQ2I, NHWC; policy {POLICY!r}"
    )
    print(f"{'table':16s} {'of':>3s} {'stock':>7s} {'fold':>7s} {'annotate':>9s}")
    for name, (partitioner, compiler) in TABLES.items():
        row = run_flows(flows, partitioner, compiler)
        cells = [f"{row[flow][0]}/{row[flow][1]}" for flow in ("stock", "fold", "annotate")]
        print(f"{name:16s} {row['of']:>3d} {cells[0]:>7s} {cells[1]:>7s} {cells[2]:>9s}")


if __name__ == "__main__":
    main(sys.argv[1:])
