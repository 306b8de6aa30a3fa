"""The one place that knows which TVM release fold_guard.relax runs on.

Relax changed names between releases (``relax.Constant`` became ``tvm.ir.GenericConst``,
``struct_info`` became ``ty``, ``name_hint`` became ``name``). The adapter reads those names
through the accessors below, and builds the IR it writes (calls, constants, source positions)
through the constructors below, so they are the first thing to change for another release; the
stock pass's rules (``_stock``), the legalization and build calls (``_translate``, ``_engine``)
and the ops' registration (``_ops``) need a look too.

**The next release (0.28), as apache/tvm's main branch has it.** Read on main after the 0.27
release (the commits are the search index's stored versions of each file; none is in a release
yet):

- Source positions: ``tvm.ir.Span`` is gone; every node has ``loc``, a ``tvm.ir.Location``
  (``python/tvm/ir/location.py`` at 409352e68e84: ``Location``, ``UnknownLoc``, ``SourceLoc``,
  the shared ``UNKNOWN_LOC``), and constructors default to ``UNKNOWN_LOC`` instead of ``None``.
  Here: :data:`POSITION_FIELD` (``"span"`` -> ``"loc"``), read by :func:`position_of` and passed by
  :func:`make_call` only when there is one.
- Calls: ``tvm.ir.Call(op, args, attrs=None, ty_args=None, loc=UNKNOWN_LOC, ty=None)``
  (``python/tvm/ir/expr.py`` at 409352e68e84); 0.27's ``relax.Call`` has ``span`` and ``ret_ty``
  there. Here: :func:`make_call` / :func:`rebuild_call` pass every argument after ``args`` by
  keyword, so only :data:`POSITION_FIELD` and :data:`RESULT_TYPE_KEYWORD` (``"ret_ty"`` ->
  ``"ty"``) change.
- Op builders: generated from each Op's registered signature (``_make_op_api`` in
  ``python/tvm/ir/op.py`` at 01c2f8588c6a): operands positional, then keyword-only ``attrs``,
  ``ty_args``, ``loc``, ``ty``, and every attribute by keyword (a positional attribute would be
  taken for an operand). The adapter passes attributes by keyword (``relax.op.full(shape, fill,
  dtype=...)``), which 0.27 accepts too.
- ``call_tir``: ``relax.op.call_tir(func, args, *, ty_args, ...)`` (``python/tvm/relax/op/base.py``
  at 01c2f8588c6a); 0.27 has ``call_tir(gvar, args, out_ty)``. The output type of a call_tir is
  still its ``ty_args[0]``: :func:`call_tir_output_type`.
- Constants: ``GenericConst(value, ty, loc)`` on main (``python/tvm/ir/expr.py`` at
  409352e68e84), ``GenericConst(ty, value, loc)`` in apache-tvm-tirx 0.1.0a4
  (``tvm_tirx/ir/expr.py``), ``GenericConst(value, ty, span)`` in 0.27: :func:`make_generic_const`
  passes ``value=`` and ``ty=`` by keyword, which all three accept.

A test (``tests/relax/test_compat.py``) checks that no other module of the adapter constructs a
``relax.Call`` or a ``GenericConst``, or reads ``.span``, itself.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Tuple,
    TypeVar,
)

import tvm

from .._core.errors import UnsupportedIRError
from .._tvm.versions import major_minor

__all__ = [
    "ERROR_NAMESPACE",
    "POSITION_FIELD",
    "RESULT_TYPE_KEYWORD",
    "SUPPORTED_TVM",
    "TVM_VERSION",
    "BuildingFunction",
    "Constant",
    "ShapeType",
    "TensorType",
    "TupleType",
    "building_function",
    "call_tir_output_type",
    "check_tvm_version",
    "constant_array",
    "dtype_of",
    "flatten_types",
    "handle",
    "has_type",
    "is_constant",
    "make_call",
    "make_constant",
    "make_generic_const",
    "position_of",
    "read_attrs",
    "rebuild_call",
    "register_errors_with_ffi",
    "remembered",
    "remembering_types",
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


def make_generic_const(value: Any, ty: Any) -> Any:
    """A ``GenericConst`` of ``value`` with type ``ty``, by keyword (the argument order differs
    between 0.27, main and apache-tvm-tirx; the names do not)."""
    return Constant(value=value, ty=ty)


#: The field of an IR node that holds its source position: ``span`` in 0.27, ``loc`` on main.
POSITION_FIELD = "span"
#: ``relax.Call``'s keyword for an explicit result type: ``ret_ty`` in 0.27, ``ty`` on main.
RESULT_TYPE_KEYWORD = "ret_ty"


def position_of(node: Any) -> Any:
    """Where ``node`` came from in the source (a ``Span`` in 0.27), or None."""
    return getattr(node, POSITION_FIELD, None)


def make_position(source: str, line: int) -> Any:
    """A source position naming ``source`` at ``line`` (a ``Span`` in 0.27, a ``Location`` on main)."""
    return tvm.ir.Span(tvm.ir.SourceName(source), line, line, 0, 0)


def position_line(node: Any, source: str) -> Optional[int]:
    """The line of ``node``'s source position if that position names ``source``, else None."""
    position = position_of(node)
    if position is None or str(position.source_name.name) != source:
        return None
    return int(position.line)


