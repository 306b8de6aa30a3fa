"""A Relax backend's pattern table: found by name, read into the core's description, run on a module.

A table is what ``FuseOpsByPattern`` takes (``FusionPattern`` objects or tuples ``(name,
pattern[, annotations[, check]])``, highest priority first) or the name of one in TVM's pattern
registry (:data:`REGISTRY`; any other name is taken as a prefix of registered pattern names,
as ``get_patterns_with_prefix`` reads them). :func:`read_pattern` walks a ``tvm.relax.dpl``
tree into :mod:`fold_guard._core.pattern_spec`.

:func:`composites_of` runs the table on a module whose calls carry tags (:func:`tag_calls`:
a ``Span`` naming the graph node each call is, which TVM's fusion and fold_guard's rewrite keep)
and returns which tagged call ended in which composite. A check that raises or prints is run
inside a guard: it counts as refusing, and what it said is kept for the report (Ethos-N-style
checks print when their library is missing).
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tvm
from tvm import relax
from tvm.relax.dpl import pattern as P
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.transform import FusionPattern

from ..._core.errors import PreconditionError
from ..._core.pattern_spec import (
    AllOf,
    AnyValue,
    ConstantValue,
    Constrained,
    ItemOf,
    OneOf,
    OpCall,
    PatternNode,
    PatternSpec,
    StaticValue,
    TableSpec,
    TupleOf,
    Unread,
    default_table_name,
)
from .. import _compat

__all__ = [
    "REGISTRY",
    "TAG_SOURCE",
    "RelaxTable",
    "composites_of",
    "read_pattern",
    "resolve_table",
    "tag_calls",
]

#: Names of TVM 0.27's Relax tables: the module that registers each, its patterns' prefix in the
#: registry, and the function that gives the table as the backend's own pipeline runs it where
#: that is not the registry's order (CLML's ``OpenCLMLOffLoad`` runs ``clml_pattern_table()``;
#: the registry lists the same patterns in the opposite priority).
REGISTRY: Dict[str, Tuple[str, str, str]] = {
    "example_npu": ("tvm.relax.backend.contrib.example_npu", "example_npu", ""),
    "nnapi": ("tvm.relax.backend.contrib.nnapi", "nnapi", ""),
    "cublas": ("tvm.relax.backend.cuda.cublas", "cublas", ""),
    "cutlass": ("tvm.relax.backend.cuda.cutlass", "cutlass", ""),
    "clml": ("tvm.relax.backend.adreno.clml", "openclml", "clml_pattern_table"),
}
#: The source name of the spans :func:`tag_calls` writes; the line is the node id plus one.
TAG_SOURCE = "fold_guard.offload"

TableLike = Union[str, Sequence[Union[FusionPattern, Tuple[Any, ...]]]]


@dataclass
class RelaxTable:
    """A table as ``FuseOpsByPattern`` runs it, its description, and what its checks said."""

    name: str
    patterns: Tuple[FusionPattern, ...]
    spec: TableSpec
    #: pattern name -> what its check raised or printed while a table ran (first time)
    check_notes: Dict[str, str] = field(default_factory=dict)

    def check_text(self, pattern: str) -> str:
        """``its check _check_conv2d (it printed ...)``: the check by name where it has one."""
        found = self.spec.pattern(pattern)
        name = f" {found.check}" if found is not None and found.check else ""
        note = self.check_notes.get(pattern)
        return f"its check{name}" + (f" ({note})" if note else "")


def _registered(name: str) -> List[Any]:
    from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

    module, prefix, builder = REGISTRY.get(name, ("", name, ""))
    if builder:
        return list(getattr(importlib.import_module(module), builder)())
    for known, known_prefix, _ in REGISTRY.values():
        if prefix.startswith(known_prefix):  # "cutlass.decode_matmul": cutlass registers it
            importlib.import_module(known)
    return list(get_patterns_with_prefix(prefix))


def resolve_table(patterns: TableLike) -> RelaxTable:
    """The table ``patterns`` names or lists, read (see the module docstring)."""
    name = patterns if isinstance(patterns, str) else ""
    if isinstance(patterns, str):
        patterns = _registered(patterns)
        if not patterns:
            raise PreconditionError(
                f"no Relax pattern table {name!r}: no registered pattern name starts with it; "
                f"hint: one of {', '.join(sorted(REGISTRY))}, a prefix of registered pattern "
                "names, or the list of FusionPattern / tuples FuseOpsByPattern takes"
            )
    if not isinstance(patterns, (list, tuple)) or not patterns:
        raise PreconditionError(
            f"a pattern table is a non-empty list of FusionPattern or (name, pattern[, "
            f"annotations[, check]]) tuples, or a registry name; got {type(patterns).__name__}"
        )
    entries: List[FusionPattern] = []
    checks: Dict[str, str] = {}
    for index, entry in enumerate(patterns):
        if isinstance(entry, FusionPattern):
            entries.append(entry)
            checks[str(entry.name)] = ""
        elif isinstance(entry, tuple) and len(entry) >= 2 and isinstance(entry[1], P.DFPattern):
            entries.append(FusionPattern(*entry))
            check = entry[3] if len(entry) > 3 else None
            checks[str(entry[0])] = getattr(check, "__name__", "") if check else ""
        else:
            raise PreconditionError(
                f"pattern table entry {index} is {type(entry).__name__} {entry!r:.80}, not a "
                "FusionPattern or a (name, DFPattern[, annotations[, check]]) tuple"
            )
    name = name or default_table_name([str(entry.name) for entry in entries])
    spec = TableSpec(
        name,
        tuple(
            PatternSpec(str(e.name), read_pattern(e.pattern), checks[str(e.name)]) for e in entries
        ),
    )
    return RelaxTable(name, tuple(entries), spec)


def read_pattern(pattern: P.DFPattern) -> PatternNode:
    """``pattern`` as the core's description; what it does not translate is :class:`Unread`."""
    if isinstance(pattern, P.WildcardPattern):
        return AnyValue()
    if isinstance(pattern, P.ConstantPattern):
        return ConstantValue()
    if isinstance(pattern, P.CallPattern):
        op = pattern.op
        if isinstance(op, P.ExprPattern) and isinstance(op.expr, tvm.ir.Op):
            ops: Tuple[str, ...] = (str(op.expr.name),)
        elif isinstance(op, P.WildcardPattern):
            ops = ()
        else:
            return Unread(type(op).__name__)
        args = pattern.args
        read = None if args is None else tuple(read_pattern(arg) for arg in args)
        # TVM 0.27 does not reflect varg_default_wildcard; its printer ends such a call "...)"
        variadic = repr(pattern).endswith("...)")
        return OpCall(ops, read, variadic)
    if isinstance(pattern, P.OrPattern):
        return OneOf((read_pattern(pattern.left), read_pattern(pattern.right)))
    if isinstance(pattern, P.AndPattern):
        return AllOf((read_pattern(pattern.left), read_pattern(pattern.right)))
    if isinstance(pattern, P.DataTypePattern):
        return Constrained(read_pattern(pattern.pattern), dtype=str(pattern.dtype))
    if isinstance(pattern, P.ShapePattern):
        shape = tuple(
            int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else None for d in pattern.shape
        )
        return Constrained(read_pattern(pattern.pattern), shape=shape)
    if isinstance(pattern, P.AttrPattern):
        attrs = tuple(sorted(read_attrs_dict(pattern.attrs).items()))
        return Constrained(read_pattern(pattern.pattern), attrs=attrs)
    if isinstance(pattern, P.TuplePattern):
        return TupleOf(tuple(read_pattern(f) for f in pattern.fields))
    if isinstance(pattern, P.TupleGetItemPattern):
        index = int(pattern.index)
        return ItemOf(read_pattern(pattern.tuple), None if index < 0 else index)
    if isinstance(pattern, P.GlobalVarPattern):
        text = repr(pattern)
        name = text[len("GlobalVarPattern(") : -1] if text.startswith("GlobalVarPattern(") else ""
        return StaticValue(name or None)
    if isinstance(pattern, P.ExprPattern):
        if _compat.is_constant(pattern.expr):
            return ConstantValue()
        return Unread(f"the expression {type(pattern.expr).__name__}")
    return Unread(type(pattern).__name__)


