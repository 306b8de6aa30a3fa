"""The reference engine: each folded call legalized, built and run as the stock pass does it.

Stock ``FoldConstant`` legalizes a call whose operands are constants *as constants*: a 0-d one
reaches the legalizer as its value, which most legalizers write into the kernel as an immediate
(``x * 0.5``, ``pow(x, 2.0)``), and TVM and LLVM then compile that value in (``pow(x, 0.5)``
becomes ``sqrt(x)``). So does this engine: every operand of a folded call is shown to
``LegalizeOps`` as the constant it is, a value folded earlier in the pass included; the single
``call_tir`` that comes out names the PrimFunc and passes the constants, which are the kernel's
arguments; the PrimFunc is built as stock builds it (``tvm.tirx.build`` for ``llvm``, symbol
``tir_function``), once per distinct PrimFunc of the fold, and run into new tensors. A module's
own ``call_tir`` runs its PrimFunc on the operands; ``fold_allow`` passes its operand on;
``tensor_to_shape`` reads the shape values. The calls of one dependency level are legalized
together, once their operands have values. No cache, no threads, no NumPy copies, no kernel
shared between calls, no optimization level of its own, and no helper shared with the fast
engine, so that comparing the two can catch a bug in either.

The fast engine must give these bits, NaN payloads included; the tests compare the two over
the equivalence corpus, the real-model shapes and the fuzzers, and the fast engine reruns a call
here when one of its mechanisms fails or when stock's kernel depends on an operand's value.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import relax

from ..._core.driver import pending_levels
from ..._core.errors import PlanInvariantError
from ..._core.graph import FoldGraph, FoldNode, InputKind
from ..._core.planner import FoldPlan, evaluation_error
from .. import _compat
from .._sites import CallSite, SiteKind, StaticShapeVar
from .._stock import legalized_call_tir
from .interface import EngineStats, Values

__all__ = ["REFERENCE_TARGET", "STOCK_SYMBOL", "ReferenceEngine"]

#: What the stock pass builds its kernels for, and the symbol it gives them.
REFERENCE_TARGET = "llvm"
STOCK_SYMBOL = "tir_function"

#: A kernel as stock runs it: the PrimFunc and the tensors it is called with before its outputs.
_Kernel = Tuple[tvm.tirx.PrimFunc, List[tvm.runtime.Tensor]]


class ReferenceEngine:
    """The :class:`~fold_guard.relax._engine.interface.Engine` that is obviously right."""

    def __init__(self, mod: tvm.IRModule, graph: FoldGraph, sites: Sequence[CallSite]) -> None:
        self._mod = mod
        self._graph = graph
        self._sites = sites
        #: structural hash -> the distinct PrimFuncs built so far, with their compiled function
        self._built: Dict[int, List[Any]] = {}
        self.stats = EngineStats()

    def prepare(self, plan: FoldPlan) -> None:
        # Nothing ahead: a call is legalized on its operands' values, known once evaluated.
        return None

    def evaluate(
        self,
        plan: FoldPlan,
        values: Values,
        *,
        strict: bool,
        release: Mapping[int, Sequence[int]],
    ) -> Dict[int, str]:
        # ``release`` is for engines that drop values early; this one keeps every value.
        failures: Dict[int, str] = {}
        for level in pending_levels(plan, values):
            kernels = self._legalize(level, values)
            for node in level:
                try:
                    values[node.id] = self._compute(node, values, kernels.get(node.id))
                except PlanInvariantError:
                    raise  # an internal bug, not a failure of the call
                except Exception as err:  # the call fails as stock's would: recorded
                    failures[node.id] = f"{type(err).__name__}: {err}".splitlines()[0]
                    if strict:
                        raise evaluation_error(node, failures[node.id]) from err
        return failures

    def compute(self, node: FoldNode, values: Mapping[int, List[object]]) -> List[object]:
        """The outputs of folded ``node``, from the values of the nodes it reads."""
        return self._compute(node, values, self._legalize([node], values).get(node.id))

    def _compute(
        self, node: FoldNode, values: Mapping[int, List[object]], kernel: Any
    ) -> List[object]:
        site = self._sites[node.id]
        if site.kind is SiteKind.ALLOW:
            return [self._operands(site, values)[0]]
        if site.kind is SiteKind.TENSOR_TO_SHAPE:
            (tensor,) = self._operands(site, values)
            return [relax.ShapeExpr([int(v) for v in tensor.numpy().reshape(-1)])]
        if site.kind is SiteKind.CALL_TIR:
            kernel = (self._mod[site.call.args[0]], self._operands(site, values))
        if not isinstance(kernel, tuple):
            raise RuntimeError(kernel or f"{site.op_name} does not legalize to one TIR call")
        prim_func, arguments = kernel
        device = tvm.cpu(0)
        outputs = [tvm.runtime.empty(info.shape, info.dtype, device) for info in node.outputs]
        self._function(prim_func)(*arguments, *outputs)
        return list(outputs)

    def _operands(self, site: CallSite, values: Mapping[int, List[object]]) -> List[Any]:
        """The tensor each operand of ``site`` holds: its constant's, or the value it reads.

        None for an operand with no value here whose value the call does not read
        (``zeros_like(x)`` of a run-time ``x``): stock shows the legalizer that variable.
        """
        inputs = self._graph.nodes[site.node_id].inputs
        operands = []
        for index, constant in enumerate(site.leaf_constants):
            source = inputs[index]
            if constant is not None:
                operands.append(_compat.constant_array(constant))
            elif source.kind is InputKind.NODE and source.source in values:
                operands.append(values[source.source][0])
            else:
                assert not source.reads_value, "a folded call reads constants and folds"
                operands.append(None)
        return operands

    def _legalize(
        self, nodes: Sequence[FoldNode], values: Mapping[int, List[object]]
    ) -> Dict[int, Any]:
        """Per operator call of ``nodes``: its kernel, or why it has none (one LegalizeOps).

        Each call is legalized in a function of its own, its operands as constants.
        """
        functions: Dict[str, relax.Function] = {}
        for node in nodes:
            site = self._sites[node.id]
            if site.kind is SiteKind.OP:
                name = f"fold{node.id}"
                functions[name] = _as_stock_sees_it(name, site, self._operands(site, values))
        if not functions:
            return {}
        modules: Dict[str, Any] = {}
        try:
            modules = dict.fromkeys(
                functions, relax.transform.LegalizeOps()(tvm.IRModule(functions))
            )
        except Exception:  # noqa: BLE001 - a legalizer raised: find which, one function at a time
            for name, func in functions.items():
                try:
                    modules[name] = relax.transform.LegalizeOps()(tvm.IRModule({name: func}))
                except Exception as err:  # noqa: BLE001 - that call's failure, raised when it runs
                    modules[name] = f"LegalizeOps failed: {err}".splitlines()[0]
        kernels: Dict[int, Any] = {}
        for name, module in modules.items():
            node_id = int(name[len("fold") :])
            if isinstance(module, str):
                kernels[node_id] = module
                continue
            value, why = legalized_call_tir(module[name])
            fields = value.args[1].fields if value is not None else []
            if value is None or not all(_compat.is_constant(arg) for arg in fields):
                kernels[node_id] = f"{self._sites[node_id].op_name} {why or 'reads a variable'}"
                continue
            arguments = [_compat.constant_array(arg) for arg in fields]
            kernels[node_id] = (module[value.args[0]], arguments)
        return kernels

    def _function(self, prim_func: tvm.tirx.PrimFunc) -> Any:
        bucket = self._built.setdefault(tvm_ffi.structural_hash(prim_func), [])
        for built, function in bucket:
            if tvm_ffi.structural_equal(built, prim_func):
                return function
        named = prim_func.with_attr("global_symbol", STOCK_SYMBOL)
        target = tvm.target.Target(REFERENCE_TARGET)
        module = tvm.tirx.build(tvm.IRModule({STOCK_SYMBOL: named}), target=target)
        function = module[STOCK_SYMBOL]
        bucket.append((prim_func, function))
        self.stats.compiled += 1
        return function


def _as_stock_sees_it(name: str, site: CallSite, operands: Sequence[Any]) -> relax.Function:
    """A function of the call of ``site`` with every operand a constant (``operands``' tensors).

    A shape variable whose type gives its values stays a variable, as in stock's view, and
    becomes a parameter; so does an operand with no value (None: one the call does not read),
    which the legalized kernel must then not take.
    """
    shape_params: List[relax.Var] = []

    def rebuild(arg: object) -> relax.Expr:
        if isinstance(arg, int) and operands[arg] is None:
            shape_params.append(relax.Var(f"x{arg}", _compat.type_of(site.leaves[arg])))
            return shape_params[-1]
        if isinstance(arg, int):
            return _compat.make_constant(operands[arg])
        if isinstance(arg, tuple):
            return relax.Tuple([rebuild(a) for a in arg])
        if isinstance(arg, StaticShapeVar):
            shape_params.append(relax.Var(f"s{len(shape_params)}", _compat.type_of(arg.var)))
            return shape_params[-1]
        return arg  # type: ignore[return-value]

    args = [rebuild(a) for a in site.template_args]
    call = _compat.make_call(site.call.op, args, site.call.attrs, site.call.ty_args)
    builder = relax.BlockBuilder()
    with builder.function(name, shape_params, private=True):
        with builder.dataflow():
            out = builder.emit_output(call)
        builder.emit_func_output(out)
    return builder.get()[name]
