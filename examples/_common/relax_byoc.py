"""A test BYOC backend for quantized Relax models: a QDQ pattern table and partitioning.

A Relax BYOC backend (an NPU, a vendor library) claims the subgraphs it can run with a pattern
table, then ``relax.transform.FuseOpsByPattern`` groups each match into a composite function and
``relax.transform.MergeCompositeFunctions`` wraps them into functions with ``Codegen`` set, which
``relax.transform.RunCodegen`` hands to the backend. A QDQ accelerator ("qdq_npu" here, a
fictional one) recognises a quantized conv2d / matmul in the form the ONNX importer gives it::

    x_q  = R.quantize(x, s_x, zp_x)                 the activation's Q/DQ pair (quantize checked,
    x    = R.dequantize(x_q, s_x, zp_x)             dequantize inside the composite)
    w    = R.dequantize(<int8 const>, s_w, zp_w)    the weight: int8 constant (fold_barrier allowed)
    w_t  = R.permute_dims(w)                        optional (Gemm / MatMul weights)
    y    = R.nn.conv2d(x, w) | R.matmul(x, w_t)
    b    = R.dequantize(<int32 const>, s_b, zp_b)   optional bias, reshaped for conv2d
    out  = R.add(y, R.reshape(b, ...))

The weight and bias scales and zero points come from the ``dequantize`` calls, so the pattern
exists only as long as ``dequantize(<int const>)`` does:

    import                                 dequantize(<int8 const>) -> conv2d   every one matches
    stock relax.transform.FoldConstant()   <fp32 const>             -> conv2d   none matches
    fold_guard.relax.FoldConstant(         dequantize(<int8 const>) -> conv2d   every one matches
        "qdq-accelerator")                 (a weight given as quantize(<fp32 const>) becomes int8)

Before the patterns run, :func:`partition_for_qdq_npu` gives each consumer of a shared activation
``dequantize`` its own copy (:func:`dedicate_activation_dequantize`, what onnxruntime's
``EnsureUniqueDQForNodeUnit`` does for its QDQ node units): in a residual network or in attention,
one dequantized activation feeds several convs or matmuls, and a composite must not leak an
intermediate value nor share one with another composite.

Nothing here compiles for a real device: :func:`strip_codegen` turns a partitioned module back
into plain Relax so that it builds and runs on the CPU, to check that partitioning changed nothing.

Examples
--------
>>> from _common import relax_byoc
>>> [pattern.name for pattern in relax_byoc.qdq_pattern_table()]
['qdq_npu.conv2d_bias', 'qdq_npu.conv2d', 'qdq_npu.matmul_bias', 'qdq_npu.matmul']
"""

from __future__ import annotations

import functools
from typing import Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.transform import FusionPattern, PatternCheckContext

# Importing fold_guard.relax registers relax.fold_barrier, which the patterns name.
import fold_guard.relax  # noqa: F401

#: What apache-tvm 0.27 calls a constant (``relax.Constant`` in earlier releases).
_Constant = tvm.ir.GenericConst

__all__ = [
    "BIAS_DTYPE",
    "CODEGEN",
    "QUANTIZED_OPS",
    "WEIGHT_DTYPE",
    "composite_weights",
    "count_offloaded",
    "count_quantized_ops",
    "dedicate_activation_dequantize",
    "partition_for_qdq_npu",
    "qdq_pattern_table",
    "strip_codegen",
]

#: Name of the test backend: the ``Codegen`` attribute of its functions, the prefix of its
#: composite names.
CODEGEN = "qdq_npu"
#: The ops the backend offloads, with the short names used in composite names and counts.
QUANTIZED_OPS: Dict[str, str] = {"relax.nn.conv2d": "conv2d", "relax.matmul": "matmul"}
#: The weight dtype the backend's integer kernels take.
WEIGHT_DTYPE = "int8"
#: The bias dtype of a QDQ conv / Gemm (onnxruntime quantizes biases to int32).
BIAS_DTYPE = "int32"

_QUANTIZE = "relax.quantize"
_DEQUANTIZE = "relax.dequantize"
_BARRIER = "relax.fold_barrier"


# ------------------------------------------------------------------------------ pattern table


