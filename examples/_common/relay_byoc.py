"""A test BYOC backend for quantized Relay models: QNN pattern table, partitioning, a CPU codegen.

A Relay BYOC backend ("bring your own codegen": an NPU, a vendor library) takes a quantized model
through the same steps every ``partition_for_<backend>`` helper in ``tvm.relay.op.contrib`` takes::

    import_relay(make_qdq_cnn(float_weights=True))     QDQ ONNX model, weights fp32 constants
    relay.transform.FakeQuantizationToInteger()        qnn.conv2d(x, qnn.quantize(<fp32 const>), ...)
    a FoldConstant                                     (stock: the quantize stays; fold_guard
                                                        "qdq-accelerator": <int8 const>)
    MergeComposite(qnn_pattern_table())                fn(x, Composite="<target>.qnn_conv2d") { ... }
    AnnotateTarget(target), MergeCompilerRegions(),    @tvmgen_default_<target>_main_0(x),
    PartitionGraph()                                   Compiler="<target>"

The pattern table claims ``qnn.conv2d`` / ``qnn.dense`` with an int8 *constant* weight, optionally
followed by a constant bias (``nn.bias_add`` or ``add``), then ``qnn.requantize``: the backend gets
its weights as ready int8 constants, and scales and zero points as constants of the QNN ops. A
weight that is still ``qnn.quantize(<fp32 constant>)`` is no constant, so after stock
``FoldConstant()`` nothing is offloaded at all.

:class:`QnnNpuCodegen` is the backend's ``relay.ext.<target>`` hook. It can fold the external
function it receives with :func:`fold_guard.relay.fold_function` (a backend that partitions first
and folds in its codegen: use ``qnn_pattern_table(fold_in_codegen=True)``, which also matches a
weight that is still ``qnn.quantize(<constant>)``), refuses a function whose quantized ops do not
have int8 constant weights (what a real NPU compiler would do), and compiles it for the host CPU:
the function, composites inlined, is built with ``relay.build`` and a small LLVM function under the
external symbol calls it. So partitioned modules build with ``relay.build`` and run on the graph
executor like any other, and their outputs can be compared with the unpartitioned module's.
hhb-tvm is built without TVM's ``ccompiler`` / ``dnnl`` codegens; this one needs nothing but LLVM.

Needs a TVM with Relay (``hhb-tvm`` 3.2.3 here); the root ``conftest.py`` leaves this module out
of the Relax environment's doctest run.

Examples
--------
>>> import fold_guard.relay as fgr
>>> mod = example_module()  # qnn.dense(x, qnn.quantize(<fp32 const>)) -> qnn.requantize
>>> str(count_offloaded(partition_for_qnn_npu(relay.transform.FoldConstant()(mod))))
'0 of 1'
>>> str(count_offloaded(partition_for_qnn_npu(fgr.FoldConstant("qdq-accelerator")(mod))))
'1 of 1'
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relay, te
from tvm.contrib import graph_executor
from tvm.relay.dataflow_pattern import DFPattern, is_constant, is_op, wildcard

import fold_guard.relay as fgr

from .onnx_models import RELAY_TARGET

__all__ = [
    "NPU_TARGET",
    "QUANTIZED_OPS",
    "Offload",
    "QnnNpuCodegen",
    "count_offloaded",
    "example_module",
    "external_functions",
    "has_int8_constant_weight",
    "inline_composites",
    "partition_for_qnn_npu",
    "qnn_pattern_table",
    "quantized_calls",
    "registered_codegen",
]

#: Name of the test backend: the ``Compiler`` attribute of its external functions, the prefix of
#: its composite names and of its ``relay.ext.<name>`` codegen hook.
NPU_TARGET = "fold_guard_qnn_npu"
#: The quantized ops whose weights the backend needs as int8 constants.
QUANTIZED_OPS = ("qnn.conv2d", "qnn.dense")

#: (composite name, pattern, check) as ``relay.transform.MergeComposite`` takes them.
PatternEntry = Tuple[str, DFPattern, Callable[[relay.Expr], bool]]


def example_module() -> tvm.IRModule:
    """One quantized dense whose weight is still ``qnn.quantize(<fp32 constant>)``, as FQ2I leaves it.

    ``requantize(qnn.dense(x: uint8[1, 4], quantize(W: fp32[2, 4])))`` to uint8, type-checked.

    Examples
    --------
    >>> [call.op.name for call in quantized_calls(example_module()["main"])]
    ['qnn.dense']
    """
    x = relay.var("x", shape=(1, 4), dtype="uint8")
    weight = relay.qnn.op.quantize(
        relay.const(np.arange(-4, 4, dtype="float32").reshape(2, 4)),
        relay.const(0.5),
        relay.const(0),
        out_dtype="int8",
    )
    dense = relay.qnn.op.dense(
        x, weight, relay.const(0), relay.const(0), relay.const(0.1), relay.const(0.5), units=2
    )
    out = relay.qnn.op.requantize(
        dense,
        relay.const(0.05),
        relay.const(0),
        relay.const(0.2),
        relay.const(0),
        out_dtype="uint8",
    )
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


# ------------------------------------------------------------------------------ inspecting IR


def _is_op_call(expr: relay.Expr, names: Sequence[str]) -> bool:
    return isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in names


def quantized_calls(expr: relay.Expr) -> List[relay.Call]:
    """Every ``qnn.conv2d`` / ``qnn.dense`` call in ``expr``, nested functions included, in post order."""
    found: List[relay.Call] = []

    def visit(node: relay.Expr) -> None:
        if _is_op_call(node, QUANTIZED_OPS):
            found.append(node)

    relay.analysis.post_order_visit(expr, visit)
    return found


def has_int8_constant_weight(call: relay.Call) -> bool:
    """True when the weight (second argument) of a quantized conv / dense is an int8 constant.

    Examples
    --------
    >>> (dense,) = quantized_calls(example_module()["main"])
    >>> has_int8_constant_weight(dense)  # still qnn.quantize(<fp32 constant>)
    False
    """
    weight = call.args[1]
    return isinstance(weight, relay.Constant) and str(weight.data.dtype) == "int8"


def _is_quantize_of_constants(expr: relay.Expr) -> bool:
    return (
        _is_op_call(expr, ("qnn.quantize",))
        and str(expr.attrs.out_dtype) == "int8"
        and all(isinstance(arg, relay.Constant) for arg in expr.args)
    )


def _compiler(func: tvm.ir.BaseFunc) -> Optional[str]:
    attrs = func.attrs
    if attrs is None or "Compiler" not in attrs.keys():
        return None
    return str(attrs["Compiler"])


def external_functions(
    mod: tvm.IRModule, target: str = NPU_TARGET
) -> List[Tuple[str, relay.Function]]:
    """``(name, function)`` of each external function of ``target``, in the order ``main`` calls them.

    The order of calls, not the names PartitionGraph picks, lines up two partitions of one model.

    Examples
    --------
    >>> partitioned = partition_for_qnn_npu(fgr.FoldConstant("qdq-accelerator")(example_module()))
    >>> [name for name, _ in external_functions(partitioned)]
    ['tvmgen_default_fold_guard_qnn_npu_main_0']
    """
    order: List[str] = []

    def visit(node: relay.Expr) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, relay.GlobalVar):
            name = node.op.name_hint
            if _compiler(mod[name]) == target and name not in order:
                order.append(name)

    relay.analysis.post_order_visit(mod["main"], visit)
    return [(name, mod[name]) for name in order]


@dataclass(frozen=True)
class Offload:
    """How many quantized convs / denses a partition gave the backend, with int8 constant weights.

    ``str(offload)`` is ``"<int8_weights> of <total>"``: offloaded with a ready int8 weight, of all
    ``qnn.conv2d`` / ``qnn.dense`` calls in the module.

    >>> str(Offload(total=5, offloaded=5, int8_weights=0))
    '0 of 5'
    """

    total: int
    offloaded: int
    int8_weights: int

    def __str__(self) -> str:
        return f"{self.int8_weights} of {self.total}"


def count_offloaded(mod: tvm.IRModule, target: str = NPU_TARGET) -> Offload:
    """Count the quantized convs / denses of ``mod``, those in ``target``'s external functions, and
    those of them whose weight is an int8 constant.

    Examples
    --------
    >>> count_offloaded(partition_for_qnn_npu(example_module(), fold_in_codegen=True))
    Offload(total=1, offloaded=1, int8_weights=0)
    """
    total = offloaded = int8_weights = 0
    for func in mod.functions.values():
        if not isinstance(func, relay.Function):
            continue
        calls = quantized_calls(func)
        total += len(calls)
        if _compiler(func) == target:
            offloaded += len(calls)
            int8_weights += sum(has_int8_constant_weight(call) for call in calls)
    return Offload(total, offloaded, int8_weights)


# ---------------------------------------------------------------------------- pattern table


def _requantized(pattern: DFPattern) -> DFPattern:
    """``pattern [-> nn.bias_add / add(., <constant>)] -> qnn.requantize(., <4 constants>)``.

    FQ2I adds a dense layer's bias with ``add``, the TFLite frontend with ``nn.bias_add``.
    """
    with_bias = pattern.optional(
        lambda x: is_op("nn.bias_add")(x, is_constant()) | is_op("add")(x, is_constant())
    )
    return is_op("qnn.requantize")(
        with_bias, is_constant(), is_constant(), is_constant(), is_constant()
    )


def _quantized_op(op_name: str, weight: DFPattern) -> DFPattern:
    """``op_name(<activation>, weight, <zero points and scales as constants>)``."""
    return is_op(op_name)(
        wildcard(), weight, is_constant(), is_constant(), is_constant(), is_constant()
    )


def _weights_ready(fold_in_codegen: bool) -> Callable[[relay.Expr], bool]:
    """The check of a composite: every quantized op in the match has an int8 constant weight.

    With ``fold_in_codegen`` a weight may also be ``qnn.quantize(<constants>)`` to int8, which the
    codegen hook folds before it compiles.
    """

    def check(matched: relay.Expr) -> bool:
        calls = quantized_calls(matched)
        return bool(calls) and all(
            has_int8_constant_weight(call)
            or (fold_in_codegen and _is_quantize_of_constants(call.args[1]))
            for call in calls
        )

    return check


def qnn_pattern_table(
    target: str = NPU_TARGET, *, fold_in_codegen: bool = False
) -> List[PatternEntry]:
    """The backend's composite patterns, for ``relay.transform.MergeComposite``.

    ``<target>.qnn_conv2d``: ``qnn.conv2d(x, W) [-> nn.bias_add / add(., b)] -> qnn.requantize``,
    and ``<target>.qnn_dense``, the same with ``qnn.dense``, where ``W``, the
    bias and every scale and zero point are constants and ``W`` is int8 (the check function). The
    composite names start with ``<target>.``, which is how ``AnnotateTarget(target)`` recognises
    composites as the backend's without any ``target.<name>`` op attribute.

    Parameters
    ----------
    target : str, optional
        The backend name; :data:`NPU_TARGET` by default.
    fold_in_codegen : bool, optional
        Also match a weight that is still ``qnn.quantize(<fp32 constant>, <constants>)`` to int8:
        for a backend that partitions before folding and folds each external function in its
        codegen hook (:class:`QnnNpuCodegen` with a policy). The composite then holds the
        quantize, and its ``PartitionedFromPattern`` attribute names it.

    Returns
    -------
    list of (str, DFPattern, callable)
        The pattern table.

    Examples
    --------
    >>> [name for name, _, _ in qnn_pattern_table("my_npu")]
    ['my_npu.qnn_conv2d', 'my_npu.qnn_dense']
    """

    def weight() -> DFPattern:
        if not fold_in_codegen:
            return is_constant()
        return is_constant() | is_op("qnn.quantize")(is_constant(), is_constant(), is_constant())

    check = _weights_ready(fold_in_codegen)
    return [
        (f"{target}.qnn_conv2d", _requantized(_quantized_op("qnn.conv2d", weight())), check),
        (f"{target}.qnn_dense", _requantized(_quantized_op("qnn.dense", weight())), check),
    ]


def partition_for_qnn_npu(
    mod: tvm.IRModule,
    target: str = NPU_TARGET,
    *,
    fold_in_codegen: bool = False,
    bind_constants: bool = True,
) -> tvm.IRModule:
    """MergeComposite, AnnotateTarget, MergeCompilerRegions, PartitionGraph: the backend's partitioning.

    Folding is not part of it: fold before (``fold_guard.relay.FoldConstant(...)``) or in the
    codegen (``fold_in_codegen=True`` and a :class:`QnnNpuCodegen` with a policy).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relay module after ``FakeQuantizationToInteger``.
    target : str, optional
        The backend name.
    fold_in_codegen : bool, optional
        Passed to :func:`qnn_pattern_table`.
    bind_constants : bool, optional
        Passed to ``PartitionGraph``. The constants of this pattern table sit inside the
        composite functions, so they stay there either way.

    Returns
    -------
    tvm.IRModule
        The partitioned, type-checked module; ``mod`` is not changed.

    Examples
    --------
    >>> partitioned = partition_for_qnn_npu(example_module(), fold_in_codegen=True)
    >>> (name, func), = external_functions(partitioned)
    >>> str(func.attrs["Compiler"]), str(func.body.op.attrs["Composite"])
    ('fold_guard_qnn_npu', 'fold_guard_qnn_npu.qnn_dense')
    """
    return tvm.transform.Sequential(
        [
            relay.transform.InferType(),
            relay.transform.MergeComposite(
                qnn_pattern_table(target, fold_in_codegen=fold_in_codegen)
            ),
            relay.transform.AnnotateTarget(target),
            relay.transform.MergeCompilerRegions(),
            relay.transform.PartitionGraph(bind_constants=bind_constants),
            relay.transform.InferType(),
        ]
    )(mod)


# ------------------------------------------------------------------------------- the codegen


class _InlineLocalFunctions(relay.ExprMutator):
    def visit_call(self, call: relay.Call) -> relay.Expr:
        if isinstance(call.op, relay.Function):
            args = [self.visit(arg) for arg in call.args]
            return relay.bind(self.visit(call.op.body), dict(zip(call.op.params, args)))
        return super().visit_call(call)


def inline_composites(func: relay.Function) -> relay.Function:
    """``func`` with every call of a local function (the composites) replaced by that function's body.

    What is left is plain Relay that ``relay.build`` compiles like any other function; attributes
    of ``func`` itself are dropped.

    Examples
    --------
    >>> (_, func), = external_functions(partition_for_qnn_npu(example_module(), fold_in_codegen=True))
    >>> print(inline_composites(func).body.op.name)
    qnn.requantize
    """
    return relay.Function(
        list(func.params), _InlineLocalFunctions().visit(func.body), func.ret_type, func.type_params
    )


#: Built functions by structural hash: (the plain function built, its graph executor).
BuildCache = Dict[int, List[Tuple[tvm.IRModule, Any]]]


@dataclass
class QnnNpuCodegen:
    """The ``relay.ext.<target>`` hook of the test backend: fold (optionally), check, compile.

    ``relay.build`` calls it once per external function. With a ``policy`` it first folds the
    function with ``fold_guard.relay.fold_function(func, policy=policy, strict=True)``. It then
    refuses (``ValueError``) a function in which a ``qnn.conv2d`` / ``qnn.dense`` weight is not an
    int8 constant, as an NPU compiler would, and compiles it for the CPU (see the module
    docstring). ``received`` and ``folded`` record what it was given and what it compiled, in call
    order. Register it with :func:`registered_codegen`.

    Examples
    --------
    >>> codegen = QnnNpuCodegen(policy="qdq-accelerator")
    >>> partitioned = partition_for_qnn_npu(example_module(), fold_in_codegen=True)
    >>> with registered_codegen(codegen), tvm.transform.PassContext(opt_level=3):
    ...     lib = relay.build(partitioned, target=RELAY_TARGET)
    >>> (folded,) = codegen.folded
    >>> [has_int8_constant_weight(call) for call in quantized_calls(folded)]
    [True]
    """

    policy: Optional[Any] = None
    target: str = NPU_TARGET
    build_target: str = RELAY_TARGET
    #: ``PassContext`` opt level of the per-function builds.
    opt_level: int = 3
    #: Shareable between codegens: an external function equal to one built before (the same model
    #: partitioned again) reuses that build.
    cache: Optional[BuildCache] = None
    received: List[relay.Function] = field(default_factory=list)
    folded: List[relay.Function] = field(default_factory=list)
    #: Global packed functions this codegen registered (the compiled functions' bodies).
    runners: List[str] = field(default_factory=list)

    def __call__(self, func: relay.Function) -> tvm.runtime.Module:
        self.received.append(func)
        folded = (
            func
            if self.policy is None
            else fgr.fold_function(func, policy=self.policy, strict=True)
        )
        self.folded.append(folded)
        not_ready = [call for call in quantized_calls(folded) if not has_int8_constant_weight(call)]
        if not_ready:
            raise ValueError(
                f"{self.target} takes only int8 constant weights, but in {func.attrs['global_symbol']} "
                f"{len(not_ready)} {'/'.join(QUANTIZED_OPS)} call(s) have another weight (the first: "
                f"{_describe(not_ready[0].args[1])}); hint: fold the weights first, with a policy for "
                "this codegen or fold_guard.relay.FoldConstant before partitioning"
            )
        return self._compile(folded)

    def _compile(self, func: relay.Function) -> tvm.runtime.Module:
        """Build ``func`` for the CPU and return an LLVM module whose ``global_symbol`` function runs it."""
        symbol = str(func.attrs["global_symbol"])
        ret = func.ret_type if func.ret_type is not None else func.checked_type.ret_type
        # A region that merged several composites returns a tuple: one output per live value.
        outputs = list(ret.fields) if isinstance(ret, relay.TupleType) else [ret]
        if not all(isinstance(out, relay.TensorType) for out in outputs):
            raise ValueError(f"{symbol}: the test codegen supports tensor outputs only, got {ret}")
        executor = self._executor(
            relay.transform.InferType()(tvm.IRModule.from_expr(inline_composites(func)))
        )
        n_in = len(func.params)

        def run(*arrays: tvm.nd.NDArray) -> None:
            # The graph executor passes the inputs, then the outputs, as views of its own buffers.
            for index, array in enumerate(arrays[:n_in]):
                executor.set_input(index, array)
            executor.run()
            for index, array in enumerate(arrays[n_in:]):
                executor.get_output(index).copyto(array)

        # The LLVM function under the external symbol calls ``run`` through the global registry.
        runner = f"relay_byoc.{self.target}.{symbol}"
        tvm.register_func(runner, run, override=True)
        self.runners.append(runner)
        inputs = [
            te.placeholder(
                [int(d) for d in param.checked_type.shape],
                str(param.checked_type.dtype),
                name=f"in{i}",
            )
            for i, param in enumerate(func.params)
        ]
        results = te.extern(
            [[int(d) for d in out.shape] for out in outputs],
            inputs,
            lambda ins, outs: tvm.tir.call_packed(runner, *ins, *outs),
            dtype=[str(out.dtype) for out in outputs],
            name="npu_call",
        )
        results = results if isinstance(results, list) else [results]
        schedule = te.create_schedule(results[0].op)
        return tvm.build(schedule, inputs + results, target=self.build_target, name=symbol)

    def _executor(self, plain: tvm.IRModule) -> graph_executor.GraphModule:
        """A graph executor of ``plain`` (built, or from ``cache`` when an equal function was built)."""
        key = int(tvm.ir.structural_hash(plain))
        entries = self.cache.setdefault(key, []) if self.cache is not None else []
        for built, executor in entries:
            if tvm.ir.structural_equal(built, plain):
                return executor
        with tvm.transform.PassContext(opt_level=self.opt_level):
            lib = relay.build(plain, target=self.build_target)
        executor = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        entries.append((plain, executor))
        return executor


def _describe(expr: relay.Expr) -> str:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return f"a {expr.op.name} call"
    if isinstance(expr, relay.Constant):
        return f"a {expr.data.dtype} constant"
    return f"a {type(expr).__name__}"


@contextlib.contextmanager
def registered_codegen(codegen: QnnNpuCodegen) -> Iterator[QnnNpuCodegen]:
    """Register ``codegen`` as ``relay.ext.<codegen.target>`` for the ``with`` block, then remove it.

    The packed functions the compiled external functions call are removed on exit too, so run
    the built modules inside the block.
    """
    hook = f"relay.ext.{codegen.target}"
    tvm.register_func(hook, codegen, override=True)
    try:
        yield codegen
    finally:
        for name in [hook] + codegen.runners:
            if tvm.get_global_func(name, allow_missing=True) is not None:
                tvm._ffi.registry.remove_global_func(name)
        codegen.runners.clear()