def make_call(
    op: Any,
    args: Any,
    attrs: Any = None,
    ty_args: Any = None,
    *,
    position: Any = None,
    ty: Any = None,
) -> Any:
    """A Relax call; every argument after ``args`` goes by keyword (see the module docstring).

    ``ty`` is the call's result type where the caller knows it (else the normalizer infers it);
    ``position`` its source position, left to the constructor's default when None.
    """
    keywords: Dict[str, Any] = {"attrs": attrs, "ty_args": ty_args}
    if position is not None:
        keywords[POSITION_FIELD] = position
    if ty is not None:
        keywords[RESULT_TYPE_KEYWORD] = ty
    return relax.Call(op, list(args), **keywords)


def rebuild_call(call: Any, args: Any, *, ty: Any = None) -> Any:
    """``call`` with new arguments: its op, attributes, type arguments and source position."""
    return make_call(call.op, args, call.attrs, call.ty_args, position=position_of(call), ty=ty)


def call_tir_output_type(call: Any) -> Any:
    """The output type a ``call_tir`` declares (its first type argument)."""
    return call.ty_args[0]


def type_of(expr: Any) -> Any:
    """The Relax type (formerly struct info) of an expression."""
    return expr.ty


def has_type(expr: Any) -> bool:
    """Whether ``expr`` has been normalized: an expression built outside a BlockBuilder
    (``relax.Call`` around un-normalized arguments) carries the bare ``tvm.ir.Type`` placeholder."""
    return type(expr.ty) is not tvm.ir.Type


def handle(obj: Any) -> int:
    """The address of the TVM object ``obj`` refers to: a dict key for identity.

    Every read of a field gives a new Python wrapper, so a dict keyed by expressions compares
    wrappers with ``==``, which on a Relax expression first reads its type on every
    lookup. Two wrappers of one object have the same address, and it stays unique while the
    object is alive (the caller keeps it alive, usually through the module).
    """
    return obj.__chandle__()


def var_name(var: Any) -> str:
    return var.name


#: Per type object (keyed by its address, see :func:`remembering_types`): the object itself and
#: the facts read of it, or None outside a ``remembering_types`` block.
_TYPE_MEMO: contextvars.ContextVar[Optional[Dict[int, Tuple[Any, Dict[str, Any]]]]] = (
    contextvars.ContextVar("fold_guard_relax_type_memo", default=None)
)
_UNREAD = object()
T = TypeVar("T")


@contextlib.contextmanager
def remembering_types() -> Iterator[None]:
    """Within the block, each fact of a type object (:func:`remembered`) is read once.

    A fold reads the same types many times (lowering, kernel signatures, the rewrite's stock
    rules, byte counts: each type several times over), and every
    read of a shape costs one TVM FFI call per dim. The memo is keyed by the object's address and
    keeps the object alive, so no other object can take that address while the block runs; TVM
    types are immutable, so a remembered answer never goes stale. Nested blocks share the
    outermost memo, which is dropped when that block ends.
    """
    if _TYPE_MEMO.get() is not None:
        yield
        return
    token = _TYPE_MEMO.set({})
    try:
        yield
    finally:
        _TYPE_MEMO.reset(token)