def _weight_pattern(look_through_barrier: bool) -> Tuple[DFPattern, DFPattern]:
    """``dequantize(w, scale, zp)``, ``w`` a constant (or ``fold_barrier(<constant>)``).

    Returns the pattern and the constant's own pattern (annotated as ``"weight"``, so the check
    sees the constant itself behind a barrier).
    """
    constant = is_const()
    data: DFPattern = constant
    if look_through_barrier:
        # A module annotated with fold_barrier (fold_guard.relax.annotate, or by hand) keeps its
        # weights as dequantize(fold_barrier(<int8 const>)) through any FoldConstant: the
        # barrier sits between the dequantize and the constant, an identity to look through.
        data = constant | is_op(_BARRIER)(constant)
    return is_op(_DEQUANTIZE)(data, is_const(), is_const()), constant


def _make_pattern(
    op_name: str, with_bias: bool, look_through_barrier: bool
) -> Tuple[DFPattern, Dict[str, DFPattern]]:
    activation_int = wildcard()  # the quantized activation; the check wants a quantize behind it
    activation = is_op(_DEQUANTIZE)(activation_int, is_const(), is_const())
    weight, weight_constant = _weight_pattern(look_through_barrier)
    if op_name == "relax.matmul":
        # Gemm(transB=1) imports as matmul(x, permute_dims(dequantize(W))).
        weight = weight | is_op("relax.permute_dims")(weight)
    op = is_op(op_name)(activation, weight)
    annotations = {
        "activation_int": activation_int,
        "weight": weight_constant,
        "op": op,
        "root": op,
    }
    if not with_bias:
        return op, annotations
    bias_constant = is_const()
    bias = is_op(_DEQUANTIZE)(bias_constant, is_const(), is_const())
    # conv2d's bias is reshaped to (1, C, 1, 1); Gemm's is added as it is.
    bias = bias | is_op("relax.reshape")(bias, wildcard())
    root = is_op("relax.add")(op, bias)
    annotations.update(bias=bias_constant, root=root)
    return root, annotations


def _dtype(expr: relax.Expr) -> Optional[str]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType):
        return None
    dtype = ty.dtype
    return "" if dtype is None else str(getattr(dtype, "dtype", dtype))


def _is_call(expr: Optional[relax.Expr], op_name: str) -> bool:
    return (
        isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op_name
    )


def _check_qdq_match(context: PatternCheckContext) -> bool:
    """Accept a match only if the backend could run it as an integer kernel.

    - the weight is an int8 constant (a constant of another dtype would need a requantization the
      backend does not do; an fp32 weight, as stock ``FoldConstant`` leaves it, never matches the
      pattern at all);
    - the bias, if any, is an int32 constant;
    - the activation is a ``dequantize`` of a ``quantize`` result, i.e. really quantized;
    - no value computed inside the match is used outside it (a composite has one output).
    """
    annotated = context.annotated_expr
    if _dtype(annotated["weight"]) != WEIGHT_DTYPE:
        return False
    if "bias" in annotated and _dtype(annotated["bias"]) != BIAS_DTYPE:
        return False
    # The matcher hands a wildcard the value bound to the variable it met, so this is the
    # producer of the quantized activation itself (which stays outside the composite).
    if not _is_call(annotated["activation_int"], _QUANTIZE):
        return False
    return not has_leaking_intermediate_variables(context)


@functools.cache
def _pattern_table(look_through_barrier: bool) -> Tuple[FusionPattern, ...]:
    table = []
    for op_name, short in QUANTIZED_OPS.items():
        # With the bias first: FuseOpsByPattern gives earlier patterns priority, and the larger
        # match should win where both apply.
        for with_bias in (True, False):
            pattern, annotations = _make_pattern(op_name, with_bias, look_through_barrier)
            name = f"{CODEGEN}.{short}" + ("_bias" if with_bias else "")
            table.append(FusionPattern(name, pattern, annotations, _check_qdq_match))
    return tuple(table)


