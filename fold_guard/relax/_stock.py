"""What the Relax adapter copies from stock ``relax.transform.FoldConstant``: the TVM-upgrade surface.

Under the ``default`` policy fold_guard's output must be structurally equal to the stock pass's
(``src/relax/transform/fold_constant.cc``), so every rule of the stock pass that decides *whether*
a call folds, or *how* the function is rewritten around what folded, is stated here and nowhere
else (``tests/relax/test_stock_rules.py`` keeps it so). On a TVM upgrade, re-check this module
against the new ``fold_constant.cc``:

* **per call** (:func:`stock_rules`, which the walk asks once per call, in the order of the
  stock pass's ``VisitExpr_(const CallNode*)``): not an operator; a ``call_tir`` whose target is
  not one of the module's PrimFuncs, or that passes symbolic shape values (``tir_vars``); an
  operator with no ``FLegalize`` (``tensor_to_shape`` aside, whose values stock reads itself,
  from an int64 tensor only), or an impure one; a result with symbolic dims;
* **dataflow only**: operators fold only inside dataflow blocks; ``call_tir`` of a module
  PrimFunc folds in any block;
* **creation size**: a call with no tensor argument (a creation op such as ``zeros``) whose static
  result has more than 1024 elements is not folded (``ShouldBeFolded``);
* **single TIR call**: an operator folds only when ``LegalizeOps`` turns it into exactly one
  ``call_tir`` without symbolic shape arguments (:func:`legalized_call_tir`);
* **constness after legalization**: every call is legalized, whatever its operands, and folds
  when that ``call_tir``'s arguments are all constants: an operand the kernel does not take
  (``zeros_like(x)`` reads only ``x``'s static shape) does not stop it (``_translate.reads`` finds them,
  ``_translate.legalize`` records them in ``PlanningFacts.unread``);
* **scalar legalization**: stock legalizes the call as it stands, so scalar constant operands reach
  the legalizer as constants; some legalizers (``astype``) then return a constant instead of a
  TIR call, which stock does not fold. Whether that happens is decided by legalizing once with
  the scalars as constants (:func:`needs_scalar_decision`), once per distinct value where the
  value itself matters (:func:`scalar_value_key`: ``divide`` by a literal zero raises), and for
  a 0-d operand folded in the same pass, on its value once it is evaluated
  (:func:`scalar_rule`);
* **scalars compiled in**: the legalizers write a 0-d constant operand into the kernel as an
  immediate, and TVM's constant folder (``x + 0 -> x``, ``x * 1 -> x``, ``x * 0 -> 0``) and LLVM
  (``pow(x, 0.5) -> sqrt(x)``, ``x * -1 -> -x``, NaN and infinity operands folded) then compile
  some values in ways a kernel reading the value from memory does not: stock's bits for such a
  call depend on the value (:func:`value_shapes_kernel`);
* **rewrite**: a folded binding becomes ``v = constant``; every use of a variable bound to a
  constant becomes the constant; operator calls (not ``call_tir``, not large creations) get
  variables bound to a ``ShapeExpr`` substituted into their arguments
  (:func:`substitutes_shape_arguments`); ``remove_all_unused`` then drops dead bindings of every
  function.

And from stock ``relax.transform.LiftTransformParams`` (``src/relax/transform/
lift_transform_params.cc``), which evaluates weight-only work where weights are parameters, the
rules that decide whether a call on the parameter path is lifted (:func:`lift_rule`):

* **targets**: functions with a ``num_input`` attribute whose name does not end in
  ``transform_params``; their parameters from ``num_input`` on are the weights
  (:func:`weight_parameter_start`);
* **dataflow only**: only bindings inside dataflow blocks are lifted;
* **the stop**: a ``stop_lift_params`` call is never lifted (the pass removes it from the
  function it leaves at run time);
* **symbolic dims**: a binding whose type has a symbolic variable no weight parameter defines is
  not lifted.
"""

from __future__ import annotations

import math
from typing import Callable, FrozenSet, Hashable, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax

