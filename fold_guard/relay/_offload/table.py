"""A Relay backend's pattern table: found by name, read into the core's description, run on a module.

A table is what ``MergeComposite`` takes (tuples ``(name, pattern[, check])``, highest priority
first) or a name ``tvm.relay.op.contrib.get_pattern_table`` knows (:data:`REGISTRY` lists the
modules that register TVM's; any other registered name works once its module is imported).
:func:`read_pattern` walks a ``tvm.relay.dataflow_pattern`` tree into
:mod:`fold_guard._core.pattern_spec`; :func:`composites_of` runs the table with
``MergeComposite`` on a module whose calls carry tags (:func:`tag_calls`) and says which tagged
call ended in which composite. A check that raises or prints counts as refusing; what it said
is kept for the report (Ethos-N's checks print when the driver stack is missing).
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as P

from ..._core.errors import PreconditionError
from ..._core.pattern_spec import (
    AnyValue,
    ConstantValue,
    Constrained,
    ItemOf,
    OneOf,
    OpCall,
    PatternNode,
    PatternSpec,
    TableSpec,
    TupleOf,
    Unread,
    default_table_name,
)
from .._module import module_like

__all__ = [
    "REGISTRY",
    "RelayTable",
    "composites_of",
    "existing_offloads",
    "read_pattern",
    "resolve_table",
    "tag_calls",
]

#: Table names of TVM's Relay backends and the module that registers each.
REGISTRY: Dict[str, str] = {
    "cmsis-nn": "tvm.relay.op.contrib.cmsisnn",
    "arm_compute_lib": "tvm.relay.op.contrib.arm_compute_lib",
    "ethos-n": "tvm.relay.op.contrib.ethosn",
    "dnnl": "tvm.relay.op.contrib.dnnl",
}
#: The source name of the spans :func:`tag_calls` writes; the line is the node id plus one.
TAG_SOURCE = "fold_guard.offload"

TableLike = Union[str, Sequence[Tuple[Any, ...]]]


@dataclass
class RelayTable:
    """A table as ``MergeComposite`` runs it, its description, and what its checks said."""

    name: str
    entries: Tuple[Tuple[str, P.DFPattern, Optional[Callable[[relay.Expr], bool]]], ...]
    spec: TableSpec
    #: pattern name -> what its check raised or printed while the table ran (first time)
    check_notes: Dict[str, str] = field(default_factory=dict)

    def check_text(self, pattern: str) -> str:
        """``its check check_qnn_conv2d (it printed ...)``."""
        found = self.spec.pattern(pattern)
        name = f" {found.check}" if found is not None and found.check else ""
        note = self.check_notes.get(pattern)
        return f"its check{name}" + (f" ({note})" if note else "")


def _registered(name: str) -> Optional[List[Tuple[Any, ...]]]:
    importlib.import_module(REGISTRY.get(name, "tvm.relay.op.contrib"))
    from tvm.relay.op.contrib import get_pattern_table

    table = get_pattern_table(name)
    return None if table is None else list(table)


def resolve_table(patterns: TableLike) -> RelayTable:
    """The table ``patterns`` names or lists, read (see the module docstring)."""
    name = patterns if isinstance(patterns, str) else ""
    if isinstance(patterns, str):
        found = _registered(patterns)
        if not found:
            raise PreconditionError(
                f"no Relay pattern table {name!r}: get_pattern_table does not know it; hint: one "
                f"of {', '.join(sorted(REGISTRY))}, or the list MergeComposite takes"
            )
        patterns = found
    if not isinstance(patterns, (list, tuple)) or not patterns:
        raise PreconditionError(
            "a pattern table is a non-empty list of (name, pattern[, check]) tuples, or a name "
            f"get_pattern_table knows; got {type(patterns).__name__}"
        )
    entries = []
    for index, entry in enumerate(patterns):
        if not (
            isinstance(entry, tuple) and len(entry) in (2, 3) and isinstance(entry[1], P.DFPattern)
        ):
            raise PreconditionError(
                f"pattern table entry {index} is {type(entry).__name__} {entry!r:.80}, not a "
                "(name, DFPattern[, check]) tuple"
            )
        entries.append((str(entry[0]), entry[1], entry[2] if len(entry) == 3 else None))
    name = name or default_table_name([entry[0] for entry in entries])
    spec = TableSpec(
        name,
        tuple(
            PatternSpec(n, read_pattern(p), getattr(check, "__name__", "") if check else "")
            for n, p, check in entries
        ),
    )
    return RelayTable(name, tuple(entries), spec)


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
        args = None if pattern.args is None else tuple(read_pattern(a) for a in pattern.args)
        return OpCall(ops, args)
    if isinstance(pattern, P.AltPattern):
        return OneOf((read_pattern(pattern.left), read_pattern(pattern.right)))
    if isinstance(pattern, P.DataTypePattern):
        return Constrained(read_pattern(pattern.pattern), dtype=str(pattern.dtype))
    if isinstance(pattern, P.ShapePattern):
        shape = tuple(
            int(d) if isinstance(d, (int, tvm.tir.IntImm)) else None for d in pattern.shape
        )
        return Constrained(read_pattern(pattern.pattern), shape=shape)
    if isinstance(pattern, P.AttrPattern):
        attrs = pattern.attrs
        read = {str(k): _plain(attrs[k]) for k in attrs.keys()} if attrs is not None else {}
        return Constrained(read_pattern(pattern.pattern), attrs=tuple(sorted(read.items())))
    if isinstance(pattern, P.TuplePattern):
        fields = pattern.fields
        return TupleOf(None if fields is None else tuple(read_pattern(f) for f in fields))
    if isinstance(pattern, P.TupleGetItemPattern):
        index = int(pattern.index)
        return ItemOf(read_pattern(pattern.tuple), None if index < 0 else index)
    if isinstance(pattern, P.ExprPattern):
        if isinstance(pattern.expr, relay.Constant):
            return ConstantValue()
        return Unread(f"the expression {type(pattern.expr).__name__}")
    return Unread(type(pattern).__name__)


def _plain(value: object) -> object:
    if isinstance(value, (tvm.tir.IntImm, tvm.tir.FloatImm)):
        return value.value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_plain(v) for v in value)  # type: ignore[attr-defined]
    return value if isinstance(value, (int, float, bool)) else str(value)


# ------------------------------------------------------------------------------ running a table


class _Tagger(relay.ExprMutator):
    def __init__(self, tags: Mapping[relay.Call, int]) -> None:
        super().__init__()
        self.tags = tags

    def visit_call(self, call: relay.Call) -> relay.Expr:
        new = super().visit_call(call)
        node = self.tags.get(call)
        if node is None:
            return new
        span = tvm.ir.Span(tvm.ir.SourceName(TAG_SOURCE), node + 1, node + 1, 0, 0)
        return relay.Call(new.op, new.args, new.attrs, new.type_args, span)


def tag_calls(mod: tvm.IRModule, calls: Mapping[relay.Call, int]) -> tvm.IRModule:
    """``mod`` (typed) with each of ``calls`` tagged with its node id, typed again."""
    tagger = _Tagger(calls)
    functions = {
        gvar: tagger.visit(func) if isinstance(func, relay.Function) else func
        for gvar, func in mod.functions.items()
    }
    return relay.transform.InferType()(module_like(mod, functions))


def _tag_of(expr: relay.Expr) -> Optional[int]:
    span = expr.span
    if span is None or str(span.source_name.name) != TAG_SOURCE:
        return None
    return int(span.line) - 1


def tagged_composites(mod: tvm.IRModule) -> Dict[int, str]:
    """Tagged call -> the name of the composite function it is in (``Composite`` attribute)."""
    found: Dict[int, str] = {}
    composites: List[relay.Function] = []

    def collect(expr: relay.Expr) -> None:
        if isinstance(expr, relay.Function) and expr.attrs and "Composite" in expr.attrs.keys():
            composites.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, collect)
    for composite in composites:
        name = str(composite.attrs["Composite"])

        def visit(expr: relay.Expr, name: str = name) -> None:
            if isinstance(expr, relay.Call) and (tag := _tag_of(expr)) is not None:
                found[tag] = name

        relay.analysis.post_order_visit(composite.body, visit)
    return found


def existing_offloads(
    mod: tvm.IRModule, ops: FrozenSet[str]
) -> Tuple[List[Tuple[str, str, str, str]], FrozenSet[str]]:
    """What ``PartitionGraph`` already handed to external compilers: ``(function, label, op,
    composite)`` for each call of ``ops`` in a composite of a function with a ``Compiler``
    attribute that reads one of the composite's parameters, and those functions' names (the
    walk does not read them). Composites ``MergeComposite`` left in ``main`` need nothing here:
    their calls are the walk's, and a run of the table finds them in their composites."""
    skip = frozenset(
        gvar.name_hint
        for gvar, func in mod.functions.items()
        if isinstance(func, relay.Function) and func.attrs and "Compiler" in func.attrs.keys()
    )
    rows: List[Tuple[str, str, str, str]] = []
    for gvar, func in mod.functions.items():
        if gvar.name_hint not in skip:
            continue
        for composite in _composites_in(func):
            rows.extend(_reading_calls(gvar.name_hint, composite, ops))
    return rows, skip


