"""Kernels that only move data, read from their TIR: built at ``-O0``, and the fills among them.

A kernel *moves data* when every value it stores is a load, an immediate, an exact cast of one
or a select among them, and every index, loop bound and condition is integer arithmetic: no
float arithmetic, no comparison of floats, no reduction, no call but ``if_then_else``. TOPI's
``broadcast_to``, ``reshape``, ``transpose``, ``concatenate``, ``split``, ``strided_slice``,
``take``, ``tile``, ``repeat``, ``flip``, ``pad``, ``full`` / ``zeros`` / ``ones``, ``tril`` /
``triu``, ``where`` and the integer casts all have this form, whatever the dtype they move.

Such a kernel computes nothing an optimization level could change: a load, a store and an
integer ``select`` are defined for every value by LLVM's IR, NaN payloads included (no float
operation touches the value), and the casts allowed are the ones every value survives exactly
(integer to integer, which truncates or extends bit for bit; integer to a float that holds
every value of it; float to a wider float). Index arithmetic is integer arithmetic on in-bounds
indices; where an index is out of bounds (``take`` in ``fast`` mode with a bad index) the load
is undefined at every level, stock's included. So such a kernel is built at ``-O0``
(:func:`moves_data`), whatever its size: LLVM's ``-O3`` spent 3.5 s on one ``broadcast_to`` of
``(32, 528, 1, 1)`` here, ``-O0`` 0.01 s, and a copy runs at memory speed either way
(``bench/README.md``).

A *fill* is a data-movement kernel that writes every element of each output exactly once, each
from a plain load at an index that reads no tensor, or from an immediate (:attr:`Movement.fills`).
If every tensor it loads holds one bit pattern in every element (a one-element constant, or
another fill) and its immediates have that bit pattern too, every element it writes has it:
the call's result is known without running the kernel (``fills``).

The walk reads node fields by name (``fold_guard._tvm.unwritten`` does the same), so it needs no TIR visitor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, FrozenSet, List, Optional, Set, Tuple

__all__ = ["Movement", "moves_data", "read_movement"]


@dataclass(frozen=True, eq=False)
class Movement:
    """What a data-movement kernel does (see the module docstring).

    ``sources``: positions of the parameters whose loads are stored (not those read only as
    indices); ``immediates``: the ``(dtype, value)`` of every immediate stored. :attr:`fills`
    is read only when asked (the coverage walk is the costly part, and only a call whose
    sources all hold one bit pattern needs it).
    """

    sources: FrozenSet[int]
    immediates: Tuple[Tuple[str, object], ...]
    _reader: Any = field(repr=False)
    _body: Any = field(repr=False)

    @functools.cached_property
    def fills(self) -> bool:
        """Every output element is written exactly once, each from a plain load at an index
        that reads no tensor, or from an immediate, with no cast."""
        return bool(self._reader.plain and self._reader.covers_outputs(self._body))


_INTEGER_PREFIXES = ("int", "uint", "bool")
_FLOAT_PREFIXES = ("float", "bfloat")
_ARITHMETIC = frozenset(
    "Add Sub Mul Div Mod FloorDiv FloorMod Min Max EQ NE LT LE GT GE And Or".split()
)
_IF_THEN_ELSE = "if_then_else"
_LIKELY = "likely"


def _dtype(expr: Any) -> str:
    """The scalar type of a TIR expression (its ``PrimType``; "" for anything else)."""
    ty: Any = getattr(expr, "ty", None)
    return str(ty.dtype) if type(ty).__name__ == "PrimType" else ""


def _bits(dtype: str) -> int:
    digits = "".join(ch for ch in dtype.split("x")[0] if ch.isdigit())
    return int(digits) if digits else (1 if dtype.startswith("bool") else 0)


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(_INTEGER_PREFIXES)


def _exact_cast(source: str, target: str) -> bool:
    """Whether every value of ``source`` becomes ``target`` exactly (integers: bit for bit)."""
    if source == target or (_is_integer(source) and _is_integer(target)):
        return True
    if target.startswith("float") and source.startswith(_FLOAT_PREFIXES):
        return _bits(target) > _bits(source)  # fpext: exact, NaN payloads kept
    if target.startswith("float") and _is_integer(source):
        mantissa = {"float16": 11, "float32": 24, "float64": 53}.get(target, 0)
        return _bits(source) <= mantissa  # every integer of that width is a float of this one
    return False


def _op_name(call: Any) -> str:
    return str(getattr(getattr(call, "op", None), "name", "")).rsplit(".", 1)[-1]


def _integer_only(expr: Any) -> bool:
    """Whether ``expr`` is integer arithmetic throughout (no float value anywhere in it)."""
    stack: List[Any] = [expr]
    while stack:
        node = stack.pop()
        if node is None or isinstance(node, (int, bool)):
            continue
        kind = type(node).__name__
        if kind != "Call" and not _is_integer(_dtype(node)):
            return False
        if kind in ("IntImm", "Var", "SizeVar"):
            continue
        if kind in ("BufferLoad", "TensorLoad"):
            stack.extend(node.indices)
        elif kind in _ARITHMETIC:
            stack.extend((node.a, node.b))
        elif kind == "Not":
            stack.append(node.a)
        elif kind == "Cast":
            stack.append(node.value)  # its source must be an integer too
        elif kind == "Select":
            stack.extend((node.condition, node.true_value, node.false_value))
        elif kind == "Call" and _op_name(node) in (_IF_THEN_ELSE, _LIKELY):
            if not _is_integer(_dtype(node)):
                return False
            stack.extend(node.args)
        else:
            return False
    return True


def _loaded(load: Any) -> Any:
    buffer = getattr(load, "buffer", None)
    return buffer if buffer is not None else load.source


class _Reader:
    """One walk over a PrimFunc's body, collecting what a data-movement kernel stores."""

    def __init__(self, params: List[Any]) -> None:
        self.params = params
        self.sources: Set[int] = set()
        self.immediates: List[Tuple[str, object]] = []
        self.plain = True  # no cast, no load at an index that reads a tensor
        #: per output position, the stores that write it: (block iter vars, store)
        self.stores: List[Tuple[Tuple[Any, ...], Any]] = []
        self.blocks_ok = True

    def param_of(self, buffer: Any) -> Optional[int]:
        for index, param in enumerate(self.params):
            if param.same_as(buffer):
                return index
        return None

    def value(self, expr: Any) -> bool:
        """Whether a stored ``expr`` moves data (loads, immediates, exact casts, selects)."""
        kind = type(expr).__name__
        if kind in ("BufferLoad", "TensorLoad"):
            if not all(_integer_only(index) for index in expr.indices):
                return False
            if any(_reads_tensor(index) for index in expr.indices):
                self.plain = False
            position = self.param_of(_loaded(expr))
            if position is None:
                self.plain = False  # an intermediate buffer of the kernel's own
            else:
                self.sources.add(position)
            return True
        if kind in ("IntImm", "FloatImm"):
            self.immediates.append((_dtype(expr), expr.value))
            return True
        if kind == "Cast":
            self.plain = False
            return _exact_cast(_dtype(expr.value), _dtype(expr)) and self.value(expr.value)
        if kind == "Select":
            return (
                _integer_only(expr.condition)
                and self.value(expr.true_value)
                and self.value(expr.false_value)
            )
        if kind == "Call" and _op_name(expr) == _IF_THEN_ELSE:
            condition, then, otherwise = expr.args
            return _integer_only(condition) and self.value(then) and self.value(otherwise)
        if kind == "Broadcast":
            return self.value(expr.value)
        return False

    def stmt(self, node: Any, iter_vars: Tuple[Any, ...]) -> bool:
        """Whether every statement under ``node`` moves data (``iter_vars``: the block's)."""
        if node is None:
            return True
        kind = type(node).__name__
        if kind == "SeqStmt":
            return all(self.stmt(child, iter_vars) for child in node.seq)
        if kind == "For":
            return (
                _integer_only(node.min)
                and _integer_only(node.extent)
                and self.stmt(node.body, iter_vars)
            )
        if kind in ("SBlockRealize", "BlockRealize"):
            if not (_integer_only(node.predicate) and all(map(_integer_only, node.iter_values))):
                return False
            if not _is_true(node.predicate):
                self.blocks_ok = False
            return self.stmt(node.block, iter_vars)
        if kind in ("SBlock", "Block"):
            if node.init is not None or len(getattr(node, "match_buffers", ())):
                return False  # a reduction computes; a matched region is a view we do not read
            if len(getattr(node, "alloc_buffers", ())):
                self.plain = False
            variables = tuple(iv.var for iv in node.iter_vars)
            return self.stmt(node.body, variables)
        if kind == "IfThenElse":
            self.blocks_ok = False  # a store under a branch may not write every element
            return (
                _integer_only(node.condition)
                and self.stmt(node.then_case, iter_vars)
                and self.stmt(node.else_case, iter_vars)
            )
        if kind in ("LetStmt", "Bind"):
            return _integer_only(node.value) and self.stmt(getattr(node, "body", None), iter_vars)
        if kind == "BufferStore":
            if not (all(map(_integer_only, node.indices)) and self.value(node.value)):
                return False
            self.stores.append((iter_vars, node))
            return True
        if kind in ("AttrStmt", "AllocBuffer", "DeclBuffer", "Allocate"):
            return self.stmt(getattr(node, "body", None), iter_vars)
        if kind == "Evaluate":
            return type(node.value).__name__ == "IntImm"  # a no-op
        return False

    def covers_outputs(self, body: Any) -> bool:
        """Whether each parameter stored to is written by one block, once per element.

        The block's store indices are its iterator variables in order, and its iterators run
        over the buffer's whole shape from 0 (TOPI's ``T.axis.remap`` over ``T.grid``).
        """
        if not self.blocks_ok:
            return False
        written: Set[int] = set()
        for iter_vars, store in self.stores:
            position = self.param_of(store.buffer)
            if position is None or position in written or position in self.sources:
                return False
            written.add(position)
            indices = list(store.indices)
            if len(indices) != len(iter_vars) or not all(
                index.same_as(var) for index, var in zip(indices, iter_vars)
            ):
                return False
        return bool(written) and _full_domains(body, self)