from .._core.graph import TensorInfo
from .._core.reasons import Reason
from . import _compat
from ._sites import SiteKind

__all__ = [
    "CALL_TIR_OP",
    "LIFT_STOP_OP",
    "RULE_DATAFLOW_ONLY",
    "RULE_LARGE_CREATION",
    "STOCK_MAX_CREATION_ELEMENTS",
    "TENSOR_TO_SHAPE_OP",
    "OpAttr",
    "StockDecision",
    "is_large_creation",
    "legalized_call_tir",
    "lift_rule",
    "needs_scalar_decision",
    "not_legalized_rule",
    "scalar_rule",
    "scalar_value_key",
    "stock_rules",
    "substitutes_shape_arguments",
    "value_shapes_kernel",
    "weight_dims",
    "weight_parameter_start",
]

#: The ops stock treats apart from other operators (the adapter's table of IR op names).
CALL_TIR_OP = "relax.call_tir"
TENSOR_TO_SHAPE_OP = "relax.tensor_to_shape"
#: The identity op stock LiftTransformParams never lifts (``relax.op.builtin.stop_lift_params``).
LIFT_STOP_OP = "relax.builtin.stop_lift_params"

#: Stock FoldConstant (``ShouldBeFolded``) leaves creation ops above this many elements alone.
STOCK_MAX_CREATION_ELEMENTS = 1024

RULE_DATAFLOW_ONLY = "relax folds operators only inside dataflow blocks (call_tir folds anywhere)"
RULE_LARGE_CREATION = (
    "relax does not fold a creation op whose result has more than "
    f"{STOCK_MAX_CREATION_ELEMENTS} elements"
)


#: Looks an op attribute up (``FLegalize``, ``FPurity``); None when the op does not have it.
OpAttr = Callable[[tvm.ir.Op, str], object]


class StockDecision(NamedTuple):
    """What stock's per-call rules say of one call, before legalization (:func:`stock_rules`).

    ``kind``: how fold_guard computes the call (through its legalized kernel, a module's
    ``call_tir``, ``tensor_to_shape`` read directly, or not at all). ``unfoldable`` and ``detail``:
    why fold_guard can never evaluate it (None: it can). ``default_fold``: whether stock folds it
    once its inputs are constant, else ``default_rule`` names the rule that keeps it
    (legalization can still take a fold away: :func:`not_legalized_rule`).
    """

    kind: SiteKind
    unfoldable: Optional[Reason] = None
    detail: str = ""
    default_fold: bool = True
    default_rule: str = ""