def qdq_pattern_table(*, look_through_barrier: bool = True) -> List[FusionPattern]:
    """The backend's patterns, in priority order, for ``relax.transform.FuseOpsByPattern``.

    One pattern per offloaded op (``relax.nn.conv2d``, ``relax.matmul``), each with and without a
    bias ``add``: ``op(dequantize(x_q), dequantize(<int8 const>) [-> permute_dims]) [+ bias]``,
    where ``x_q`` must come from a ``quantize`` and the bias is ``dequantize(<int32 const>)``
    (reshaped for conv2d). Composite names are ``"qdq_npu.<op>"`` and ``"qdq_npu.<op>_bias"``.

    Parameters
    ----------
    look_through_barrier : bool, optional
        Also accept the weight as ``dequantize(fold_barrier(<int8 const>))``, what a weight kept
        by a ``fold_barrier`` looks like (the barrier then ends up inside the composite, where it
        is an identity). True by default; False gives the table of a backend that knows nothing of
        fold_guard, which misses such weights.

    Returns
    -------
    list of tvm.relax.transform.FusionPattern
        A new list of the same (cached) patterns on every call.

    Examples
    --------
    >>> table = qdq_pattern_table()
    >>> [(p.name, sorted(p.annotation_patterns)) for p in table][:2]  # doctest: +NORMALIZE_WHITESPACE
    [('qdq_npu.conv2d_bias', ['activation_int', 'bias', 'op', 'root', 'weight']),
     ('qdq_npu.conv2d', ['activation_int', 'op', 'root', 'weight'])]
    """
    return list(_pattern_table(bool(look_through_barrier)))


# ------------------------------------------------------------------------------ partitioning


def _relax_functions(mod: tvm.IRModule) -> Iterator[Tuple[tvm.ir.GlobalVar, relax.Function]]:
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            yield gvar, func


def _bindings(expr: relax.Expr) -> Iterator[relax.Binding]:
    """Every binding of a function body, nested ``If`` branches included (not nested functions)."""
    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in block.bindings:
                yield binding
                if isinstance(binding.value, relax.If):
                    yield from _bindings(binding.value.true_branch)
                    yield from _bindings(binding.value.false_branch)


def _shared_activation_dequantizes(func: relax.Function) -> Dict[relax.Var, relax.Call]:
    """Dataflow variables bound to ``dequantize(<non-constant>)`` and used by several calls."""
    uses: Dict[relax.Var, int] = {}
    candidates: Dict[relax.Var, relax.Call] = {}
    for binding in _bindings(func.body):
        value = binding.value
        if isinstance(binding.var, relax.DataflowVar) and _is_call(value, _DEQUANTIZE):
            if not isinstance(value.args[0], _Constant):
                candidates[binding.var] = value
        if isinstance(value, relax.Call):
            for arg in value.args:
                if isinstance(arg, relax.Var):
                    uses[arg] = uses.get(arg, 0) + 1
    return {var: call for var, call in candidates.items() if uses.get(var, 0) > 1}


@mutator
class _Dedicate(PyExprMutator):
    """Gives every use of a shared dequantize after the first its own copy, emitted just before."""

    def __init__(self, mod: tvm.IRModule, shared: Dict[relax.Var, relax.Call]) -> None:
        super().__init__(mod)
        self.shared = shared
        self.used: Set[relax.Var] = set()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if isinstance(value, relax.Call) and any(
            isinstance(a, relax.Var) and a in self.shared for a in value.args
        ):
            args = []
            for arg in value.args:
                if isinstance(arg, relax.Var) and arg in self.shared:
                    if arg in self.used:
                        # A new Call object, not the shared one: FuseOpsByPattern maps each bound
                        # value back to its variable, and one object bound twice would send both
                        # matches to the same (last) variable.
                        shared = self.visit_expr(self.shared[arg])
                        copy = relax.Call(
                            shared.op, shared.args, shared.attrs, shared.ty_args, shared.span
                        )
                        arg = self.builder_.emit(copy, name_hint=arg.name)
                    else:
                        self.used.add(arg)
                args.append(arg)
            binding = relax.VarBinding(
                binding.var, relax.Call(value.op, args, value.attrs, value.ty_args, value.span)
            )
        super().visit_var_binding_(binding)


