"""What the adapter reads of a Relax module and its bindings: checks, tensor types, attributes.

:func:`check_relax_module` is every entry point's first check (an IRModule of Relax functions).
Small readers :mod:`.walk` uses for every call binding: the preconditions a binding must meet
(well-formed annotations, a normalized body), the kernel a kernel call calls,
the :class:`~fold_guard._core.graph.TensorInfo` of a type (remembered per type object, see
``_compat.remembering_types``), and a call's attributes as plain Python values, read on first
use.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import tvm
from tvm import relax

from ..._core.errors import PreconditionError, UnsupportedIRError
from ..._core.graph import TensorInfo
from ..._tvm.adapter import check_module
from .. import _compat
from .._ops import FOLD_ALLOW_OP, FOLD_BARRIER_OP, non_tensor_operand_error

__all__ = [
    "KERNEL_CALL_OPS",
    "attrs_of",
    "callee_of",
    "check_annotation",
    "check_normalized",
    "check_relax_module",
    "output_infos",
    "tensor_info",
]


def check_relax_module(mod: object) -> None:
    """Refuse anything but an IRModule of Relax functions, PrimFuncs and externs."""
    check_module(
        mod,
        "fold_guard.relax",
        (relax.Function, tvm.tirx.PrimFunc, relax.ExternFunc),
        not_module_hint="wrap a Relax function with tvm.IRModule({'main': func})",
        other_ir_hint=" (a Relay module? this release folds Relax only)",
        importers=IMPORTERS,
    )


#: The frontend call that makes a module of a model passed as it is, by the model's type.
IMPORTERS = {
    "onnx.ModelProto": "tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)",
    "torch.ExportedProgram": "tvm.relax.frontend.torch.from_exported_program(program, "
    "custom_convert_map=fold_guard.relax.frontends.torch_quantized_convert_map())",
}


def check_annotation(scope: str, label: str, value: relax.Expr, args: List[relax.Expr]) -> None:
    """Refuse a malformed annotation (first: a hand-built one is usually not normalized either)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
        return
    op_name = value.op.name
    if op_name not in (FOLD_BARRIER_OP, FOLD_ALLOW_OP):
        return
    if len(args) != 1:
        raise UnsupportedIRError(
            f"function {scope}: {label} = {op_name} has {len(args)} operands, expected 1"
        )
    if _compat.has_type(args[0]) and not isinstance(_compat.type_of(args[0]), _compat.TensorType):
        raise non_tensor_operand_error(op_name, args[0], f"function {scope}: {label} = ")


def check_normalized(scope: str, label: str, value: relax.Expr, args: List[relax.Expr]) -> None:
    """Refuse a binding whose value (or an argument of it) has no type yet.

    Normalizing it here would not help: TVM's normalizer writes the types it infers into the
    existing nodes, which are the caller's, so the caller's module would change.
    """
    parts = [value, *args]
    if all(_compat.has_type(part) for part in parts):
        return
    what = (
        value.op.name
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
        else type(value).__name__
    )
    raise PreconditionError(
        f"function {scope}: {label} = {what}(...) has no type yet, so the body is not normalized "
        "(it was built around relax.Call objects outside a BlockBuilder); fold_guard does not "
        "normalize it itself, because TVM's normalizer writes types into the caller's nodes. "
        "Hint: run relax.transform.Normalize() first"
    )


#: Ops whose first argument is the thing called (a PrimFunc's GlobalVar or an extern), with the
#: tensor operands in a tuple after it: calls into a kernel rather than an operator.
KERNEL_CALL_OPS = frozenset(
    {
        "relax.call_tir",
        "relax.call_tir_inplace",
        "relax.call_tir_with_grad",
        "relax.call_dps_packed",
        "relax.call_pure_packed",
        "relax.call_inplace_packed",
    }
)


def callee_of(mod: tvm.IRModule, call: relax.Call) -> Tuple[str, Optional[int]]:
    """The kernel a kernel call calls, and its ``op_pattern`` where ``AnnotateTIROpPattern`` set one.

    The name is the PrimFunc's ``global_symbol`` (what TVM's fusions read as ``name_hint`` is the
    GlobalVar's; a module keeps the two equal), else the GlobalVar's name, or an extern's name.
    """
    callee = call.args[0] if call.args else None
    if isinstance(callee, relax.ExternFunc):
        return str(callee.global_symbol), None
    if not isinstance(callee, tvm.ir.GlobalVar):
        return "", None
    func = mod.functions.get(callee) if callee in mod.functions else None
    attrs = getattr(func, "attrs", None)
    symbol = attrs.get("global_symbol") if attrs is not None else None
    pattern = attrs.get("op_pattern") if attrs is not None else None
    name = str(symbol) if symbol is not None else callee.name_hint
    return name, None if pattern is None else int(pattern)


def tensor_info(ty) -> TensorInfo:
    # a call's result type is also the type of its variable, read again by every consumer
    return _compat.remembered(ty, "tensor_info", _read_tensor_info)


def _read_tensor_info(ty) -> TensorInfo:
    return TensorInfo.of(_compat.dtype_of(ty), _compat.static_shape(ty))


def output_infos(ty) -> Tuple[TensorInfo, ...]:
    return tuple(
        tensor_info(leaf)
        if isinstance(leaf, _compat.TensorType)
        else TensorInfo(
            "shape" if isinstance(leaf, _compat.ShapeType) else type(leaf).__name__, None, 0
        )
        for leaf in _compat.flatten_types(ty)
    )


class _CallAttrs(Mapping[str, object]):
    """A call's attributes as plain Python values (``FoldNode.attrs``), read on first use.

    Reading them is reflection over the attrs object, an FFI read per field (tens of
    microseconds a call), and only a policy that looks at attributes needs them: none of the
    built-in ones does. Attrs objects are immutable, so reading late gives what reading early
    would have.
    """

    __slots__ = ("_attrs", "_values")

    def __init__(self, attrs: tvm.ir.Attrs):
        self._attrs: Optional[tvm.ir.Attrs] = attrs
        self._values: Optional[Dict[str, object]] = None

    def _read(self) -> Dict[str, object]:
        if self._values is None:
            self._values = _compat.read_attrs(self._attrs)
            self._attrs = None
        return self._values

    def __getitem__(self, key: str) -> object:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())

    def __reduce__(self):
        return (dict, (self._read(),))


def attrs_of(call: relax.Call) -> Mapping[str, object]:
    attrs = call.attrs
    return {} if attrs is None else _CallAttrs(attrs)