def stock_rules(
    call: relax.Call,
    *,
    mod: tvm.IRModule,
    in_dataflow: bool,
    outputs: Sequence[TensorInfo],
    op_attr: OpAttr,
) -> StockDecision:
    """What the stock pass decides for ``call`` (a call that is no fold_guard annotation), and why.

    The guards of ``VisitExpr_(const CallNode*)`` in ``fold_constant.cc``, in its order, each
    answering for good: not an operator; a ``call_tir`` of something that is not a PrimFunc of
    ``mod``, or with ``tir_vars``; no ``FLegalize`` (``tensor_to_shape`` aside: stock reads an int64
    constant's values itself); impure (``FPurity`` false: its legalized form is no TIR call);
    a result whose type has symbolic dims (``outputs``: the call's result types, read once by the
    walk). Then the rules that keep a call whatever fold_guard can evaluate: outside a dataflow
    block an operator does not fold, and a large creation does not fold (``ShouldBeFolded``; where
    both keep an operator, the dataflow rule is named). ``op_attr`` reads an op's attributes.
    """
    op = call.op
    if not isinstance(op, tvm.ir.Op):
        detail = f"call to {op} is not an operator; only operators and call_tir fold"
        return StockDecision(SiteKind.OTHER, Reason.UNSUPPORTED, detail)
    name = op.name
    unfoldable: Optional[Reason] = None
    detail = ""
    if name == CALL_TIR_OP:
        kind = SiteKind.CALL_TIR
        callee = call.args[0]
        if not isinstance(callee, tvm.ir.GlobalVar) or callee not in mod.functions:
            unfoldable, detail = (
                Reason.UNSUPPORTED,
                f"call_tir target {callee} is not a function of the module",
            )
        elif not isinstance(mod[callee], tvm.tirx.PrimFunc):
            unfoldable, detail = (
                Reason.UNSUPPORTED,
                f"call_tir target {callee.name_hint} is not a PrimFunc",
            )
        elif _passes_tir_vars(call):
            unfoldable, detail = Reason.DYNAMIC_SHAPE, _TIR_VARS_DETAIL
    elif name == TENSOR_TO_SHAPE_OP:
        kind = SiteKind.TENSOR_TO_SHAPE
        arg_ty = _compat.type_of(call.args[0])
        if not isinstance(arg_ty, _compat.TensorType) or _compat.dtype_of(arg_ty) != "int64":
            unfoldable, detail = (
                Reason.UNSUPPORTED,
                "tensor_to_shape folds only from an int64 tensor",
            )
    elif op_attr(op, "FLegalize") is None:
        kind = SiteKind.OTHER
        unfoldable = Reason.UNSUPPORTED
        detail = f"{name} has no FLegalize, so it has no TIR kernel to evaluate"
    elif _is_impure(op_attr(op, "FPurity")):
        kind = SiteKind.OTHER
        unfoldable, detail = Reason.IMPURE, f"{name} is impure"
    else:
        kind = SiteKind.OP
    if (
        unfoldable is None
        and kind in (SiteKind.OP, SiteKind.CALL_TIR)
        and any(not info.is_static for info in outputs if info.dtype != "shape")
    ):
        unfoldable = Reason.DYNAMIC_SHAPE
        detail = f"result type {_compat.type_of(call)} has symbolic dims"
    is_operator = kind in (SiteKind.OP, SiteKind.TENSOR_TO_SHAPE)
    if is_operator and not in_dataflow:
        return StockDecision(kind, unfoldable, detail, False, RULE_DATAFLOW_ONLY)
    if (is_operator or kind is SiteKind.CALL_TIR) and is_large_creation(call):
        return StockDecision(kind, unfoldable, detail, False, RULE_LARGE_CREATION)
    return StockDecision(kind, unfoldable, detail)


def _is_impure(purity: object) -> bool:
    """``FPurity`` registered and false."""
    return purity is not None and not bool(purity)


#: Why stock does not fold a ``call_tir`` that passes symbolic shape values.
_TIR_VARS_DETAIL = "call_tir passes symbolic shape values (tir_vars)"


def _passes_tir_vars(call: relax.Call) -> bool:
    """Whether a ``call_tir`` passes symbolic shape values (``tir_vars``) after its operands: stock
    cannot supply them to the PrimFunc, so it does not fold the call."""
    return len(call.args) > 2


def not_legalized_rule(op: str, why: str) -> str:
    """The default rule of an operator stock does not fold because of how it legalizes."""
    return f"relax: {op} {why}; stock does not fold it"


def _contains_tensor(expr: relax.Expr) -> bool:
    if isinstance(_compat.type_of(expr), _compat.TensorType):
        return True
    return isinstance(expr, relax.Tuple) and any(_contains_tensor(f) for f in expr.fields)


def is_large_creation(call: relax.Call) -> bool:
    """Stock ``ShouldBeFolded``: a call with no tensor argument and a static result > 1024 elements."""
    ty = _compat.type_of(call)
    shape = _compat.static_shape(ty)
    if shape is None:
        return False
    elements = 1
    for dim in shape:
        if dim is None or dim <= 0:
            return False  # as stock: symbolic or empty shapes are never "too large"
        elements *= dim
    if elements <= STOCK_MAX_CREATION_ELEMENTS:
        return False
    return not any(_contains_tensor(arg) for arg in call.args)


