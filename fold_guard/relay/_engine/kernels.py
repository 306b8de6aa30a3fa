"""Evaluate many folded calls of one op signature with one set of kernels.

Stock ``FoldConstant`` evaluates ``op(<constants>)`` with the interpreter's ``EvalFunction``:
SimplifyInference, QNN Legalize/Canonicalize, FuseOps at level 0, LowerTE, then one kernel build
per primitive function, for every call and every shape. Two ways to share that work, both
through the same pipeline, fresh PassContext and target as stock:

* **flattened** (:func:`flat_form`, :func:`flat_calls`): for the elementwise ops of
  :data:`ELEMENTWISE_OPS`, every output element is the op's scalar arithmetic on the operand
  elements at the same (broadcast) index, and nothing else. So the calls of one signature are
  evaluated as *one* call on 1-D operands: each tensor operand broadcast to its call's output
  shape on the host (an exact copy of elements), flattened and concatenated with the other
  calls'; per-channel QNN scales and zero points are broadcast along their axis the same way.
  The elements are cut into calls of exactly FLAT_CHUNK elements (the last padded), so a
  signature compiles one set of kernels for any number and shape of calls, and the results are
  split and reshaped back. Scalar operands stay scalar constants, as in stock's
  expression (FuseOps and LowerTE inline them into the kernel as immediates, and QNN
  canonicalization branches on them), and are part of the signature bit for bit. The kernels
  differ from stock's only in loop bounds and vectorization, which cannot change an element's
  bits on the evaluation target (x86-64 baseline: no FMA); ``tests/relay/test_shape_generic.py``
  checks every op against stock bit for bit, at the corners of its arithmetic. Two cases do
  depend on the kernel and stay per call: a float cast to an integer type narrower than 32 bits
  (out-of-range values) and float add / subtract / multiply / divide where both operands are NaN
  (which NaN comes out).
* **prepared** (:class:`PreparedKernel`): calls of one exact signature (op, attributes, operand
  types, scalar values) are evaluated by one ``relay.Function`` over their tensor operands,
  prepared once and applied to each call's constants. After FuseOps at level 0 every op is its
  own primitive function whose parameters are the tensor operands (stock does not link
  constants into kernels), so each kernel is the one stock lowers for that call. Only ops whose
  lowering reads operand *types* qualify: QNN ops other than quantize / dequantize read tensor
  constants' values while canonicalizing (requantize's per-channel multipliers) and stay on the
  batched path of :mod:`fold_guard.relay._engine.evaluate`, which evaluates the very expression stock
  evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relay

from ..._core.errors import PlanInvariantError
from .._stock import evaluation_target

__all__ = [
    "ELEMENTWISE_OPS",
    "FLAT_CHUNK",
    "QNN_READ_TYPES_ONLY",
    "FlatForm",
    "PreparedKernel",
    "flat_calls",
    "flat_form",
    "prepared_key",
    "same_attrs",
    "scalar_key",
    "unflatten",
]

#: QNN ops whose canonicalization (``FTVMQnnCanonicalize``) reads only the types of its operands
#: and whether a scale / zero point is a constant scalar, never a tensor constant's values
#: (``QuantizeLower`` / ``DequantizeLower`` in ``src/relay/qnn/op/``).
QNN_READ_TYPES_ONLY = frozenset({"qnn.quantize", "qnn.dequantize"})

#: QNN ops flattened with their per-channel operands broadcast along ``axis``.
_QNN_PER_AXIS = {"qnn.quantize": relay.qnn.op.quantize, "qnn.dequantize": relay.qnn.op.dequantize}

#: Ops evaluated flattened: each output element depends only on the operand elements at its
#: (broadcast) index, through arithmetic that does not depend on the shape, and the attributes
#: say nothing about shapes (other than a QNN op's channel axis). Each is checked bit-identical
#: to stock in tests/relay/test_shape_generic.py.
ELEMENTWISE_OPS = frozenset(
    set(_QNN_PER_AXIS)
    | {
        # unary
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
        # binary, broadcasting
        "add",
        "subtract",
        "multiply",
        "divide",
        "maximum",
        "minimum",
    }
)

#: Elements of one flattened evaluation: every flattened call has operands of exactly this many
#: elements (the last padded), so a signature compiles one kernel set however many elements its
#: calls have, and one evaluation holds only its operands and intermediates (1 MiB per float32
#: tensor). Padding a small group costs microseconds per kernel; a kernel build costs tens of ms.
FLAT_CHUNK = 1 << 18

#: Integer dtypes a float cast may be flattened to. A float outside the target's range has no
#: defined integer value (LLVM: poison); x86 gives the 32-bit "integer indefinite" either way for
#: these, but a narrower cast truncates a 32-bit conversion in scalar code and packs differently
#: in vector code, so kernels of different shapes disagree on such values (measured: float32 ->
#: int8 / uint8 of 300.0 and 3e9 between the static and a shape-generic kernel).
_FLOAT_CAST_TARGETS = frozenset({"int32", "int64"})


def _is_scalar(arg: relay.Constant) -> bool:
    return not arg.data.shape


def scalar_key(arg: relay.Constant) -> Tuple[object, ...]:
    """What a scalar constant operand makes of a kernel's signature.

    It is inlined as an immediate, so its value is part of the kernel, bit for bit (-0.0 is not
    0.0, and every NaN payload is its own).
    """
    return ("scalar", str(arg.data.dtype), arg.data.numpy().tobytes())


def _attrs_key(expr: relay.Call) -> int:
    return 0 if expr.attrs is None else int(tvm.ir.structural_hash(expr.attrs))


def same_attrs(a: relay.Call, b: relay.Call) -> bool:
    """Whether two calls have equal attributes (forms key on their hash only)."""
    if a.attrs is None or b.attrs is None:
        return a.attrs is None and b.attrs is None
    return bool(tvm.ir.structural_equal(a.attrs, b.attrs))


def _constant_args(expr: relay.Expr) -> bool:
    return (
        isinstance(expr, relay.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and all(isinstance(arg, relay.Constant) for arg in expr.args)
    )


# --- flattened -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlatForm:
    """A call's flattened signature (``key``) and the shape its elements are laid out in."""

    key: Tuple[object, ...]
    out_shape: Tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.out_shape, dtype=np.int64))


