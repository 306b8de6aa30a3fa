"""TVM's own Relax pattern tables on QDQ models: what each fold flow lets them offload.

Each in-tree table of ``apache-tvm`` 0.27 is run as far as it goes without its device:
pattern matching and partitioning need none, only the codegen step does.

* ``example_npu`` (``relax.backend.contrib.example_npu``): ``FuseOpsByPattern`` over its
  registered patterns, then ``MergeCompositeFunctions``.
* ``nnapi``: ``partition_for_nnapi`` (``bind_constants=False``: constants become composite
  arguments).
* ``cublas``: ``partition_for_cublas(bind_constants=True)``.
* ``clml``: the passes of ``relax.backend.adreno.clml.OpenCLMLOffLoad`` up to
  ``MergeCompositeFunctions`` (its stock ``FoldConstant`` included); its last step,
  ``RunCodegen``, needs the OpenCLML codegen, which the PyPI build does not have.

Every weight operand in these tables is a ``wildcard()``, so the flows differ in what the
composite receives. ``+absorb`` marks a table extended by ``fold_guard.relax.
absorb_weight_dequantize``, whose weight operand also takes ``dequantize(<const>, <const>,
<const>)``. Three flows per table, each with the policy the backend should use (``default`` for
tables whose codegen computes in float, ``qdq-accelerator`` for one that takes quantized weights):

* ``stock``: stock ``relax.transform.FoldConstant()``, then the partitioner;
* ``fold``: ``fold_guard.relax.fold(mod, policy=...)``, then the partitioner;
* ``annotate``: ``annotate(mod, policy=...)``, a pipeline's stock ``FoldConstant``, then
  ``fold_guard.relax.partition(mod, partitioner)`` (barriers released, no fold inside).

A cell is ``offloaded/bound/int8``: quantized convs + matmuls inside a composite, of those how
many take their weight as a constant bound in the composite, and how many of those as
``dequantize(<int8 const>)``; ``of`` is how many quantized layers the table has patterns for. The
last column says whether the ``annotate`` flow's partition left the rest of the module as it was
(the same op calls, only regrouped into composites).

Run from the repository root: ``python examples/intree_tables.py [--models qdq_cnn,...]`` (the
real-model shapes, ResNet-50 and BERT-tiny, take a few minutes: onnxruntime quantizes them and the
stock fold is slow).
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import tvm
from _common import onnx_models
from tvm import relax
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

import fold_guard.relax as fgr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import real_models
import tvm.relax.backend.contrib.example_npu
from tvm.relax.backend.adreno import clml
from tvm.relax.backend.contrib import nnapi
from tvm.relax.backend.cuda import cublas

T = relax.transform
#: The quantized layers: ops whose argument 1 is a weight.
LAYER_OPS = ("relax.nn.conv2d", "relax.matmul")
Partitioner = Callable[[tvm.IRModule], tvm.IRModule]


def _example_npu(absorb: bool) -> Partitioner:
    def partition(mod: tvm.IRModule) -> tvm.IRModule:
        patterns = get_patterns_with_prefix("example_npu")
        if absorb:
            patterns = fgr.absorb_weight_dequantize(patterns)
        return T.MergeCompositeFunctions()(T.FuseOpsByPattern(patterns)(mod))

    return partition


def _nnapi_absorbed(mod: tvm.IRModule) -> tvm.IRModule:
    """``partition_for_nnapi`` with the absorbed table (and constants bound, as absorbing means)."""
    patterns = fgr.absorb_weight_dequantize(get_patterns_with_prefix("nnapi"))
    return T.MergeCompositeFunctions()(T.FuseOpsByPattern(patterns, annotate_codegen=False)(mod))


def _clml(absorb: bool) -> Partitioner:
    def partition(mod: tvm.IRModule) -> tvm.IRModule:
        table = clml.clml_pattern_table()
        if absorb:
            table = fgr.absorb_weight_dequantize(table)
        return tvm.transform.Sequential(
            [
                T.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]}),
                T.Normalize(),
                T.FoldBatchnormToConv2D(),
                clml.AppendReshapeToBNRewriterPass(),
                T.FoldConstant(),
                T.FuseOpsByPattern(table),
                T.MergeCompositeFunctions(),
            ]
        )(mod)

    return partition


@dataclass(frozen=True)
class Table:
    """A pattern table as a partitioner, the policy its backend should use, the ops it covers."""

    partition: Partitioner
    policy: str
    ops: Tuple[str, ...]


TABLES: Dict[str, Table] = {
    "example_npu": Table(_example_npu(False), "default", LAYER_OPS),
    "example_npu+absorb": Table(_example_npu(True), "qdq-accelerator", LAYER_OPS),
    "nnapi": Table(nnapi.partition_for_nnapi, "default", LAYER_OPS),
    "nnapi+absorb": Table(_nnapi_absorbed, "qdq-accelerator", LAYER_OPS),
    "cublas": Table(
        lambda mod: cublas.partition_for_cublas(mod, True), "default", ("relax.matmul",)
    ),
    "clml": Table(_clml(False), "default", ("relax.nn.conv2d",)),
    "clml+absorb": Table(_clml(True), "qdq-accelerator", ("relax.nn.conv2d",)),
}


def load_model(name: str) -> tvm.IRModule:
    """The QDQ model ``name`` (fp32 weights feeding QuantizeLinear), imported into Relax."""
    if name in onnx_models.MODEL_BUILDERS:
        model = onnx_models.MODEL_BUILDERS[name](0, float_weights=True)
    else:
        model = real_models.build_quantized(name, "float_weights")
    return onnx_models.import_relax(model)


# ------------------------------------------------------------------------------ reading modules


def _bindings(func: relax.Function) -> Dict[relax.Var, relax.Expr]:
    return {
        binding.var: binding.value
        for block in func.body.blocks
        for binding in block.bindings
        if isinstance(binding, relax.VarBinding)
    }


def _op_name(expr: relax.Expr) -> str:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return str(expr.op.name)
    return ""


def _through(
    expr: relax.Expr, values: Dict[relax.Var, relax.Expr], ops: Sequence[str]
) -> relax.Expr:
    """``expr`` with variables replaced by their values and calls of ``ops`` looked through."""
    while True:
        if isinstance(expr, relax.Var) and expr in values:
            expr = values[expr]
        elif _op_name(expr) in ops:
            expr = expr.args[0]
        else:
            return expr


def _functions(mod: tvm.IRModule) -> List[relax.Function]:
    """Every Relax function of ``mod``, nested ones (composites) included."""
    found: List[relax.Function] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Function):
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def quantized_layers(mod: tvm.IRModule, ops: Sequence[str]) -> int:
    """Calls of ``ops`` whose weight is ``dequantize`` of a constant, or of its ``quantize``."""
    count = 0
    for func in _functions(mod):
        values = _bindings(func)
        for value in values.values():
            if _op_name(value) in ops:
                weight = _through(value.args[1], values, ("relax.permute_dims",))
                if _op_name(weight) == "relax.dequantize":
                    source = _through(
                        weight.args[0], values, ("relax.quantize", "relax.fold_barrier")
                    )
                    count += isinstance(source, tvm.ir.GenericConst)
    return count


@dataclass(frozen=True)
class Offload:
    offloaded: int
    bound: int
    int8: int

    def __str__(self) -> str:
        return f"{self.offloaded}/{self.bound}/{self.int8}"


def offload(mod: tvm.IRModule, ops: Sequence[str]) -> Offload:
    """Layers inside composites; of those with a bound constant weight; of those int8 ones."""
    offloaded = bound = int8 = 0
    for func in _functions(mod):
        if not (func.attrs and "Composite" in func.attrs):
            continue
        values = _bindings(func)
        for value in values.values():
            if _op_name(value) not in ops:
                continue
            offloaded += 1
            weight = _through(value.args[1], values, ("relax.permute_dims",))
            if isinstance(weight, tvm.ir.GenericConst):
                bound += 1
            elif _op_name(weight) == "relax.dequantize" and isinstance(
                weight.args[0], tvm.ir.GenericConst
            ):
                bound += 1
                int8 += str(weight.args[0].value.dtype) == "int8"
    return Offload(offloaded, bound, int8)


def op_calls(mod: tvm.IRModule, name: str = "main") -> collections.Counter:
    """How many op calls running function ``name`` makes, calls into functions (codegen
    regions, composites) followed: partitioning moves calls into functions, and identical
    composites may share one function, so the calls are counted where they are made."""
    return _calls_made(mod, mod[name])


def _calls_made(mod: tvm.IRModule, func: relax.Function) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    local = {
        var: value for var, value in _bindings(func).items() if isinstance(value, relax.Function)
    }
    values = [value for value in _bindings(func).values()] + [func.body.body]
    for value in values:
        if not isinstance(value, relax.Call):
            continue
        callee = local.get(value.op, value.op)
        if isinstance(callee, tvm.ir.Op):
            counts[str(callee.name)] += 1
        elif isinstance(callee, relax.GlobalVar) and isinstance(mod[callee], relax.Function):
            counts += _calls_made(mod, mod[callee])
        elif isinstance(callee, relax.Function):
            counts += _calls_made(mod, callee)
    return counts


# ------------------------------------------------------------------------------ the flows


class Flows:
    """The folded modules of one imported model, each made once: stock, and per policy ``fold``
    and ``annotate`` followed by a pipeline's stock ``FoldConstant``."""

    def __init__(self, imported: tvm.IRModule) -> None:
        self.imported = imported
        self.stock = T.FoldConstant()(imported)
        self._folded: Dict[str, tvm.IRModule] = {}
        self._piped: Dict[str, tvm.IRModule] = {}

    def folded(self, policy: str) -> tvm.IRModule:
        if policy not in self._folded:
            self._folded[policy] = fgr.fold(self.imported, policy=policy).mod
        return self._folded[policy]

    def piped(self, policy: str) -> tvm.IRModule:
        if policy not in self._piped:
            annotated = fgr.annotate(self.imported, policy=policy).mod
            self._piped[policy] = T.FoldConstant()(annotated)
        return self._piped[policy]