def _full_domains(body: Any, reader: _Reader) -> bool:
    """Whether every block's iterators span its output's shape and its loops bind them all."""
    stack: List[Tuple[Any, List[Any]]] = [(body, [])]
    while stack:
        node, loops = stack.pop()
        kind = type(node).__name__ if node is not None else ""
        if kind == "SeqStmt":
            stack.extend((child, loops) for child in node.seq)
        elif kind == "For":
            if not (_is_int(node.min, 0)):
                return False
            stack.append((node.body, [*loops, node]))
        elif kind in ("SBlockRealize", "BlockRealize"):
            block = node.block
            if not block.iter_vars:
                stack.append((block.body, loops))  # the root block
                continue
            store = block.body
            if type(store).__name__ != "BufferStore":
                return False
            shape = list(getattr(store.buffer, "shape", None) or _buffer_shape(store.buffer))
            values = list(node.iter_values)
            if len(values) != len(shape) or len(loops) != len(values):
                return False
            for iter_var, value, loop, dim in zip(block.iter_vars, values, loops, shape):
                if not (
                    _is_int(iter_var.dom.min, 0)
                    and _same_value(iter_var.dom.extent, dim)
                    and value.same_as(loop.loop_var)
                    and _same_value(loop.extent, dim)
                ):
                    return False
        elif node is not None and hasattr(node, "body"):
            stack.append((node.body, loops))
    return True