def _flat_attrs_key(expr: relay.Call) -> object:
    if expr.op.name in _QNN_PER_AXIS:
        return str(expr.attrs.out_dtype)  # the axis only says how operands broadcast
    return _attrs_key(expr)


def flat_form(expr: relay.Expr) -> Optional[FlatForm]:
    """The flattened form of ``expr`` (an op applied to constants), or None if it has none."""
    if not _constant_args(expr) or expr.op.name not in ELEMENTWISE_OPS:
        return None
    name = expr.op.name
    shapes = [tuple(int(d) for d in arg.data.shape) for arg in expr.args]
    if name in _QNN_PER_AXIS:
        out_shape = shapes[0]
        if not out_shape:
            return None
        axis = int(expr.attrs.axis)
        if not -len(out_shape) <= axis < len(out_shape):
            return None
        if any(shape and shape not in ((1,), (out_shape[axis],)) for shape in shapes[1:]):
            return None  # not per-channel along the axis: let stock's evaluation say what it is
    else:
        try:
            out_shape = tuple(int(d) for d in np.broadcast_shapes(*shapes))
        except ValueError:
            return None
    if name == "cast":
        source, target = str(expr.args[0].data.dtype), str(expr.attrs.dtype)
        if _is_float(source) and not _is_float(target) and target not in _FLOAT_CAST_TARGETS:
            return None
    if not out_shape or int(np.prod(out_shape)) == 0:
        return None  # nothing to share
    if name in _NAN_OPERAND_ORDER_OPS and _nan_meets_nan(expr, out_shape):
        return None
    args = tuple(
        scalar_key(arg) if _is_scalar(arg) else ("tensor", str(arg.data.dtype)) for arg in expr.args
    )
    return FlatForm((name, _flat_attrs_key(expr), args), out_shape)