def dedicate_activation_dequantize(mod: tvm.IRModule) -> tvm.IRModule:
    """Give each consumer of a shared activation ``dequantize`` its own copy of it.

    A QDQ graph dequantizes each quantized activation once, however many ops read it: the
    residual input of a ResNet block feeds a conv and an add, attention's normalised input feeds
    the Q, K and V matmuls. A composite function that takes that ``dequantize`` in would leak it
    to the other consumers (or fight another composite for it), so backends duplicate it first,
    as onnxruntime's ``EnsureUniqueDQForNodeUnit`` does. Only ``dequantize`` calls of non-constant
    data bound to dataflow variables are duplicated; the copies compute the same values.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module; not changed.

    Returns
    -------
    tvm.IRModule
        The module with one ``dequantize`` per use (``mod`` itself if nothing is shared).

    Examples
    --------
    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2, 2), "float32"))
    >>> scale, zp = relax.const(0.5), relax.const(0, "int8")
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         q = bb.emit(relax.op.quantize(x, scale, zp))
    ...         dq = bb.emit(relax.op.dequantize(q, scale, zp))
    ...         y = bb.emit_output(relax.op.add(relax.op.exp(dq), relax.op.negative(dq)))
    ...     _ = bb.emit_func_output(y)
    >>> dedicated = dedicate_activation_dequantize(bb.get())
    >>> [b.value.op.name for b in dedicated["main"].body.blocks[0].bindings]  # doctest: +NORMALIZE_WHITESPACE
    ['relax.quantize', 'relax.dequantize', 'relax.exp', 'relax.dequantize', 'relax.negative',
     'relax.add']
    """
    functions = dict(mod.functions)
    changed = False
    for gvar, func in _relax_functions(mod):
        shared = _shared_activation_dequantizes(func)
        if shared:
            functions[gvar] = _Dedicate(mod, shared).visit_expr(func)
            changed = True
    if not changed:
        return mod
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def partition_for_qdq_npu(mod: tvm.IRModule, *, look_through_barrier: bool = True) -> tvm.IRModule:
    """Partition ``mod`` for the test QDQ backend, as a ``partition_for_<backend>`` helper does.

    :func:`dedicate_activation_dequantize`, then ``FuseOpsByPattern(qdq_pattern_table(),
    bind_constants=True, annotate_codegen=False)`` (the weight, scale and zero-point constants
    stay inside each composite, where the backend reads them), then ``MergeCompositeFunctions()``
    (which adds the ``Codegen="qdq_npu"`` wrappers; ``annotate_codegen=True`` is for backends that
    skip this merge, and would wrap every composite twice here).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module, typically folded already; not changed. Patterns only match inside
        dataflow blocks (``relax.transform.ConvertToDataflow()`` first, if need be).
    look_through_barrier : bool, optional
        Passed to :func:`qdq_pattern_table`.

    Returns
    -------
    tvm.IRModule
        The partitioned module: ``main`` calls one ``Codegen="qdq_npu"`` function per offloaded
        region, each holding ``Composite="qdq_npu.<op>[_bias]"`` functions.

    Examples
    --------
    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> scale, zp = relax.const(0.5), relax.const(0, "int8")
    >>> weight = relax.const(np.ones((4, 3), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         q = bb.emit(relax.op.quantize(x, scale, zp))
    ...         dq = bb.emit(relax.op.dequantize(q, scale, zp))
    ...         w = bb.emit(relax.op.dequantize(weight, scale, zp))
    ...         y = bb.emit_output(relax.op.matmul(dq, w))
    ...     _ = bb.emit_func_output(y)
    >>> count_offloaded(partition_for_qdq_npu(bb.get()))["offloaded"]
    1
    """
    mod = dedicate_activation_dequantize(mod)
    table = qdq_pattern_table(look_through_barrier=look_through_barrier)
    mod = relax.transform.FuseOpsByPattern(table, bind_constants=True, annotate_codegen=False)(mod)
    return relax.transform.MergeCompositeFunctions()(mod)


# ---------------------------------------------------------------------------------- counting


def _attr(func: relax.Function, name: str) -> Optional[str]:
    attrs = func.attrs
    if attrs is None or name not in attrs:
        return None
    return str(attrs[name])


