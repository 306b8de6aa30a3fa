"""Kernels whose result depends on memory nobody wrote, read from their TIR.

Two ways a kernel's output can hold bytes no computation wrote, both only with a zero-size
operand (``Reason.UNWRITTEN_MEMORY``, RFC.md guarantee 7: such a call is never folded):

* **an empty reduction**: a reduction block initializes its output element on the first
  iteration of its reduction axes (``T.init()``, inside the loops over them); over a zero-size
  axis the loop never runs, and the element is never written (Relax's ``max`` over an empty
  axis returns what the buffer held). TE's own schedule lowering (Relay) writes the init before
  the loop instead, so this is the block form's question only (:func:`reduces_over_empty_axis`);
* **a read of an empty operand**: every element of a zero-size buffer is out of bounds, so a
  block that runs and loads from one unconditionally (``resize2d`` or ``take`` from an empty
  tensor) computes from whatever memory lies there (:func:`reads_empty_buffer`). A load inside
  an ``if_then_else`` branch or an ``IfThenElse``, or under a block predicate, is not counted
  (``concat`` with an empty part never takes that branch), nor is a block that never runs (a
  loop or iterator of extent 0 around it).

The walk reads node fields by name, so it serves TVM 0.16's ``tvm.tir`` (Relay) and 0.27's
``tvm.tirx`` / ``s_tir`` (Relax) alike; it imports neither.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

__all__ = [
    "EMPTY_READ_DETAIL",
    "EMPTY_REDUCTION_DETAIL",
    "reads_empty_buffer",
    "reduces_over_empty_axis",
]

EMPTY_REDUCTION_DETAIL = (
    "its kernel reduces over a zero-size axis and never writes that reduction's output, so the "
    "result would be whatever memory held (stock folds those bytes)"
)
EMPTY_READ_DETAIL = (
    "its kernel reads elements of a zero-size operand, which lie outside it, so the result "
    "would be computed from whatever memory lies there (stock folds it)"
)

#: ``IterVar.CommReduce`` (the same in both releases).
_COMM_REDUCE = 2
#: Expression fields whose sub-expressions are always evaluated.
_EXPR_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "base", "stride")


def reduces_over_empty_axis(prim_func: Any) -> bool:
    """Whether a block of ``prim_func`` has a reduction iterator of static extent 0."""
    return any(
        iter_var.iter_type == _COMM_REDUCE and _is_zero(iter_var.dom.extent)
        for block, _ in _blocks(prim_func.body)
        for iter_var in block.iter_vars
    )


def reads_empty_buffer(prim_func: Any) -> bool:
    """Whether a block of ``prim_func`` that runs loads from a zero-size buffer unconditionally."""
    return any(
        live and any(_is_zero(dim) for load in _loads(block.body) for dim in _loaded(load).shape)
        for block, live in _blocks(prim_func.body)
    )


def _blocks(stmt: Any) -> Iterator[Tuple[Any, bool]]:
    """Every block under ``stmt``, and whether it runs everywhere it could: no loop or iterator
    of extent 0 around it, no predicate or ``IfThenElse`` over it."""
    stack: List[Tuple[Any, bool]] = [(stmt, True)]
    while stack:
        node, live = stack.pop()
        kind = type(node).__name__
        if node is None:
            continue
        if kind == "For":
            stack.append((node.body, live and not _is_zero(node.extent)))
        elif kind in ("BlockRealize", "SBlockRealize"):
            stack.append((node.block, live and _is_true(node.predicate)))
        elif kind in ("Block", "SBlock"):
            live = live and not any(_is_zero(iv.dom.extent) for iv in node.iter_vars)
            yield node, live
            stack.append((node.body, live))
            stack.append((node.init, live))
        elif kind == "SeqStmt":
            stack.extend((child, live) for child in node.seq)
        elif kind == "IfThenElse":
            stack.append((node.then_case, False))
            stack.append((node.else_case, False))
        elif hasattr(node, "body"):  # LetStmt, AttrStmt, Allocate, DeclBuffer, ...
            stack.append((node.body, live))


def _loads(stmt: Any) -> Iterator[Any]:
    """The buffer loads ``stmt`` evaluates whenever it runs (not those in a branch)."""
    stack: List[Any] = [stmt]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if node is None or isinstance(node, (int, float, str)):
            continue
        if kind in ("BufferLoad", "TensorLoad"):  # 0.16, 0.27
            yield node
            stack.extend(node.indices)
        elif kind == "BufferStore":
            stack.append(node.value)
            stack.extend(node.indices)
        elif kind == "SeqStmt":
            stack.extend(node.seq)
        elif kind == "IfThenElse":  # only its condition always runs
            stack.append(node.condition)
        elif kind == "Call":  # if_then_else evaluates one branch: only its condition counts
            args = list(node.args)
            stack.extend(
                args[:1] if str(getattr(node.op, "name", "")).endswith(".if_then_else") else args
            )
        else:  # Select evaluates both values; arithmetic, casts, Let, Ramp, Broadcast ...
            stack.extend(getattr(node, field, None) for field in _EXPR_FIELDS)
            if kind != "For":
                stack.append(getattr(node, "body", None))


def _loaded(load: Any) -> Any:
    """The buffer a load reads (0.16 ``BufferLoad.buffer``; 0.27 ``TensorLoad.source``)."""
    buffer = getattr(load, "buffer", None)
    return buffer if buffer is not None else load.source


def _is_zero(expr: Any) -> bool:
    return type(expr).__name__ == "IntImm" and int(expr.value) == 0


def _is_true(expr: Any) -> bool:
    return expr is None or (type(expr).__name__ == "IntImm" and int(expr.value) == 1)