#: Float ops whose result, where *both* operands are NaN, is one of the two NaNs: which one (its
#: sign and payload) depends on the operand order in the instruction, which LLVM may commute
#: (measured: a float32 ``add`` of NaN and -NaN gave NaN in one kernel and -NaN in another).
_NAN_OPERAND_ORDER_OPS = frozenset({"add", "subtract", "multiply", "divide"})


def _nan_meets_nan(expr: relay.Call, out_shape: Tuple[int, ...]) -> bool:
    """Whether some output element of ``expr`` has NaN in both operands."""
    a, b = (arg.data.numpy() for arg in expr.args)
    if not (_is_float(str(a.dtype)) and _is_float(str(b.dtype))):
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not (nan_a.any() and nan_b.any()):
        return False
    return bool(np.logical_and(nan_a, nan_b).any())


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _flat_parts(expr: relay.Call, index: int, out_shape: Tuple[int, ...]) -> Iterator[np.ndarray]:
    """Operand ``index`` of ``expr`` broadcast to ``out_shape`` and flattened, in pieces.

    Pieces of about FLAT_CHUNK elements (whole rows), so that a large weight's per-channel scale
    is never materialized at the weight's full size.
    """
    data = expr.args[index].data.numpy()
    if expr.op.name in _QNN_PER_AXIS and index > 0:
        # A per-channel scale or zero point: its elements run along the data's axis.
        axis = int(expr.attrs.axis) % len(out_shape)
        view = [1] * len(out_shape)
        view[axis] = data.shape[0]
        data = data.reshape(view)
    full = np.broadcast_to(data, out_shape)
    row = int(np.prod(out_shape[1:], dtype=np.int64))
    rows = max(1, FLAT_CHUNK // max(row, 1))
    for start in range(0, out_shape[0], rows):
        yield full[start : start + rows].reshape(-1)


def _operand_parts(
    calls: Sequence[relay.Call], forms: Sequence[FlatForm], index: int
) -> Iterator[np.ndarray]:
    for call, form in zip(calls, forms):
        yield from _flat_parts(call, index, form.out_shape)


def _chunked(parts: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """``parts`` concatenated and cut into arrays of exactly FLAT_CHUNK elements.

    The last one is padded by repeating its last element: padding lanes compute a value already
    computed (no new trap, such as an integer division by zero), and are dropped.
    """
    pending: List[np.ndarray] = []
    filled = 0
    for part in parts:
        start = 0
        while start < part.size:
            take = min(FLAT_CHUNK - filled, part.size - start)
            pending.append(part[start : start + take])
            filled += take
            start += take
            if filled == FLAT_CHUNK:
                yield np.concatenate(pending)
                pending, filled = [], 0
    if filled:
        yield np.pad(np.concatenate(pending), (0, FLAT_CHUNK - filled), mode="edge")


def flat_calls(calls: Sequence[relay.Call], forms: Sequence[FlatForm]) -> Iterator[relay.Call]:
    """Calls of one flattened signature whose elements are all those of ``calls``, in order.

    Each has operands of exactly FLAT_CHUNK elements (the last one padded) and the template's
    scalar operands and attributes (a QNN op's axis becomes 0, its operands being 1-D).
    """
    template = calls[0]
    streams: List[Optional[Iterator[np.ndarray]]] = []
    for index, arg in enumerate(template.args):
        if _is_scalar(arg):
            streams.append(None)
            continue
        streams.append(_chunked(_operand_parts(calls, forms, index)))
    total = sum(form.size for form in forms)
    for _ in range(-(-total // FLAT_CHUNK)):
        args = [
            arg if stream is None else relay.const(next(stream))
            for arg, stream in zip(template.args, streams)
        ]
        if template.op.name in _QNN_PER_AXIS:
            build = _QNN_PER_AXIS[template.op.name]
            yield build(*args, axis=0, out_dtype=str(template.attrs.out_dtype))
        else:
            yield relay.Call(template.op, args, template.attrs, None, template.span)


def unflatten(chunks: Iterator[np.ndarray], forms: Sequence[FlatForm]) -> List[relay.Constant]:
    """The results of :func:`flat_calls`, in order, split back into one constant per call."""
    results: List[relay.Constant] = []
    chunk = np.empty(0)
    offset = 0
    for form in forms:
        out: Optional[np.ndarray] = None
        filled = 0
        while filled < form.size:
            if offset == chunk.size:
                chunk, offset = next(chunks), 0
            if out is None:
                out = np.empty(form.size, dtype=chunk.dtype)
            take = min(form.size - filled, chunk.size - offset)
            out[filled : filled + take] = chunk[offset : offset + take]
            filled += take
            offset += take
        assert out is not None  # a form has at least one element
        results.append(relay.Constant(tvm.nd.array(out.reshape(form.out_shape))))
    return results


# --- prepared ------------------------------------------------------------------------------------


def prepared_key(expr: relay.Expr) -> Optional[Tuple[object, ...]]:
    """The exact signature of ``expr`` (an op applied to constants), or None if it must stay batched.

    None for calls with a tuple operand (concatenate's) and for QNN ops whose lowering reads
    constant values.
    """
    if not _constant_args(expr):
        return None
    name = expr.op.name
    if name.startswith("qnn.") and name not in QNN_READ_TYPES_ONLY:
        return None
    args = tuple(
        scalar_key(arg)
        if _is_scalar(arg)
        else ("tensor", str(arg.data.dtype), tuple(int(d) for d in arg.data.shape))
        for arg in expr.args
    )
    return (name, _attrs_key(expr), args)


def _result_type(func: relay.Function) -> relay.Type:
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    return typed["main"].body.checked_type


class PreparedKernel:
    """``op`` over parameters, prepared once by the interpreter and applied to each call's constants.

    ``template`` is one call of a group of calls with one :func:`prepared_key`. Kernels compile
    on the first application and live as long as this object.
    """

    def __init__(self, template: relay.Call) -> None:
        params: List[relay.Var] = []
        body_args: List[relay.Expr] = []
        for position, arg in enumerate(template.args):
            if _is_scalar(arg):
                body_args.append(arg)
                continue
            param = relay.var(f"p{position}", relay.TensorType(arg.data.shape, str(arg.data.dtype)))
            params.append(param)
            body_args.append(param)
        body = relay.Call(template.op, body_args, template.attrs, template.type_args, template.span)
        func = relay.Function(params, body)
        # Some ops type their result from a tensor operand's value when it is a constant (arange
        # of constants is static, of parameters dynamic): then the parameters change the kernels.
        expected = _result_type(relay.Function([], template))
        if not tvm.ir.structural_equal(_result_type(func), expected):
            raise PlanInvariantError(
                f"{template.op.name} over parameters does not type as over its constants"
            )
        # A fresh PassContext, as stock's ConstEvaluate.
        with tvm.transform.PassContext():
            executor = relay.create_executor(
                "debug", mod=tvm.IRModule(), device=tvm.cpu(0), target=evaluation_target()
            )
            self._apply = executor.evaluate(func)

    def __call__(self, call: relay.Call) -> object:
        """The interpreter's value of ``call`` (same key as the template): an NDArray or a tuple."""
        tensors: Sequence[relay.Expr] = [arg for arg in call.args if not _is_scalar(arg)]
        # Kernels are built on first use, so under a fresh PassContext too.
        with tvm.transform.PassContext():
            return self._apply(*tensors)