def _buffer_shape(buffer: Any) -> Tuple[Any, ...]:
    return tuple(getattr(getattr(buffer, "ty", None), "shape", ()) or ())


def _same_value(a: Any, b: Any) -> bool:
    if type(a).__name__ == "IntImm" and type(b).__name__ == "IntImm":
        return int(a.value) == int(b.value)
    return bool(a.same_as(b))


def _is_int(expr: Any, value: int) -> bool:
    return type(expr).__name__ == "IntImm" and int(expr.value) == value


def _is_true(expr: Any) -> bool:
    return expr is None or _is_int(expr, 1)


def _reads_tensor(expr: Any) -> bool:
    stack: List[Any] = [expr]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if kind in ("BufferLoad", "TensorLoad"):
            return True
        for name in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(node, name, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(node, "args", ()) if kind == "Call" else ())
    return False


def _first_store(stmt: Any) -> Any:
    """The first ``BufferStore`` down the first branch of ``stmt``, or None."""
    node = stmt
    for _ in range(64):
        kind = type(node).__name__
        if kind == "BufferStore":
            return node
        if kind == "SeqStmt":
            node = node.seq[0] if len(node.seq) else None
        elif kind in ("SBlockRealize", "BlockRealize"):
            node = node.block
        else:
            node = getattr(node, "body", None)
        if node is None:
            return None
    return None


def read_movement(prim_func: Any) -> Optional[Movement]:
    """What ``prim_func`` does if it only moves data, else None (see the module docstring)."""
    reader = _Reader(list(prim_func.params))
    first = _first_store(prim_func.body)
    if first is not None and not _Reader(reader.params).value(first.value):
        return None  # most kernels that compute say so in their first store: no full walk
    if not reader.stmt(prim_func.body, ()):
        return None
    return Movement(frozenset(reader.sources), tuple(reader.immediates), reader, prim_func.body)


def moves_data(prim_func: Any) -> bool:
    """Whether ``prim_func`` only moves data, so that ``-O0`` builds it to the same bits."""
    return read_movement(prim_func) is not None