def read_attrs_dict(attrs: Any) -> Dict[str, object]:
    """An ``AttrPattern``'s attributes as plain values (a ``DictAttrs`` or an attrs node)."""
    if hasattr(attrs, "items"):
        return {str(k): _plain(v) for k, v in attrs.items()}
    return _compat.read_attrs(attrs)


def _plain(value: object) -> object:
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return value.value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_plain(v) for v in value)  # type: ignore[attr-defined]
    return value if isinstance(value, (int, float, bool)) else str(value)


# ------------------------------------------------------------------------------ running a table


def _span(node: int) -> Any:
    return _compat.make_position(TAG_SOURCE, node + 1)


@mutator
class _Tagger(PyExprMutator):
    """Re-emits each binding of a tagged variable with a span naming its graph node."""

    def __init__(self, mod: tvm.IRModule, tags: Mapping[int, int]) -> None:
        super().__init__(mod)
        self.tags = tags

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        node = self.tags.get(_compat.handle(binding.var))
        if node is None or not isinstance(binding.value, relax.Call):
            super().visit_var_binding_(binding)
            return
        value = self.visit_expr(binding.value)
        tagged = _compat.make_call(
            value.op, value.args, value.attrs, value.ty_args, position=_span(node)
        )
        self.builder_.emit_normalized(
            relax.VarBinding(binding.var, self.builder_.normalize(tagged))
        )


