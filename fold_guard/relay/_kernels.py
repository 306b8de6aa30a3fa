"""Evaluate many folded calls of one op signature through one prepared interpreter function.

Stock ``FoldConstant`` evaluates ``op(<constants>)`` with the interpreter's ``EvalFunction``:
SimplifyInference, QNN Legalize/Canonicalize, FuseOps at level 0, LowerTE, then one kernel build
per primitive function. Here a group of calls that compile to the same kernels is evaluated by
one ``relay.Function`` over the group's tensor operands, prepared once by ``EvalFunction`` (the
same pipeline, the same fresh PassContext, the same target) and then applied to each call's
constants. Scalar constants stay in the body as constants, as in stock's expression: FuseOps
and LowerTE inline them into the kernel as immediates, and QNN canonicalization branches on
whether a scale or zero point is a constant scalar.

Two forms:

* **static**: the parameters carry the call's own tensor types. After FuseOps at level 0 every
  op is its own primitive function whose parameters are the tensor operands (stock does not link
  constants into kernels), so each primitive function, and so each kernel, is the one stock
  lowers for that call. Calls repeated with one shape (transformer-like layers) compile once and
  skip the per-call preparation.
* **shape-generic**: for the ops of :data:`SHAPE_GENERIC_OPS` only, every dimension other than 1
  becomes ``relay.Any()`` (a dimension of 1 stays static: broadcasting depends on it), so
  differently shaped calls of one signature share one set of kernels, plus their shape functions.
  Each op there computes every output element from the input elements at the corresponding
  index alone, by arithmetic that does not depend on the shape, and its attributes say nothing
  about shapes; the kernels differ from the static ones only in loop bounds and vectorization,
  which cannot change an element's bits on the evaluation target (x86-64 baseline: no FMA).
  ``tests/relay/test_shape_generic.py`` checks each op against stock, bit for bit.

QNN ops whose canonicalization reads the *values* of constant tensor operands (requantize's
per-channel multipliers, for one) would lower differently with a parameter in their place, so
only :data:`QNN_READ_TYPES_ONLY` QNN ops take this path at all; the rest stay on the batched path
of :mod:`fold_guard.relay._evaluate`, which evaluates the very expression stock evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import tvm
from tvm import relay

from ._stock import evaluation_target

__all__ = [
    "QNN_READ_TYPES_ONLY",
    "SHAPE_GENERIC_OPS",
    "KernelForm",
    "PreparedKernel",
    "kernel_form",
    "same_attrs",
]

#: QNN ops whose canonicalization (``FTVMQnnCanonicalize``) reads only the types of its operands
#: and whether a scale / zero point is a constant scalar, never a tensor constant's values
#: (``QuantizeLower`` / ``DequantizeLower`` in ``src/relay/qnn/op/``).
QNN_READ_TYPES_ONLY = frozenset({"qnn.quantize", "qnn.dequantize"})

#: Ops evaluated with shape-generic kernels: per-element (or pure data movement), attributes
#: independent of the shape, a registered shape function, and checked bit-identical to stock.
SHAPE_GENERIC_OPS = frozenset(
    {
        "qnn.quantize",
        "qnn.dequantize",
        # unary elementwise
        "cast",
        "round",
        "floor",
        "ceil",
        "negative",
        "clip",
        "sqrt",
        "rsqrt",
        "exp",
        "log",
        "sigmoid",
        "tanh",
        # binary broadcasting
        "add",
        "subtract",
        "multiply",
        "divide",
        "maximum",
        "minimum",
        # data movement
        "transpose",
        "expand_dims",
    }
)

#: One tensor operand as a kernel sees it: dtype and shape (None for a dimension made ``Any``).
TensorKey = Tuple[str, Tuple[Optional[int], ...]]


@dataclass(frozen=True)
class KernelForm:
    """What decides the kernels of a call evaluated through a prepared function.

    ``key`` is hashable and equal for calls that share kernels: op, attributes (structural
    hash), and per operand either a scalar's dtype and value or a tensor's :data:`TensorKey`.
    ``static_key`` is the same with every tensor's full shape.
    """

    key: Tuple[object, ...]
    static_key: Tuple[object, ...]
    shape_generic: bool


def _is_scalar(arg: relay.Constant) -> bool:
    return not arg.data.shape


def _qnn_reads_values(op: tvm.ir.Op) -> bool:
    if not op.name.startswith("qnn."):
        return False
    return op.name not in QNN_READ_TYPES_ONLY


#: Integer dtypes a float cast may go shape-generic to. A float outside the target's range has
#: no defined integer value (LLVM: poison); x86 gives the 32-bit "integer indefinite" either
#: way for these, but a narrower cast truncates a 32-bit conversion in scalar code and packs
#: differently in vector code, so static and Any-shaped kernels disagree on such values
#: (measured: float32 -> int8 / uint8 of 300.0 and 3e9).
_FLOAT_CAST_TARGETS = frozenset({"int32", "int64"})


def _shape_generic(expr: relay.Call) -> bool:
    """Whether ``expr``'s kernels may be compiled with ``Any`` dimensions, bit-identically."""
    name = expr.op.name
    if name not in SHAPE_GENERIC_OPS:
        return False
    if name == "cast":
        source, target = str(expr.args[0].data.dtype), str(expr.attrs.dtype)
        narrowing = source.startswith(("float", "bfloat")) and not target.startswith(
            ("float", "bfloat")
        )
        return not narrowing or target in _FLOAT_CAST_TARGETS
    if name == "qnn.dequantize":
        # hhb-tvm's per-channel DequantizeLower reads the input's dimensions as constants
        # (it fails on Any); per-tensor scale and zero point lower without expansion.
        return all(_is_scalar(arg) for arg in expr.args[1:])
    return True