def _composites_in(func: relay.Function) -> List[relay.Function]:
    found: List[relay.Function] = []

    def collect(expr: relay.Expr) -> None:
        if isinstance(expr, relay.Function) and expr.attrs and "Composite" in expr.attrs.keys():
            found.append(expr)

    relay.analysis.post_order_visit(func, collect)
    return found


def _reading_calls(
    function: str, composite: relay.Function, ops: FrozenSet[str]
) -> List[Tuple[str, str, str, str]]:
    """The calls of ``ops`` in ``composite`` that read one of its parameters."""
    name = str(composite.attrs["Composite"])
    params = set(composite.params)
    reading: Dict[relay.Expr, bool] = {}
    rows: List[Tuple[str, str, str, str]] = []

    def visit(expr: relay.Expr) -> None:
        if isinstance(expr, relay.Var):
            reading[expr] = expr in params
        elif isinstance(expr, relay.Call):
            reading[expr] = any(reading.get(arg, False) for arg in expr.args)
            op = expr.op.name if isinstance(expr.op, tvm.ir.Op) else ""
            if reading[expr] and op in ops:
                rows.append((function, f"{name}/{op}", op, name))
        elif isinstance(expr, relay.Tuple):
            reading[expr] = any(reading.get(f, False) for f in expr.fields)
        elif isinstance(expr, relay.TupleGetItem):
            reading[expr] = reading.get(expr.tuple_value, False)

    relay.analysis.post_order_visit(composite.body, visit)
    return rows


def _guarded(
    table: RelayTable, name: str, check: Callable[[relay.Expr], bool]
) -> Callable[[relay.Expr], bool]:
    def run(expr: relay.Expr) -> bool:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                return bool(check(expr))
        except Exception as err:  # noqa: BLE001 - a backend's check is its own code
            table.check_notes.setdefault(name, f"it raised {type(err).__name__}: {err}")
            return False
        finally:
            if printed.getvalue().strip():
                table.check_notes.setdefault(name, f"it printed {printed.getvalue().strip()!r}")

    return run


def composites_of(mod: tvm.IRModule, table: RelayTable, *, checks: bool = True) -> Dict[int, str]:
    """Run ``table`` on ``mod`` (tagged, typed) with ``MergeComposite``; tagged call -> composite.

    ``checks=False`` runs every pattern without its check: what the structure alone takes.
    """
    entries = [
        (name, pattern, _guarded(table, name, check))
        if checks and check is not None
        else (name, pattern)
        for name, pattern, check in table.entries
    ]
    return tagged_composites(relay.transform.MergeComposite(entries)(mod))