def tag_calls(mod: tvm.IRModule, variables: Mapping[int, int]) -> tvm.IRModule:
    """``mod`` with the call bound to each variable (by handle) tagged with its node id."""
    tagger = _Tagger(mod, variables)
    functions = {
        gvar: tagger.visit_expr(func) if isinstance(func, relax.Function) else func
        for gvar, func in mod.functions.items()
    }
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _tag_of(expr: relax.Expr) -> Optional[int]:
    line = _compat.position_line(expr, TAG_SOURCE)
    return None if line is None else line - 1


def _functions(mod: tvm.IRModule) -> List[relax.Function]:
    found: List[relax.Function] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Function):
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def tagged_composites(mod: tvm.IRModule) -> Dict[int, str]:
    """Tagged call -> the name of the composite function it is in (``Composite`` attribute)."""
    found: Dict[int, str] = {}
    for func in _functions(mod):
        if func.attrs is None or "Composite" not in func.attrs:
            continue
        name = str(func.attrs["Composite"])

        def visit(expr: relax.Expr, name: str = name) -> None:
            if isinstance(expr, relax.Call) and (tag := _tag_of(expr)) is not None:
                found[tag] = name

        relax.analysis.post_order_visit(func.body, visit)
    return found


def _guarded(table: RelaxTable, entry: FusionPattern) -> Callable[[Any], bool]:
    name, check = str(entry.name), entry.check

    def run(context: Any) -> bool:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                return bool(check(context))
        except Exception as err:  # noqa: BLE001 - a backend's check is its own code
            table.check_notes.setdefault(name, f"it raised {type(err).__name__}: {err}")
            return False
        finally:
            if printed.getvalue().strip():
                table.check_notes.setdefault(name, f"it printed {printed.getvalue().strip()!r}")

    return run


#: Attributes of the functions a partition made.
_PARTITIONED = ("Composite", "Codegen", "Primitive")
#: The annotation naming a match's root, and the composite attribute carrying its tag.
_ROOT_KEY = "fold_guard_offload_root"
_TAG_ATTR = "fold_guard.offload_root"


def _unique_attrs(entry: FusionPattern, count: List[int]) -> Callable[[Any], Dict[str, str]]:
    """The entry's ``attrs_getter``, plus an attribute naming the match's root.

    ``FuseOpsByPattern`` adds composites through the block builder, which merges structurally
    equal functions (spans do not count), so two equal layers would share one composite and its
    tags; a distinct attribute per match keeps them apart.
    """
    original = entry.attrs_getter

    def attrs(annotated: Any) -> Dict[str, str]:
        found = dict(original(annotated)) if original is not None else {}
        root = annotated[_ROOT_KEY] if _ROOT_KEY in annotated else None
        tag = _tag_of(root) if isinstance(root, relax.Expr) else None
        count[0] += 1
        found[_TAG_ATTR] = f"{tag}.{count[0]}"
        return found

    return attrs


def composites_of(mod: tvm.IRModule, table: RelaxTable, *, checks: bool = True) -> Dict[int, str]:
    """Run ``table`` on ``mod`` (tagged) as ``FuseOpsByPattern`` does; tagged call -> composite.

    ``checks=False`` runs every pattern without its check: what the structure alone takes.
    """
    count = [0]
    entries = [
        FusionPattern(
            str(entry.name),
            entry.pattern,
            {**dict(entry.annotation_patterns or {}), _ROOT_KEY: entry.pattern},
            _guarded(table, entry) if checks and entry.check is not None else None,
            _unique_attrs(entry, count),
        )
        for entry in table.patterns
    ]
    # Only the functions a partition has not made (a partitioned module's composites and codegen
    # functions are not partitioned again).
    entry = [
        gvar.name_hint
        for gvar, func in mod.functions.items()
        if isinstance(func, relax.Function)
        and not (func.attrs is not None and any(k in func.attrs for k in _PARTITIONED))
    ]
    fused = relax.transform.FuseOpsByPattern(
        entries, bind_constants=True, annotate_codegen=False, entry_functions=entry
    )
    return tagged_composites(fused(mod))