def kernel_form(expr: relay.Expr) -> Optional[KernelForm]:
    """The form of ``expr`` (an op applied to constants), or None if it must stay batched.

    None for calls with a tuple operand (concatenate's) and for QNN ops whose lowering reads
    constant values.
    """
    if not isinstance(expr, relay.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    if _qnn_reads_values(expr.op):
        return None
    if not all(isinstance(arg, relay.Constant) for arg in expr.args):
        return None
    generic = _shape_generic(expr)
    attrs = 0 if expr.attrs is None else tvm.ir.structural_hash(expr.attrs)
    static_args: List[object] = []
    generic_args: List[object] = []
    for arg in expr.args:
        dtype = str(arg.data.dtype)
        if _is_scalar(arg):
            # Inlined as an immediate: its value is part of the kernel, bit for bit (-0.0 is
            # not 0.0, and every NaN payload is its own).
            described: object = ("scalar", dtype, arg.data.numpy().tobytes())
            static_args.append(described)
            generic_args.append(described)
            continue
        shape = tuple(int(d) for d in arg.data.shape)
        static_args.append(("tensor", dtype, shape))
        generic_args.append(("tensor", dtype, tuple(d if d == 1 else None for d in shape)))
    static_key = (expr.op.name, attrs, tuple(static_args))
    key = (expr.op.name, attrs, tuple(generic_args)) if generic else static_key
    return KernelForm(key, static_key, generic)


def same_attrs(a: relay.Call, b: relay.Call) -> bool:
    """Whether two calls of one form have equal attributes (the form keys on their hash only)."""
    if a.attrs is None or b.attrs is None:
        return a.attrs is None and b.attrs is None
    return bool(tvm.ir.structural_equal(a.attrs, b.attrs))


class PreparedKernel:
    """``op`` over parameters, prepared once by the interpreter and applied to each call's constants.

    ``template`` is one call of the group (an op applied to constants); with ``shape_generic``
    the parameters' non-1 dimensions are ``relay.Any()``. Kernels compile on the first
    application and live as long as this object.
    """

    def __init__(self, template: relay.Call, *, shape_generic: bool) -> None:
        params: List[relay.Var] = []
        body_args: List[relay.Expr] = []
        for position, arg in enumerate(template.args):
            if _is_scalar(arg):
                body_args.append(arg)
                continue
            shape = [relay.Any() if shape_generic and int(d) != 1 else int(d) for d in arg.data.shape]
            param = relay.var(f"p{position}", relay.TensorType(shape, str(arg.data.dtype)))
            params.append(param)
            body_args.append(param)
        # Type arguments are solved again for the parameters' types.
        type_args = [] if shape_generic else template.type_args
        body = relay.Call(template.op, body_args, template.attrs, type_args, template.span)
        with tvm.transform.PassContext():
            executor = relay.create_executor(
                "debug", mod=tvm.IRModule(), device=tvm.cpu(0), target=evaluation_target()
            )
            self._apply = executor.evaluate(relay.Function(params, body))

    def __call__(self, call: relay.Call) -> object:
        """The interpreter's value of ``call`` (same form as the template): an NDArray or a tuple."""
        tensors: Sequence[relay.Expr] = [arg for arg in call.args if not _is_scalar(arg)]
        # A fresh PassContext, as stock's ConstEvaluate: kernels are built on first use.
        with tvm.transform.PassContext():
            return self._apply(*tensors)