def run_flows(flows: Flows, table: Table) -> Dict[str, object]:
    """The three flows of one table on one model, and whether partition left the rest alone."""
    piped = flows.piped(table.policy)
    result = fgr.partition(piped, table.partition)
    return {
        "could take": quantized_layers(flows.imported, table.ops),
        "stock": offload(table.partition(flows.stock), table.ops),
        "fold": offload(table.partition(flows.folded(table.policy)), table.ops),
        "annotate": offload(result.mod, table.ops),
        "rest unchanged": op_calls(result.mod) == op_calls(fgr.release_barriers(piped)),
        "skipped": result.skipped,
    }


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="qdq_cnn,residual_cnn,transformer_block,resnet50,bert_tiny"
    )
    parser.add_argument("--tables", default=",".join(TABLES))
    args = parser.parse_args(list(argv))
    print(
        f"{'table':19s} {'policy':16s} {'model':18s} {'of':>3s} {'stock':>9s} {'fold':>9s} "
        f"{'annotate':>9s}  rest unchanged"
    )
    for model_name in args.models.split(","):
        flows = Flows(load_model(model_name))
        for table_name in args.tables.split(","):
            table = TABLES[table_name]
            row = run_flows(flows, table)
            print(
                f"{table_name:19s} {table.policy:16s} {model_name:18s} {row['could take']:>3d} "
                f"{row['stock']!s:>9s} {row['fold']!s:>9s} {row['annotate']!s:>9s}  "
                f"{'yes' if row['rest unchanged'] else 'NO'}"
                + (f" (skipped {', '.join(row['skipped'])})" if row["skipped"] else "")
            )


if __name__ == "__main__":
    main(sys.argv[1:])