def needs_scalar_decision(leaf_shapes: Sequence[Optional[Tuple[Optional[int], ...]]]) -> bool:
    """Whether a call's stock fold depends on legalizing it with its scalar operands as constants.

    Only a 0-d operand is given to the legalizer as a constant by the stock pass in a way that
    changes what it returns; what it returns then depends on the operands being constants, not
    on their values, so one such legalization decides for every call of an op signature.
    """
    return any(len(shape or ()) == 0 for shape in leaf_shapes)


#: Ops whose legalized kernel is built around a 0-d operand's value, whatever the value: a
#: math-library call LLVM rewrites by its constant argument (``pow(x, 2) -> x * x``,
#: ``pow(2, x) -> exp2(x)``; ``atan2``, ``log_add_exp``, a float ``mod`` / ``floor_mod``), or a
#: creation that turns the value into a Python number (``full``, ``eye``).
VALUE_SPECIALIZED_OPS = frozenset(
    {
        "relax.power",
        "relax.atan2",
        "relax.log_add_exp",
        "relax.mod",
        "relax.floor_mod",
        "relax.full",
        "relax.full_like",
        "relax.eye",
        "relax.eye_like",
    }
)
#: The float values TVM's constant folder or LLVM's instruction combiner rewrite an operation
#: by when they are an operand: 0 (``x + 0 -> x``, ``x * 0 -> 0``, ``0 / x -> 0``), 1 and -1
#: (``x * 1 -> x``, ``x * -1 -> -x``, which flips a NaN's sign), and the non-finite ones (folded
#: to a constant NaN, whose payload is LLVM's, not the CPU's).
_SPECIAL_FLOATS = (0.0, 1.0, -1.0)


def value_shapes_kernel(
    op_name: str, dtype: str, value: np.ndarray, *, float_arithmetic: bool = False
) -> bool:
    """Whether stock's kernel, with this 0-d operand compiled in as an immediate, may compute
    other bits than the same kernel reading it from memory.

    Any other value, in any op, cannot: an IEEE operation on the same operands gives the same
    bits whether an operand was loaded or immediate, TVM's constant folder tests only for 0 and
    1, and LLVM without fast-math rewrites an operation by a constant only where the result is
    the same (a division by a power of two becomes an exact multiplication). Integer immediates
    are rewritten only where the integer result is the same (or undefined: a division by zero);
    an integer operand that enters float arithmetic (``float_arithmetic``: the zero point of a
    quantize to a float dtype) counts as a float.

    >>> value_shapes_kernel("relax.multiply", "float32", np.float32(0.5))
    False
    >>> value_shapes_kernel("relax.add", "float32", np.float32(-0.0))
    True
    >>> value_shapes_kernel("relax.power", "float32", np.float32(3.0))
    True
    """
    if op_name in VALUE_SPECIALIZED_OPS:
        return True
    if not (dtype.startswith(("float", "bfloat")) or float_arithmetic):
        return False
    number = float(np.asarray(value).astype("float64"))
    return not math.isfinite(number) or number in _SPECIAL_FLOATS


def scalar_value_key(
    call: relax.Call, leaves: Sequence[Optional[np.ndarray]], dtypes: Sequence[str]
) -> Tuple[Hashable, ...]:
    """What of a call's 0-d operand values (None where not 0-d or not known) can change stock's
    legalization or kernel: per operand, its bytes where :func:`value_shapes_kernel`, else None.

    Calls with equal keys legalize and compile alike in stock; one decision serves them all.
    """
    op_name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
    key = []
    for index, (value, dtype) in enumerate(zip(leaves, dtypes)):
        special = value is not None and value_shapes_kernel(
            op_name, dtype, value, float_arithmetic=_float_zero_point(call, index)
        )
        key.append((dtype, np.asarray(value).tobytes()) if special else None)
    return tuple(key)


def _float_zero_point(call: relax.Call, index: int) -> bool:
    """The zero point of a quantize to a float dtype: added to the scaled value in float."""
    if index != 2 or not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.quantize":
        return False
    return str(call.attrs.out_dtype).startswith(("float", "bfloat"))


