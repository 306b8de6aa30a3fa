"""What the Relay adapter copies from stock ``relay.transform.FoldConstant``: the TVM-upgrade surface.

Under the ``default`` and ``fold-qnn`` policies fold_guard's output must be structurally equal to
``FoldConstant()`` / ``FoldConstant(fold_qnn=True)`` (``src/relay/transforms/fold_constant.cc``),
so the rules of the stock pass that decide whether a call folds are stated here and nowhere else.
On a TVM upgrade, re-check this module, and :mod:`fold_guard.relay._rewrite` (which rebuilds a
function exactly as stock's mutator does: let-bound constants inlined, ``(a, b).0`` -> ``a``, an
``If`` on a constant condition -> its branch, one ``on_device`` looked through and kept), against
the new ``fold_constant.cc``:

* **no arguments**: a call without arguments is kept (``ones(shape)`` would only grow the module);
* **stateful / device_copy / non-computational**: never evaluated; QNN ops (non-computational with
  a QNN canonicalization) are kept unless ``fold_qnn=True``;
* **shape from the type**: ``shape_of`` / ``vm.shape_of`` / ``ndarray_size`` fold whenever their
  operand's *type* has a static shape, whatever the operand's value (:func:`static_shape_value`);
* **functions**: nothing inside a ``Primitive`` function folds, and global functions with a
  ``Compiler``, ``Extern`` or ``SkipOptimization`` attribute are not visited (:func:`is_optimizable`);
* **If**: the truth of a constant condition is the first byte of its data (:func:`is_true`);
* **evaluation**: on the CPU, through Relay's interpreter, for the host (:func:`evaluation_target`).
"""

from __future__ import annotations

import platform
from functools import cache
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import tvm
from tvm import relay

from .._core.reasons import Reason

__all__ = [
    "DEVICE_COPY_OP",
    "NDARRAY_SIZE_OP",
    "NO_ARGS_RULE",
    "ON_DEVICE_OP",
    "QNN_DEFAULT_RULE",
    "SHAPE_OPS",
    "StockDecision",
    "evaluation_target",
    "is_optimizable",
    "is_primitive",
    "is_true",
    "static_shape_value",
    "stock_rules",
]

#: The ops stock treats apart from other calls (the adapter's table of IR op names).
SHAPE_OPS = ("shape_of", "vm.shape_of")
NDARRAY_SIZE_OP = "ndarray_size"
DEVICE_COPY_OP = "device_copy"
ON_DEVICE_OP = "on_device"
#: Function attributes under which stock function passes leave a global function alone.
EXTERNAL_ATTRS = ("Compiler", "Extern", "SkipOptimization")

QNN_DEFAULT_RULE = "relay: QNN ops are kept unless FoldConstant(fold_qnn=True)"
NO_ARGS_RULE = "relay: calls without arguments are kept (folding ones(shape) only grows the module)"

#: Looks an op attribute up (``TOpIsStateful``, ``TNonComputational``, ``FTVMQnnCanonicalize``);
#: None when the op does not have it.
OpAttr = Callable[[tvm.ir.Op, str], object]


class StockDecision(NamedTuple):
    """What stock's per-call rules say of one call (:func:`stock_rules`).

    ``unfoldable`` and ``detail``: why fold_guard can never evaluate it (None: it can).
    ``default_fold``: whether stock folds it once its inputs are constant, else ``default_rule``
    names the rule that keeps it.
    """

    unfoldable: Optional[Reason] = None
    detail: str = ""
    default_fold: bool = True
    default_rule: str = ""


def stock_rules(op: tvm.ir.Op, call: relay.Call, op_attr: OpAttr) -> StockDecision:
    """What the stock pass decides for a call of ``op``, and why, in its ``Rewrite_`` order.

    For a call that is not an annotation and whose value does not come from a static type.
    """
    if not call.args:
        return StockDecision(None, "", False, NO_ARGS_RULE)
    if op_attr(op, "TOpIsStateful"):
        return StockDecision(Reason.IMPURE, f"{op.name} is stateful")
    if op.name in SHAPE_OPS + (NDARRAY_SIZE_OP,):
        return StockDecision(
            Reason.DYNAMIC_SHAPE, f"{op.name} of an operand whose shape is not static"
        )
    if op.name == DEVICE_COPY_OP:
        return StockDecision(
            Reason.UNSUPPORTED, "device_copy moves data between devices; stock never folds it"
        )
    if op_attr(op, "TNonComputational"):
        if op_attr(op, "FTVMQnnCanonicalize") is not None:
            return StockDecision(None, "", False, QNN_DEFAULT_RULE)
        return StockDecision(
            Reason.UNSUPPORTED, f"{op.name} is non-computational: there is nothing to evaluate"
        )
    return StockDecision()


def static_shape_value(
    op_name: str, operand_shape: Optional[Sequence[int]]
) -> Optional[Tuple[int, ...]]:
    """The int32 data a shape op folds to from its operand's static shape, or None if it does not fold.

    ``operand_shape`` is the operand's static shape (None when a dim is not static).
    """
    if op_name not in SHAPE_OPS + (NDARRAY_SIZE_OP,) or operand_shape is None:
        return None
    if op_name == NDARRAY_SIZE_OP:
        # Stock reports size 0 for a 0-d operand; matching it keeps the outputs equal.
        size = 0 if not operand_shape else 1
        for dim in operand_shape:
            size *= dim
        return (size,)
    if not operand_shape:
        return None  # stock yields a 0-d tensor of uninitialised memory for shape_of(scalar)
    return tuple(operand_shape)


def is_primitive(func: relay.Function) -> bool:
    attrs = func.attrs
    return attrs is not None and "Primitive" in attrs.keys() and int(attrs["Primitive"]) != 0


def is_optimizable(func: relay.Function) -> bool:
    """True for a function stock function passes visit (no Compiler / Extern / SkipOptimization).

    Stock ``FoldConstant`` never rewrites inside a ``Primitive`` (fused) function either: its
    body is one kernel, whose operands are the kernel's parameters.
    """
    attrs = func.attrs
    if attrs is None:
        return True
    if is_primitive(func):
        return False
    keys = set(attrs.keys())
    if "Compiler" in keys:
        return False
    return not any(key in keys and int(attrs[key]) != 0 for key in EXTERNAL_ATTRS[1:])


def is_true(constant: relay.Constant) -> bool:
    """The truth of an ``If`` condition as stock reads it: the first byte of the data."""
    data = constant.data.numpy()
    return bool(data.reshape(-1).view("uint8")[0]) if data.size else False


@cache
def evaluation_target() -> str:
    """The CPU target stock FoldConstant evaluates on, so folded constants are bit-identical.

    Upstream stock evaluates on ``llvm``, the LLVM default triple, which is the host's. A build
    whose LLVM defaults to another architecture (hhb-tvm defaults to riscv64) cannot run that
    code here, and its stock pass evaluates on ``llvm -mtriple=<host>-unknown-linux`` instead.
    """
    machine = platform.machine()
    default_triple = str(tvm.target.codegen.llvm_get_system_triple())
    if default_triple.startswith(machine):
        return "llvm"
    return f"llvm -mtriple={machine}-unknown-linux"
