"""The Relax annotation ops ``relax.fold_barrier`` and ``relax.fold_allow``.

Both are identity at run time: their type is their operand's type and they are pure. They leave
the module at different stages, and that difference is the point:

* ``fold_allow`` legalizes to its operand (``FLegalize``). Once a module is legalized every call
  is a TIR call that any ``FoldConstant`` folds from constants, so the request is fulfilled.
* ``fold_barrier`` has no ``FLegalize``: ``LegalizeOps`` leaves it in place, and the stock
  ``FoldConstant`` can neither legalize nor evaluate it, so it never folds across it. It is
  removed only by ``LowerRuntimeBuiltin`` (through ``FLowerBuiltin``), which runs in the VM
  build after every pipeline's folding. There it becomes a ``vm.builtin.reshape`` of its operand
  to its own shape: a view, no copy, and a value in a VM register (``KillAfterLastUse`` has
  already scheduled a kill for it, which a plain constant could not take).

Where weights are parameters, TVM's own ``relax.builtin.stop_lift_params`` goes under a barrier,
so that ``LiftTransformParams`` (whose only stop it is) keeps the barrier at run time:
``annotate`` puts it under the barriers it places and under existing ones over weights, and
:func:`fold_barrier` under a barrier built by hand over a weight parameter of the function being
built (a ``BlockBuilder`` function or TVMScript with ``num_input``), so a hand barrier holds
through the lifting as an annotated one does. That op has no
lowering in TVM 0.27 (the lifting pass removes it; a module built without lifting fails in VM
codegen), so :func:`register_ops` gives it the barrier's ``FLowerBuiltin`` when it has none: an
annotated module then builds whether or not it was lifted.

They are named ``relax.*`` so that the TVMScript printer writes ``R.fold_barrier(x)``; the parser
learns them from the builders installed on ``tvm.script.parser.relax`` at registration.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax
from tvm.ir import _ffi_api as _ir_ffi

from .._core.errors import UnsupportedIRError
from . import _compat
from ._stock import LIFT_STOP_OP, weight_parameter_start

__all__ = [
    "FOLD_ALLOW_OP",
    "FOLD_BARRIER_OP",
    "fold_allow",
    "fold_barrier",
    "non_tensor_operand_error",
    "register_ops",
]

FOLD_BARRIER_OP = "relax.fold_barrier"
FOLD_ALLOW_OP = "relax.fold_allow"

_DESCRIPTIONS = {
    FOLD_BARRIER_OP: "Identity. fold_guard never folds across it: its output is not a constant.",
    FOLD_ALLOW_OP: "Identity. fold_guard lowers and evaluates the constant subgraph producing its operand.",
}


def non_tensor_operand_error(
    op_name: str, operand: relax.Expr, where: str = ""
) -> UnsupportedIRError:
    """The error for an annotation over something that is not a tensor (the builders, type
    inference and the passes all refuse it with this text).

    Only tensors are supported: a barrier over a shape, a PrimValue, a string, a tuple or a
    function has no constant of its own dtype to keep, the stock ``FoldConstant`` asserts on a
    barrier over a shape, and a barrier over a ``StringImm`` does not build.
    """
    kind = (
        type(_compat.type_of(operand)).__name__
        if _compat.has_type(operand)
        else type(operand).__name__
    )
    if isinstance(operand, relax.Var):
        text = _compat.var_name(operand)
    elif isinstance(operand, relax.Function):
        text = "(a local function)"
    else:
        text = str(operand).splitlines()[0][:60]
    return UnsupportedIRError(
        f"{where}{op_name.split('.')[-1]} annotates tensors only, but its operand {text} is a {kind}; "
        "hint: annotate the tensor that feeds it (for a tuple, each tensor field)"
    )


def _infer_identity_type(call: relax.Call, _builder: Any) -> Any:
    if len(call.args) != 1:
        raise UnsupportedIRError(
            f"{call.op.name} takes exactly one operand, got {len(call.args)} in {call}; "
            "build it with fold_guard.relax.fold_barrier(expr) / fold_allow(expr)"
        )
    ty = _compat.type_of(call.args[0])
    if not isinstance(ty, _compat.TensorType):
        raise non_tensor_operand_error(call.op.name, call.args[0])
    return ty


def _legalize_to_operand(_builder: Any, call: relax.Call) -> relax.Expr:
    return call.args[0]


#: The runtime builtin a barrier lowers to: a view of its operand (``Tensor::CreateView``).
VIEW_BUILTIN = "vm.builtin.reshape"
#: Reads a tensor's shape at run time, for a barrier whose operand's type does not give it.
SHAPE_OF_BUILTIN = "vm.builtin.shape_of"


def _lower_barrier_to_view(builder: Any, call: relax.Call) -> relax.Expr:
    # A tensor: type inference (_infer_identity_type) admits nothing else under an annotation.
    operand = call.args[0]
    ty = _compat.type_of(operand)
    shape = ty.shape
    if shape is None:
        ndim = getattr(ty, "ndim", -1)
        shape = builder.emit(
            _compat.make_call(
                relax.ExternFunc(SHAPE_OF_BUILTIN), [operand], ty_args=[relax.ShapeType(ndim=ndim)]
            )
        )
    return _compat.make_call(relax.ExternFunc(VIEW_BUILTIN), [operand, shape], ty_args=[ty])


def _is_registered(name: str) -> bool:
    return name in tvm.ir.Op.list_op_names()


def _lower_stop_to_view(builder: Any, call: relax.Call) -> relax.Expr:
    # stop_lift_params is TVM's op and takes any operand: only a tensor becomes a view.
    if not isinstance(_compat.type_of(call.args[0]), _compat.TensorType):
        return call.args[0]
    return _lower_barrier_to_view(builder, call)


def register_ops() -> None:
    """Register both ops and teach the TVMScript parser their builders. Safe to call again.

    Also gives ``stop_lift_params`` a lowering to a view when TVM has none (module doc).
    """
    for name, description in _DESCRIPTIONS.items():
        if not _is_registered(name):
            _ir_ffi.RegisterOp(name, description)
        op = tvm.ir.Op.get(name)
        if op.get_attr("FInferType") is None:
            op.set_num_inputs(1)
            op.add_argument("data", "Tensor", "The annotated value.")
            op.set_attr("FInferType", _infer_identity_type)
            op.set_attr("FPurity", True)
            if name == FOLD_BARRIER_OP:
                op.set_attr("FLowerBuiltin", _lower_barrier_to_view)
            else:
                op.set_attr("FLegalize", _legalize_to_operand)
    stop = tvm.ir.Op.get(LIFT_STOP_OP)
    if stop.get_attr("FLowerBuiltin") is None:
        stop.set_attr("FLowerBuiltin", _lower_stop_to_view)
    _install_parser_builders()


def _install_parser_builders() -> None:
    # The printer emits `R.fold_barrier(...)`. `tvm.script.from_source` resolves `R` to the
    # parser's module, while decorated code resolves it to whatever the user imported as `R`
    # (usually `tvm.script.relax`), so both modules get the builders.
    import tvm.script.parser.relax as parser_relax
    import tvm.script.relax as script_relax

    for module in (parser_relax, script_relax):
        module.fold_barrier = fold_barrier
        module.fold_allow = fold_allow


def _annotate(op_name: str, expr: relax.Expr) -> relax.Call:
    if not isinstance(expr, relax.Expr):
        raise UnsupportedIRError(
            f"{op_name.split('.')[-1]} expects a Relax expression, got {type(expr).__name__} ({expr!r})"
        )
    # An operand built outside a BlockBuilder has no type yet: type inference checks it later.
    if isinstance(expr, relax.Function) or (
        _compat.has_type(expr) and not isinstance(_compat.type_of(expr), _compat.TensorType)
    ):
        raise non_tensor_operand_error(op_name, expr)
    return _compat.make_call(tvm.ir.Op.get(op_name), [expr])


def fold_barrier(expr: relax.Expr) -> relax.Call:
    """Mark ``expr`` as a fold barrier: nothing that consumes it is folded.

    The operand itself may still fold (a constant subgraph above the barrier collapses into one
    constant that stays under the barrier). The barrier survives fold_guard's pass, ``LegalizeOps``
    and any later stock ``relax.transform.FoldConstant`` (so every TVM pipeline), and becomes a
    view of its operand (no copy) in the VM build. Over a weight parameter of the function being
    built (from its ``num_input`` on), it stands on ``stop_lift_params``, as ``annotate`` writes
    it: ``fold_barrier(stop_lift_params(w))``, which the builder gives a binding of its own, so
    ``LiftTransformParams`` keeps the barrier and what reads it at run time.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from fold_guard.relax import fold_barrier
    >>> print(fold_barrier(relax.const(np.zeros(2, "float32"))).op.name)
    relax.fold_barrier
    """
    call = _annotate(FOLD_BARRIER_OP, expr)
    if _is_weight_parameter(expr):
        return _compat.make_call(call.op, [relax.op.builtin.stop_lift_params(expr)])
    return call


def _is_weight_parameter(expr: relax.Expr) -> bool:
    """Whether ``expr`` is a weight parameter of the function being built (``_compat``).

    Not in a module that already holds the function's ``transform_params``: that is a lifting's
    result, whose barriers stand as the lifting left them (so it prints and parses back as is).
    """
    if not isinstance(expr, relax.Var) or isinstance(expr, relax.DataflowVar):
        return False
    building = _compat.building_function()
    if building is None:
        return False
    lifted = {f"{building.name}_transform_params", "transform_params"}
    if lifted & building.module_functions:
        return False
    start = weight_parameter_start(building.name, building.attrs)
    return start is not None and any(p.same_as(expr) for p in building.params[start:])


def fold_allow(expr: relax.Expr) -> relax.Call:
    """Ask that the constant subgraph producing ``expr`` be evaluated, whatever the policy says.

    Precedence is barrier > allow > policy > the IR default: a barrier inside the subgraph still
    wins. Once ``expr`` has become a constant the annotation disappears; if it cannot (it depends
    on a run-time input, or an op cannot be evaluated) the annotation stays and the report says
    why (``strict=True`` raises instead).

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> from fold_guard.relax import fold_allow
    >>> print(fold_allow(relax.const(np.zeros(2, "float32"))).op.name)
    relax.fold_allow
    """
    return _annotate(FOLD_ALLOW_OP, expr)