def _functions_with_context(
    mod: tvm.IRModule,
) -> Iterator[Tuple[relax.Function, bool, Optional[str]]]:
    """(function, offloaded?, composite name) for every Relax function, nested ones included.

    A function is offloaded when it, or a function around it, has ``Codegen`` or ``Composite``.
    """

    def walk(
        func: relax.Function, offloaded: bool
    ) -> Iterator[Tuple[relax.Function, bool, Optional[str]]]:
        composite = _attr(func, "Composite")
        offloaded = offloaded or composite is not None or _attr(func, "Codegen") is not None
        yield func, offloaded, composite
        for binding in _bindings(func.body):
            if isinstance(binding.value, relax.Function):
                yield from walk(binding.value, offloaded)

    for _, func in _relax_functions(mod):
        yield from walk(func, False)


def _quantized_op_calls(
    func: relax.Function,
) -> Iterator[Tuple[relax.Call, Dict[relax.Var, relax.Expr]]]:
    values = {binding.var: binding.value for binding in _bindings(func.body)}
    for value in values.values():
        if (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name in QUANTIZED_OPS
        ):
            yield value, values


def _resolve(expr: relax.Expr, values: Dict[relax.Var, relax.Expr]) -> relax.Expr:
    while isinstance(expr, relax.Var) and expr in values:
        expr = values[expr]
    return expr


def _weight_constant(
    call: relax.Call, values: Dict[relax.Var, relax.Expr], through_quantize: bool = False
) -> Optional[relax.Expr]:
    """The integer constant behind a conv2d / matmul weight, as the pattern table sees it.

    Follows ``[permute_dims] <- dequantize <- [fold_barrier] <- <int constant>``; with
    ``through_quantize`` a ``quantize(<constant>)`` counts as the integer constant it folds into.
    """
    weight = _resolve(call.args[1], values)
    if _is_call(weight, "relax.permute_dims"):
        weight = _resolve(weight.args[0], values)
    if not _is_call(weight, _DEQUANTIZE):
        return None
    data = _resolve(weight.args[0], values)
    if _is_call(data, _BARRIER):
        data = _resolve(data.args[0], values)
    if (
        through_quantize
        and _is_call(data, _QUANTIZE)
        and isinstance(_resolve(data.args[0], values), _Constant)
    ):
        return data
    if isinstance(data, _Constant) and (_dtype(data) or "").startswith(("int", "uint")):
        return data
    return None


def count_quantized_ops(mod: tvm.IRModule, *, through_quantize: bool = False) -> int:
    """How many conv2d / matmul calls take their weight from ``dequantize(<integer constant>)``.

    These are the ops a QDQ backend could match: the weight is an integer constant with its scale
    and zero point still in a ``dequantize`` (possibly behind a ``fold_barrier``, possibly
    followed by ``permute_dims``). Calls inside composite functions count too, so the number is
    the same before and after partitioning.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module.
    through_quantize : bool, optional
        Also count a weight given as ``dequantize(quantize(<float constant>))`` (a model whose
        weights are stored in float): the count a fold of the ``quantize`` calls will give.

    Returns
    -------
    int
        The number of such calls.

    Examples
    --------
    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> scale, zp = relax.const(0.5), relax.const(0, "int8")
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         w = bb.emit(relax.op.quantize(relax.const(np.ones((4, 4), "float32")), scale, zp))
    ...         w = bb.emit(relax.op.dequantize(w, scale, zp))
    ...         y = bb.emit_output(relax.op.matmul(x, w))
    ...     _ = bb.emit_func_output(y)
    >>> count_quantized_ops(bb.get()), count_quantized_ops(bb.get(), through_quantize=True)
    (0, 1)
    """
    return sum(
        _weight_constant(call, values, through_quantize) is not None
        for func, _, _ in _functions_with_context(mod)
        for call, values in _quantized_op_calls(func)
    )