def legalized_call_tir(func: relax.Function) -> Tuple[Optional[relax.Call], str]:
    """The single ``call_tir`` ``func`` (one legalized call) consists of, or None and why not.

    Stock folds an operator only when ``LegalizeOps`` gives exactly one TIR call, and only when
    that call passes no symbolic shape values (``tir_vars``).
    """
    bindings = [b for block in func.body.blocks for b in block.bindings]
    if len(bindings) != 1:
        return None, f"legalizes to {len(bindings)} bindings, not a single TIR call"
    value = bindings[0].value
    if not (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.Op)
        and value.op.name == CALL_TIR_OP
    ):
        kind = (
            value.op.name
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            else type(value).__name__
        )
        return None, f"legalizes to {kind}, not a TIR call"
    if _passes_tir_vars(value):
        return None, f"legalized {_TIR_VARS_DETAIL}"
    return value, ""


def scalar_rule(
    op_name: str, legalized: Optional[relax.Function], error: str = ""
) -> Optional[str]:
    """Why stock would not fold a call whose 0-d operands were folded in this same pass, judged on
    their values once they are known; None where it would.

    Stock legalizes the call with those operands as constants, values included: ``legalized`` is
    that legalization (the function of one call), ``error`` the legalizer's error where it raised.
    Stock raises where ``LegalizeOps`` raises, and does not fold what does not legalize to one TIR
    call; either way the call is kept with the reason (``_translate.pending`` judges each such call
    once the values are known).
    """
    if error or legalized is None:
        return f"{error or 'LegalizeOps failed'}; stock raises"
    _, why = legalized_call_tir(legalized)
    return not_legalized_rule(op_name, why) if why else None


def substitutes_shape_arguments(call: relax.Call) -> bool:
    """Whether the rewrite substitutes ``ShapeExpr``-bound variables into ``call``'s arguments.

    Stock does it for every operator call except ``call_tir`` and the large creations it does not
    fold.
    """
    if not isinstance(call.op, tvm.ir.Op):
        return False
    return call.op.name != CALL_TIR_OP and not is_large_creation(call)


RULE_LIFT_DATAFLOW_ONLY = "relax: LiftTransformParams lifts only bindings inside dataflow blocks"
RULE_LIFT_STOP = "relax: LiftTransformParams never lifts stop_lift_params (it removes it instead)"
RULE_LIFT_SYMBOLIC = (
    "relax: LiftTransformParams does not lift a binding whose type has a symbolic dim that no "
    "weight parameter defines"
)


def weight_parameter_start(name: str, attrs: Optional[Mapping[str, object]]) -> Optional[int]:
    """Index of the first weight parameter of function ``name`` (with ``attrs``) for stock
    LiftTransformParams, or None.

    The pass lifts in functions with a ``num_input`` attribute, except its own results (a name
    ending in ``transform_params``); parameters from ``num_input`` on are the weights.
    """
    if attrs is None or "num_input" not in attrs or name.endswith("transform_params"):
        return None
    return int(attrs["num_input"])  # type: ignore[call-overload]


def lift_rule(*, op_name: str, in_dataflow: bool, ty: object, weight_dims: FrozenSet[int]) -> str:
    """The stock rule that keeps a call at run time whatever its inputs ("" when it is lifted).

    ``ty`` is the binding's type and ``weight_dims`` the handles (``_compat.handle``) of the
    symbolic variables the weight parameters' types define.
    """
    if not in_dataflow:
        return RULE_LIFT_DATAFLOW_ONLY
    if op_name == LIFT_STOP_OP:
        return RULE_LIFT_STOP
    if any(_compat.handle(var) not in weight_dims for var in relax.analysis.tir_vars_in_type(ty)):
        return RULE_LIFT_SYMBOLIC
    return ""


def weight_dims(func: relax.Function, start: int) -> FrozenSet[int]:
    """Handles of the symbolic variables ``func``'s weight parameters (from ``start``) define."""
    return frozenset(
        _compat.handle(var)
        for param in func.params[start:]
        for var in relax.analysis.definable_tir_vars_in_type(_compat.type_of(param))
    )