def remembered(ty: Any, fact: str, read: Callable[[Any], T]) -> T:
    """``read(ty)``, read once per type object and ``fact`` inside :func:`remembering_types`.

    ``read`` must depend on nothing but ``ty`` (and ``fact`` name it uniquely).
    """
    memo = _TYPE_MEMO.get()
    handle = getattr(ty, "__chandle__", None) if memo is not None else None
    if handle is None:
        return read(ty)
    key = handle()
    entry = memo.get(key)  # type: ignore[union-attr]
    if entry is None:
        entry = memo[key] = (ty, {})  # type: ignore[index]
    facts = entry[1]
    value = facts.get(fact, _UNREAD)
    if value is _UNREAD:
        value = facts[fact] = read(ty)
    return value


def static_shape(ty: Any) -> Optional[Tuple[Optional[int], ...]]:
    """Static dims of a TensorType (None per symbolic dim), or None if the shape is unknown."""
    if not isinstance(ty, TensorType):
        return None
    return remembered(ty, "static_shape", _read_static_shape)


def _read_static_shape(ty: Any) -> Optional[Tuple[Optional[int], ...]]:
    shape = ty.shape
    if shape is None:
        return None
    values = getattr(shape, "values", None)
    if values is None:
        return None
    # a slice fetches the dims in one comprehension; iterating a tvm_ffi Array costs two more
    # Python calls per element
    return tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else None for v in values[:])


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
    return remembered(ty, "dtype", _read_dtype)


def _read_dtype(ty: Any) -> str:
    dtype = ty.dtype
    if dtype is None:
        return ""
    inner = getattr(dtype, "dtype", dtype)
    return str(inner)


class BuildingFunction(NamedTuple):
    """A function in the middle of being built, and the names of its module's functions."""

    name: str
    params: Tuple[Any, ...]
    attrs: Dict[str, Any]
    module_functions: FrozenSet[str]


def building_function() -> Optional[BuildingFunction]:
    """The function being built right now, or None.

    Inside ``with bb.function(...)`` of a Python ``BlockBuilder``, or while TVMScript parses a
    function (the parser's innermost function frame; its module frame declares every function's
    name before any body is parsed). Both read builder internals of 0.27 (the builder's function
    scope, the IRBuilder's frames): a release that moves them makes this return None.
    """
    builder = relax.BlockBuilder.current()
    scopes = getattr(builder, "_func_stack", None)
    if builder is not None and scopes:
        scope = scopes[-1]
        names = frozenset(gvar.name_hint for gvar in builder.get().get_global_vars())
        return BuildingFunction(
            str(getattr(scope, "_name", "")),
            tuple(getattr(scope, "_params", None) or ()),
            dict(getattr(scope, "_attrs", None) or {}),
            names,
        )
    from tvm.script.ir_builder import IRBuilder

    if not IRBuilder.is_in_scope():
        return None
    frames = list(IRBuilder.current().frames)
    names = frozenset(
        str(name) for frame in frames[:1] for name in getattr(frame, "global_vars", {}).keys()
    )
    for frame in reversed(frames):
        if hasattr(frame, "params") and hasattr(frame, "attrs"):
            attrs = {str(k): v for k, v in frame.attrs.items()} if frame.attrs else {}
            name = str(frame.name) if frame.name is not None else ""
            return BuildingFunction(name, tuple(frame.params), attrs, names)
    return None


def read_attrs(attrs: Any) -> Dict[str, object]:
    """An attrs object's fields as plain Python values (``tvm.tirx`` immediates as numbers, arrays as
    tuples, anything else as its text); fields that do not read are left out."""
    result: Dict[str, object] = {}
    for key in dir(attrs):
        if key.startswith("_"):
            continue
        try:
            value = getattr(attrs, key)
        except Exception:  # noqa: BLE001 - reflection of arbitrary attrs; skip what does not read
            continue
        if callable(value):
            continue
        result[key] = _plain(value)
    return result


def _plain(value: object) -> object:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return value.value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_plain(v) for v in value)  # type: ignore[attr-defined]
    return str(value)
