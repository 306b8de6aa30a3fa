"""The one place that knows which TVM release fold_guard.relax runs on.

Relax changed names between releases (``relax.Constant`` became ``tvm.ir.GenericConst``,
``struct_info`` became ``ty``, ``name_hint`` became ``name``). Everything else in the adapter uses
the accessors below, so supporting another release means changing this module only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import tvm

from .._core.errors import UnsupportedIRError
from .._versions import major_minor

__all__ = [
    "ERROR_NAMESPACE",
    "SUPPORTED_TVM",
    "TVM_VERSION",
    "Constant",
    "ShapeType",
    "TensorType",
    "TupleType",
    "check_tvm_version",
    "constant_array",
    "dtype_of",
    "flatten_types",
    "has_type",
    "is_constant",
    "make_constant",
    "register_errors_with_ffi",
    "static_shape",
    "static_shape_under",
    "type_of",
    "var_name",
]

#: Releases the Relax adapter is tested on (major, minor).
SUPPORTED_TVM: Tuple[Tuple[int, int], ...] = ((0, 27),)

TVM_VERSION: str = tvm.__version__


#: The prefix of the names fold_guard's error classes are registered under with ``tvm_ffi``.
ERROR_NAMESPACE = "fold_guard"


def register_errors_with_ffi() -> None:
    """Let fold_guard's exceptions keep their class when raised inside a pass.

    A module pass runs behind TVM's FFI; an exception raised in it comes back to Python by its
    class name, and only names registered with ``tvm_ffi`` map back to their class (otherwise the
    caller sees a plain RuntimeError). They are registered under ``fold_guard.<ClassName>``, so
    they cannot take the place of another library's error of the same name (``tvm_ffi`` keeps one
    class per name, process-wide).
    """
    import tvm_ffi

    from .. import _core

    for name in _core.errors.__all__:
        tvm_ffi.register_error(f"{ERROR_NAMESPACE}.{name}", getattr(_core.errors, name))


def check_tvm_version(version: str = TVM_VERSION) -> None:
    """Raise UnsupportedIRError unless ``version`` is a release this adapter knows."""
    if major_minor(version) not in SUPPORTED_TVM:
        known = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_TVM)
        raise UnsupportedIRError(
            f"fold_guard.relax supports apache-tvm {known}, but tvm {version} is installed. "
            "Hint: pip install 'apache-tvm==0.27.0.post1' 'apache-tvm-ffi==0.1.14.post1'"
        )


# Refuse other releases before touching names that only 0.27 has (an older TVM would otherwise
# fail with an AttributeError on the line below instead of saying what to install).
check_tvm_version()

from tvm import relax  # noqa: E402 - after the version check, as above

Constant = tvm.ir.GenericConst
TensorType = relax.TensorType
TupleType = relax.TupleType
ShapeType = relax.ShapeType


def is_constant(expr: Any) -> bool:
    return isinstance(expr, Constant)


def constant_array(const: Any) -> tvm.runtime.Tensor:
    """The tensor a constant holds."""
    return const.value


def make_constant(array: tvm.runtime.Tensor) -> Any:
    return relax.const(array)


def type_of(expr: Any) -> Any:
    """The Relax type (formerly struct info) of an expression."""
    return expr.ty


def has_type(expr: Any) -> bool:
    """Whether ``expr`` has been normalized: an expression built outside a BlockBuilder
    (``relax.Call`` around un-normalized arguments) carries the bare ``tvm.ir.Type`` placeholder."""
    return type(expr.ty) is not tvm.ir.Type


def var_name(var: Any) -> str:
    return var.name


def static_shape(ty: Any) -> Optional[Tuple[Optional[int], ...]]:
    """Static dims of a TensorType (None per symbolic dim), or None if the shape is unknown."""
    if not isinstance(ty, TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    values = getattr(shape, "values", None)
    if values is None:
        return None
    return tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else None for v in values)


def flatten_types(ty: Any) -> List[Any]:
    """The leaf types of a (possibly nested) TupleType, in order; ``[ty]`` for anything else."""
    if isinstance(ty, TupleType):
        return [leaf for field_ in ty.fields for leaf in flatten_types(field_)]
    return [ty]


def static_shape_under(ty: Any, values: Dict[Any, int]) -> Optional[Tuple[Optional[int], ...]]:
    """The dims of a TensorType with its symbolic vars bound to ``values`` (None where unknown)."""
    from tvm.sym.analyzer import Analyzer  # 0.27 home of the arithmetic analyzer

    if (
        not isinstance(ty, TensorType)
        or ty.shape is None
        or getattr(ty.shape, "values", None) is None
    ):
        return None
    analyzer = Analyzer()
    for var, value in values.items():
        analyzer.bind(var, tvm.tirx.IntImm("int64", value))
    dims = [analyzer.simplify(dim) for dim in ty.shape.values]
    return tuple(int(dim.value) if isinstance(dim, tvm.tirx.IntImm) else None for dim in dims)


def dtype_of(ty: Any) -> str:
    """dtype string of a TensorType ("" when unknown)."""
    dtype = ty.dtype
    if dtype is None:
        return ""
    inner = getattr(dtype, "dtype", dtype)
    return str(inner)
