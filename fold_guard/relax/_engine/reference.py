"""The reference engine: each folded call legalized on its own, built, and run, in plan order.

This is what the stock pass does, minus the pass: a folded operator call is legalized for its
own static shapes (``_legalize.legalize_each``), its PrimFunc is built with ``tvm.tirx.build``
for ``llvm`` (once per distinct PrimFunc of the fold, nothing kept after it), and run on the
call's operands into new tensors. A ``call_tir`` runs the module's PrimFunc; ``fold_allow``
passes its operand on; ``tensor_to_shape`` reads the shape values. No cache, no threads, no
NumPy copies, no kernel shared between shapes, no optimization level of its own.

The fast engine must give these bits, NaN payloads included; the tests compare the two over
the equivalence corpus, the real-model shapes and the fuzzers, and the fast engine reruns a call
here when one of its mechanisms fails.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import relax

from ..._core.driver import pending_levels
from ..._core.graph import FoldGraph, FoldNode, TensorInfo
from ..._core.planner import FoldPlan, evaluation_error
from .. import _compat
from .._legalize import legalize_each
from .._sites import CallSite, KernelSpec, SiteKind
from .interface import EngineStats, Values

__all__ = ["REFERENCE_TARGET", "ReferenceEngine", "allocate", "leaf_values", "record_failure"]

#: What the stock pass builds its kernels for.
REFERENCE_TARGET = "llvm"


class ReferenceEngine:
    """The :class:`~fold_guard.relax._engine.interface.Engine` that is obviously right."""

    def __init__(self, mod: tvm.IRModule, graph: FoldGraph, sites: Sequence[CallSite]) -> None:
        self._mod = mod
        self._graph = graph
        self._sites = sites
        self._kernels: Dict[int, KernelSpec] = {}
        #: structural hash -> the distinct PrimFuncs built so far, with their compiled function
        self._built: Dict[int, List[Any]] = {}
        self.stats = EngineStats()

    def prepare(self, plan: FoldPlan) -> None:
        # One LegalizeOps for every folded call, then one build per distinct PrimFunc.
        self._legalize([d.node for d in plan.folded])
        for decision in plan.folded:
            kernel = self._kernels.get(decision.node)
            if kernel is not None:
                try:
                    self._function(kernel.prim_func)
                except Exception:  # noqa: BLE001 - raised again, as this call's failure, when it runs
                    continue

    def evaluate(self, plan: FoldPlan, values: Values, *, strict: bool) -> Dict[int, str]:
        failures: Dict[int, str] = {}
        for level in pending_levels(plan, values):
            for node in level:
                try:
                    values[node.id] = self.compute(node, values)
                except Exception as err:  # noqa: BLE001 - the call fails as stock's would: recorded
                    record_failure(node, err, failures, strict)
        return failures

    def compute(self, node: FoldNode, values: Mapping[int, List[object]]) -> List[object]:
        """The outputs of folded ``node``, from the values of the nodes it reads."""
        site = self._sites[node.id]
        leaves = leaf_values(site, self._graph, values)
        if site.kind is SiteKind.ALLOW:
            return [leaves[0]]
        if site.kind is SiteKind.TENSOR_TO_SHAPE:
            return [relax.ShapeExpr([int(v) for v in leaves[0].numpy().reshape(-1)])]
        if node.id not in self._kernels:
            self._legalize([node.id])
        kernel = self._kernels.get(node.id)
        if kernel is None:
            raise RuntimeError(f"{site.op_name or 'the call'} does not legalize to one TIR call")
        function = self._function(kernel.prim_func)
        outputs = allocate(node.outputs)
        function(*[leaves[a] if isinstance(a, int) else a for a in kernel.arg_map], *outputs)
        return list(outputs)

    def _legalize(self, node_ids: Sequence[int]) -> None:
        todo = [self._sites[n] for n in node_ids if n not in self._kernels]
        todo = [s for s in todo if s.kind in (SiteKind.OP, SiteKind.CALL_TIR)]
        if todo:
            self._kernels.update(legalize_each(self._mod, todo))

    def _function(self, prim_func: tvm.tirx.PrimFunc) -> Any:
        bucket = self._built.setdefault(tvm_ffi.structural_hash(prim_func), [])
        for built, function in bucket:
            if tvm_ffi.structural_equal(built, prim_func):
                return function
        named = prim_func.with_attr("global_symbol", "main")
        function = tvm.tirx.build(tvm.IRModule({"main": named}), target=REFERENCE_TARGET)["main"]
        bucket.append((prim_func, function))
        self.stats.compiled += 1
        return function


def leaf_values(site: CallSite, graph: FoldGraph, values: Mapping[int, List[object]]) -> List[Any]:
    """The tensors ``site``'s leaves hold: a constant's, else the value of the node it reads."""
    inputs = graph.nodes[site.node_id].inputs
    return [
        _compat.constant_array(constant)
        if constant is not None
        else values[inputs[index].source][0]  # type: ignore[index]
        for index, constant in enumerate(site.leaf_constants)
    ]


def allocate(outputs: Sequence[TensorInfo]) -> List[tvm.runtime.Tensor]:
    """New CPU tensors of the (static) result types ``outputs``, for a call to write into."""
    device = tvm.cpu(0)
    tensors = []
    for info in outputs:
        assert info.shape is not None and None not in info.shape, "folded results are static"
        tensors.append(tvm.runtime.empty(info.shape, info.dtype, device))
    return tensors


def record_failure(
    node: FoldNode, err: BaseException, failures: Dict[int, str], strict: bool
) -> None:
    """Record that ``node`` could not be evaluated; under ``strict`` raise it, chained."""
    failures[node.id] = f"{type(err).__name__}: {err}".splitlines()[0]
    if strict:
        raise evaluation_error(node, failures[node.id]) from err