def count_offloaded(mod: tvm.IRModule) -> Dict[str, int]:
    """How many conv2d / matmul calls ended up inside composite functions, and how many outside.

    Parameters
    ----------
    mod : tvm.IRModule
        A module after :func:`partition_for_qdq_npu` (or any Relax module: without partitions
        every call is outside).

    Returns
    -------
    dict of str to int
        ``"<op>_offloaded"`` and ``"<op>_outside"`` for ``conv2d`` and ``matmul``, and their
        totals ``"offloaded"`` and ``"outside"``. A call counts as offloaded when a function
        around it has a ``Composite`` or ``Codegen`` attribute.

    Examples
    --------
    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit_output(relax.op.matmul(x, relax.const(np.ones((4, 4), "float32"))))
    ...     _ = bb.emit_func_output(y)
    >>> counts = count_offloaded(bb.get())
    >>> counts["matmul_outside"], counts["offloaded"], counts["outside"]
    (1, 0, 1)
    """
    counts = {
        f"{short}_{where}": 0
        for short in QUANTIZED_OPS.values()
        for where in ("offloaded", "outside")
    }
    for func, offloaded, _ in _functions_with_context(mod):
        for call, _ in _quantized_op_calls(func):
            counts[f"{QUANTIZED_OPS[call.op.name]}_{'offloaded' if offloaded else 'outside'}"] += 1
    counts["offloaded"] = sum(v for k, v in counts.items() if k.endswith("_offloaded"))
    counts["outside"] = sum(v for k, v in counts.items() if k.endswith("_outside"))
    return counts


def composite_weights(mod: tvm.IRModule) -> List[Tuple[str, np.ndarray]]:
    """The weight constants the backend receives: ``(composite name, array)`` per offloaded op.

    Parameters
    ----------
    mod : tvm.IRModule
        A module after :func:`partition_for_qdq_npu`.

    Returns
    -------
    list of (str, numpy.ndarray)
        For every conv2d / matmul inside a composite function, the composite's name and the
        integer constant behind its weight ``dequantize``, in module order.

    Examples
    --------
    See :func:`strip_codegen`.
    """
    weights = []
    for func, _, composite in _functions_with_context(mod):
        if composite is None:
            continue
        for call, values in _quantized_op_calls(func):
            constant = _weight_constant(call, values)
            if constant is not None:
                weights.append((composite, constant.value.numpy()))
    return weights


# ---------------------------------------------------------------------------- CPU fallback


@mutator
class _StripBackendAttrs(PyExprMutator):
    """Drops ``Codegen`` (and the symbol it exports), ``Composite`` and ``Primitive`` attributes."""

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        func = super().visit_function_(func)
        attrs = dict(func.attrs or {})
        if "Codegen" in attrs:
            del attrs["Codegen"]
            attrs.pop("global_symbol", None)  # the external symbol; the function becomes private
        attrs.pop("Composite", None)
        attrs.pop("Primitive", None)
        return relax.Function(
            func.params, func.body, func.ret_ty, func.is_pure, tvm.ir.DictAttrs(attrs), func.span
        )


def strip_codegen(mod: tvm.IRModule) -> tvm.IRModule:
    """A partitioned module as plain Relax: the offloaded regions run on the CPU instead.

    Removes the ``Codegen`` / ``global_symbol`` attributes of the merged functions and the
    ``Composite`` / ``Primitive`` attributes of the composites inside them, then lifts the
    composites out as global functions (``relax.transform.LambdaLift``): ``main`` still calls the
    same functions, and ``tvm.compile(..., target="llvm")`` builds the module with no backend
    registered. It computes what the partitioned module computes, so a test can check that
    partitioning (and the folding before it) preserved the model.

    Parameters
    ----------
    mod : tvm.IRModule
        A module after :func:`partition_for_qdq_npu`; not changed.

    Returns
    -------
    tvm.IRModule
        The module without backend annotations.

    Examples
    --------
    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> scale, zp = relax.const(0.5), relax.const(0, "int8")
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         dq = bb.emit(relax.op.dequantize(relax.op.quantize(x, scale, zp), scale, zp))
    ...         w = bb.emit(relax.op.dequantize(relax.const(np.ones((4, 3), "int8")), scale, zp))
    ...         y = bb.emit_output(relax.op.matmul(dq, w))
    ...     _ = bb.emit_func_output(y)
    >>> partitioned = partition_for_qdq_npu(bb.get())
    >>> count_offloaded(partitioned)["offloaded"], count_offloaded(strip_codegen(partitioned))["offloaded"]
    (1, 0)
    >>> [(name, w.dtype.name, w.shape) for name, w in composite_weights(partitioned)]
    [('qdq_npu.matmul', 'int8', (4, 3))]
    """
    functions = dict(mod.functions)
    for gvar, func in _relax_functions(mod):
        functions[gvar] = _StripBackendAttrs(mod).visit_expr(func)
    stripped = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    # The composites are local functions, which the VM cannot compile in place.
    return relax.transform.LambdaLift()(stripped)
