"""Translation, first half: a Relax IRModule read into call sites, then into FoldGraph nodes.

The adapter models the stock ``relax.transform.FoldConstant`` (``src/relax/transform/
fold_constant.cc``) closely, because under the ``default`` policy our output must be structurally
equal to its output (its rules are stated in :mod:`fold_guard.relax._stock`). An input is
constant when it is a literal constant, or a variable bound to one (also through aliases), or the
output of a call that folds; variables bound to tuples, tuple items or match casts are not
constant, as in the stock pass.

Translation is two steps, because some facts of a node are only known once its call is
legalized (whether it has a kernel, whether stock folds what the legalizer returns, which
zero-size operands the kernel reads): :func:`walk_relax` describes every call binding, ``_legalize``
legalizes the calls :meth:`Walk.candidates` names, and :meth:`Walk.translate` then builds every
:class:`FoldNode` once, with those :class:`~fold_guard.relax._sites.PlanningFacts`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Set, Tuple

import numpy as np
import tvm
from tvm import relax

from .._core.errors import PreconditionError, UnsupportedIRError
from .._core.graph import (
    Annotation,
    FoldNode,
    InputKind,
    NodeInput,
    TensorInfo,
    reachable_from_constants,
)
from .._core.reasons import Reason
from . import _compat
from ._ops import FOLD_ALLOW_OP, FOLD_BARRIER_OP, non_tensor_operand_error
from ._sites import CallSite, PlanningFacts, SiteKind, StaticShapeVar
from ._stock import CALL_TIR_OP, TENSOR_TO_SHAPE_OP, default_decision, not_legalized_rule

__all__ = ["Translation", "Walk", "walk_relax"]


@dataclass
class _Leaves:
    """The tensor arguments of one call as the walk collects them (see ``_add_leaf``)."""

    inputs: List[NodeInput] = field(default_factory=list)
    leaves: List[relax.Expr] = field(default_factory=list)
    constants: List[Optional[relax.Expr]] = field(default_factory=list)
    zero_size: List[int] = field(default_factory=list)
    #: nodes read here other than as a tensor operand (a tuple-typed variable)
    escaping: List[int] = field(default_factory=list)


@dataclass(frozen=True)
class Translation:
    """The graph nodes (``sites[i]`` describes ``nodes[i]``) and the Relax functions they came from."""

    nodes: Tuple[FoldNode, ...]
    sites: Tuple[CallSite, ...]
    functions: Mapping[str, Tuple[tvm.ir.GlobalVar, relax.Function]]
    #: nodes whose variable is used other than as a tensor operand of a call the graph holds (a
    #: return value, a tuple, a match cast, a branch or closure that captures it): the rewrite
    #: may need their values whatever their consumers do
    escaping: FrozenSet[int] = frozenset()


@dataclass(frozen=True)
class _Facts:
    """What the walk learns of one call; :meth:`Walk.translate` adds the legalizer's facts."""

    op: str
    label: str
    function: str
    inputs: Tuple[NodeInput, ...]
    outputs: Tuple[TensorInfo, ...]
    attrs: Mapping[str, object]
    annotation: Annotation
    unfoldable: Optional[Reason]
    unfoldable_detail: str
    default_fold: bool
    default_rule: str


@dataclass(frozen=True)
class _OpTraits:
    """What the walk reads of an operator's registered attributes."""

    legalizes: bool  # has FLegalize
    impure: bool  # FPurity is registered and false


@dataclass
class Walk:
    """Every call binding of a module, described (:func:`walk_relax`); nodes come from :meth:`translate`."""

    sites: List[CallSite]
    facts: List[_Facts]
    functions: Dict[str, Tuple[tvm.ir.GlobalVar, relax.Function]]
    #: see Translation.escaping
    escaping: Set[int] = field(default_factory=set)
    #: per op name, read once per walk (an attribute read is an FFI call returning a function)
    _op_traits: Dict[str, _OpTraits] = field(default_factory=dict, repr=False)

    def op_traits(self, name: str, op: tvm.ir.Op) -> _OpTraits:
        traits = self._op_traits.get(name)
        if traits is None:
            purity = op.get_attr("FPurity")
            traits = self._op_traits[name] = _OpTraits(
                legalizes=op.get_attr("FLegalize") is not None,
                impure=purity is not None and not bool(purity),
            )
        return traits

    def candidates(self) -> FrozenSet[int]:
        """The calls that could fold if everything upstream did: the ones worth legalizing.

        Reachability from constants as the planner sees it
        (:func:`~fold_guard._core.graph.reachable_from_constants`: a barrier's output is not
        constant), where a zero-size run-time tensor counts as constant (it has one possible
        value) and the output of a call fold_guard cannot evaluate at all does not.
        """
        opaque = {site.node_id for site in self.sites if site.kind is SiteKind.OTHER}
        nodes = [
            (
                tuple(
                    dataclasses.replace(inp, kind=InputKind.CONSTANT)
                    if index in site.zero_size_leaves
                    else inp
                    for index, inp in enumerate(facts.inputs)
                ),
                facts.annotation,
            )
            for site, facts in zip(self.sites, self.facts)
        ]
        reachable = reachable_from_constants(nodes, through_barriers=False, opaque=opaque)
        return frozenset(
            node_id for node_id in reachable if self.sites[node_id].kind is not SiteKind.OTHER
        )

    def translate(self, legalized: PlanningFacts) -> Translation:
        """Build every FoldNode, once, from the walk's facts and what legalization found."""
        nodes = tuple(_node(site, facts, legalized) for site, facts in zip(self.sites, self.facts))
        return Translation(nodes, tuple(self.sites), dict(self.functions), frozenset(self.escaping))


def _node(site: CallSite, facts: _Facts, legalized: PlanningFacts) -> FoldNode:
    """One FoldNode: the walk's facts, plus no kernel at all, or a kernel the stock pass would not use."""
    node_id = site.node_id
    unfoldable, detail = facts.unfoldable, facts.unfoldable_detail
    if unfoldable is None and node_id in legalized.unsupported:
        unfoldable, detail = Reason.UNSUPPORTED, legalized.unsupported[node_id]
    inputs = facts.inputs
    unread = legalized.unread_zero_size.get(node_id, ())
    if unread:
        inputs = tuple(
            dataclasses.replace(inp, kind=InputKind.CONSTANT) if i in unread else inp
            for i, inp in enumerate(inputs)
        )
    default_fold, default_rule = facts.default_fold, facts.default_rule
    if node_id in legalized.not_stock_foldable and default_fold:
        default_fold, default_rule = (
            False,
            not_legalized_rule(facts.op, legalized.not_stock_foldable[node_id]),
        )
    return FoldNode(
        id=node_id,
        op=facts.op,
        label=facts.label,
        function=facts.function,
        inputs=inputs,
        outputs=facts.outputs,
        attrs=facts.attrs,
        annotation=facts.annotation,
        unfoldable=unfoldable,
        unfoldable_detail=detail,
        default_fold=default_fold,
        default_rule=default_rule,
        lowered=site.kind is SiteKind.CALL_TIR,
    )


def _is_static_shape_var(arg: relax.Expr) -> bool:
    ty = _compat.type_of(arg)
    values = getattr(ty, "values", None) if isinstance(ty, _compat.ShapeType) else None
    return values is not None and all(isinstance(v, tvm.tirx.IntImm) for v in values)


class _Bound(Enum):
    """What a variable is bound to, as far as folding is concerned."""

    CONSTANT = "constant"
    NODE = "node"  # the result of a call binding
    SHAPE = "shape"  # a ShapeExpr
    OPAQUE = "opaque"


@dataclass(frozen=True)
class _Env:
    kind: _Bound
    value: object = None
    node: Optional[int] = None


_OPAQUE = _Env(_Bound.OPAQUE)  # parameters, match casts, tuples, anything not a constant or a call
#: What each variable in scope is bound to, keyed by the variable's handle (``_compat.handle``;
#: the module being walked keeps every variable alive)
_Scope = Dict[int, _Env]


def walk_relax(mod: tvm.IRModule) -> Walk:
    """Walk every Relax function of ``mod`` and describe each call binding.

    ``mod`` is an IRModule the pass has already checked (``_pass._check_module``).
    """
    walk = Walk([], [], {})
    for gvar, func in sorted(mod.functions.items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, relax.Function):
            continue
        name = gvar.name_hint
        walk.functions[name] = (gvar, func)
        _walk_function(mod, name, func, walk)
    return walk


def _walk_function(mod: tvm.IRModule, name: str, func: relax.Function, out: Walk) -> None:
    if not isinstance(func.body, relax.SeqExpr):
        raise PreconditionError(
            f"function {name}: body is a {type(func.body).__name__}, not a SeqExpr; "
            "hint: run relax.transform.Normalize() first"
        )
    env: _Scope = {_compat.handle(param): _OPAQUE for param in func.params[:]}
    _walk_seq(mod, name, name, func.body, env, out)


def _walk_seq(
    mod: tvm.IRModule,
    name: str,
    scope: str,
    seq: relax.SeqExpr,
    env: _Scope,
    out: Walk,
) -> None:
    """Describe the bindings of ``seq``, recursing into If branches and nested functions.

    The stock pass visits those too; their bindings see the enclosing variables (``env`` is
    copied, so a branch's bindings do not leak out of it). ``name`` is the module-level function
    the rewrite changes; ``scope`` names the nested function in messages (``main/inner``).
    """
    for block in seq.blocks[:]:
        in_dataflow = isinstance(block, relax.DataflowBlock)
        for binding in block.bindings[:]:
            var = binding.var
            key = _compat.handle(var)
            label = _compat.var_name(var)
            if isinstance(binding, relax.MatchCast):
                _mark_escaping(binding.value, env, out)
                env[key] = _OPAQUE
                continue
            value = binding.value
            # the arguments, read once (each read of a tvm_ffi Array element is an FFI call)
            args = value.args[:] if isinstance(value, relax.Call) else []
            _check_annotation(scope, label, value, args)
            _check_normalized(scope, label, value, args)
            if _compat.is_constant(value):
                env[key] = _Env(_Bound.CONSTANT, value=value)
            elif isinstance(value, relax.Var):
                env[key] = env.get(_compat.handle(value), _OPAQUE)
            elif isinstance(value, relax.ShapeExpr):
                env[key] = _Env(_Bound.SHAPE, value=value)
            elif isinstance(value, relax.Call):
                node_id = len(out.sites)
                site = _walk_call(
                    mod, name, scope, var, value, args, in_dataflow, env, node_id, out
                )
                out.sites.append(site)
                env[key] = _Env(_Bound.NODE, node=node_id)
            else:
                _mark_escaping(value, env, out)
                if isinstance(value, relax.If):
                    for branch in (value.true_branch, value.false_branch):
                        if isinstance(branch, relax.SeqExpr):
                            _walk_seq(mod, name, scope, branch, dict(env), out)
                elif isinstance(value, relax.Function) and isinstance(value.body, relax.SeqExpr):
                    inner = dict(env)
                    inner.update({_compat.handle(p): _OPAQUE for p in value.params[:]})
                    _walk_seq(mod, name, f"{scope}/{label}", value.body, inner, out)
                env[key] = _OPAQUE
    _mark_escaping(seq.body, env, out)


def _mark_escaping(expr: relax.Expr, env: _Scope, out: Walk) -> None:
    """Record the nodes whose variables ``expr`` uses (see ``Translation.escaping``)."""
    for var in [expr] if isinstance(expr, relax.Var) else relax.analysis.free_vars(expr):
        bound = env.get(_compat.handle(var))
        if bound is not None and bound.node is not None:
            out.escaping.add(bound.node)


def _check_annotation(scope: str, label: str, value: relax.Expr, args: List[relax.Expr]) -> None:
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


def _check_normalized(scope: str, label: str, value: relax.Expr, args: List[relax.Expr]) -> None:
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


def _walk_call(
    mod: tvm.IRModule,
    function: str,
    scope: str,
    var: relax.Var,
    call: relax.Call,
    args: List[relax.Expr],
    in_dataflow: bool,
    env: _Scope,
    node_id: int,
    out: Walk,
) -> CallSite:
    label = _compat.var_name(var)
    op = call.op
    op_name = op.name if isinstance(op, tvm.ir.Op) else ""
    kind = SiteKind.OTHER
    leaves = _Leaves()
    template_args: List[object] = []
    unfoldable: Optional[Reason] = None
    detail = ""
    annotation = Annotation.NONE

    if not op_name:
        unfoldable, detail = (
            Reason.UNSUPPORTED,
            f"call to {op} is not an operator; only operators and call_tir fold",
        )
        display = _callee_name(op)
        if isinstance(op, relax.Var):
            _mark_escaping(op, env, out)  # a closure computed by a call
        for arg in args:
            _add_leaf(arg, env, leaves)
    elif op_name == CALL_TIR_OP:
        display = op_name
        kind = SiteKind.CALL_TIR
        unfoldable, detail = _check_call_tir(mod, call)
        fields = args[1].fields[:] if isinstance(args[1], relax.Tuple) else [args[1]]
        template_args = [_add_leaf(arg, env, leaves) for arg in fields]
        if len(args) > 2:
            unfoldable = unfoldable or Reason.DYNAMIC_SHAPE
            detail = detail or "call_tir passes symbolic shape values (tir_vars)"
    else:
        display = op_name
        if op_name in (FOLD_BARRIER_OP, FOLD_ALLOW_OP):
            annotation = Annotation.BARRIER if op_name == FOLD_BARRIER_OP else Annotation.ALLOW
            kind = SiteKind.BARRIER if annotation is Annotation.BARRIER else SiteKind.ALLOW
        else:
            kind = SiteKind.OP
            if op_name == TENSOR_TO_SHAPE_OP:
                kind = SiteKind.TENSOR_TO_SHAPE
                arg_ty = _compat.type_of(args[0])
                if (
                    not isinstance(arg_ty, _compat.TensorType)
                    or _compat.dtype_of(arg_ty) != "int64"
                ):
                    unfoldable, detail = (
                        Reason.UNSUPPORTED,
                        "tensor_to_shape folds only from an int64 tensor",
                    )
            elif not out.op_traits(op_name, op).legalizes:
                kind = SiteKind.OTHER
                unfoldable, detail = (
                    Reason.UNSUPPORTED,
                    f"{op_name} has no FLegalize, so it has no TIR kernel to evaluate",
                )
            elif out.op_traits(op_name, op).impure:
                kind = SiteKind.OTHER
                unfoldable, detail = Reason.IMPURE, f"{op_name} is impure"
        template_args = [_add_leaf(arg, env, leaves) for arg in args]

    outputs = _output_infos(_compat.type_of(call))
    if unfoldable is None and kind in (SiteKind.OP, SiteKind.CALL_TIR):
        if any(not info.is_static for info in outputs if info.dtype != "shape"):
            unfoldable, detail = (
                Reason.DYNAMIC_SHAPE,
                f"result type {_compat.type_of(call)} has symbolic dims",
            )

    default_fold, default_rule = default_decision(
        is_operator=kind in (SiteKind.OP, SiteKind.TENSOR_TO_SHAPE),
        is_call_tir=kind is SiteKind.CALL_TIR,
        in_dataflow=in_dataflow,
        call=call,
    )
    out.escaping.update(leaves.escaping)
    out.facts.append(
        _Facts(
            display,
            label,
            scope,
            tuple(leaves.inputs),
            outputs,
            _attrs_of(call),
            annotation,
            unfoldable,
            detail,
            default_fold,
            default_rule,
        )
    )
    return CallSite(
        node_id,
        function,
        call,
        kind,
        var,
        in_dataflow,
        tuple(leaves.leaves),
        tuple(leaves.constants),
        tuple(template_args),
        tuple(leaves.zero_size),
    )


def _add_leaf(arg: relax.Expr, env: _Scope, out: _Leaves) -> object:
    """Record ``arg``'s tensors as node inputs; return its template form.

    The template form is a leaf index for a tensor, a tuple of template forms for an inline
    tuple, a StaticShapeVar for a shape variable whose type gives its values, and the expression
    itself for a static argument (a ShapeExpr, also one substituted for a variable bound to it as
    the stock pass does, a PrimValue, a StringImm, a DataTypeImm).
    """
    if isinstance(arg, relax.Tuple):
        return tuple(_add_leaf(field_, env, out) for field_ in arg.fields[:])
    bound = env.get(_compat.handle(arg), _OPAQUE) if isinstance(arg, relax.Var) else None
    if bound is not None and bound.kind is _Bound.SHAPE:
        return bound.value
    ty = _compat.type_of(arg)
    is_tensor = isinstance(ty, _compat.TensorType)
    if bound is not None and not is_tensor and _is_static_shape_var(arg):
        return StaticShapeVar(arg)
    if bound is None and not is_tensor:
        return arg
    index = len(out.leaves)
    out.leaves.append(arg)
    tensor = _tensor_info(ty) if is_tensor else None
    constant = None
    if _compat.is_constant(arg):
        constant = arg
        out.inputs.append(NodeInput(InputKind.CONSTANT, "const", tensor))
    elif bound is None:
        out.inputs.append(NodeInput(InputKind.RUNTIME, type(arg).__name__, tensor))  # not in ANF
    elif bound.kind is _Bound.CONSTANT and is_tensor:
        constant = bound.value
        out.inputs.append(NodeInput(InputKind.CONSTANT, _compat.var_name(arg), tensor))
    elif bound.kind is _Bound.NODE and is_tensor:
        out.inputs.append(NodeInput(InputKind.NODE, _compat.var_name(arg), tensor, bound.node))
    else:
        if bound.node is not None:  # a tuple-typed call result, read whole
            out.escaping.append(bound.node)
        # parameters, and (as in the stock pass) variables bound to tuples or shapes
        out.inputs.append(NodeInput(InputKind.RUNTIME, _compat.var_name(arg), tensor))
        shape = tensor.shape if tensor is not None else None
        if shape is not None and None not in shape and 0 in shape:
            # A zero-size tensor has one possible value, the empty one. Stock folds a call on it
            # when the call's legalized kernel does not read it (``sum`` over a zero-size axis
            # legalizes to ``full(0)``); the kernels tell (``PlanningFacts.unread_zero_size``).
            out.zero_size.append(index)
            constant = relax.const(np.zeros(tuple(int(d or 0) for d in shape), tensor.dtype))  # type: ignore[union-attr]
    out.constants.append(constant)
    return index


def _callee_name(callee: relax.Expr) -> str:
    if isinstance(callee, tvm.ir.GlobalVar):
        return callee.name_hint
    if isinstance(callee, relax.Var):
        return _compat.var_name(callee)
    return type(callee).__name__


def _check_call_tir(mod: tvm.IRModule, call: relax.Call) -> Tuple[Optional[Reason], str]:
    callee = call.args[0]
    if not isinstance(callee, tvm.ir.GlobalVar) or callee not in mod.functions:
        return Reason.UNSUPPORTED, f"call_tir target {callee} is not a function of the module"
    if not isinstance(mod[callee], tvm.tirx.PrimFunc):
        return Reason.UNSUPPORTED, f"call_tir target {callee.name_hint} is not a PrimFunc"
    return None, ""


def _tensor_info(ty) -> TensorInfo:
    # a call's result type is also the type of its variable, read again by every consumer
    return _compat.remembered(ty, "tensor_info", _read_tensor_info)


def _read_tensor_info(ty) -> TensorInfo:
    return TensorInfo.of(_compat.dtype_of(ty), _compat.static_shape(ty))


def _output_infos(ty) -> Tuple[TensorInfo, ...]:
    return tuple(
        _tensor_info(leaf)
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
            self._values = _read_attrs(self._attrs)
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


def _attrs_of(call: relax.Call) -> Mapping[str, object]:
    attrs = call.attrs
    return {} if attrs is None else _CallAttrs(attrs)


def _read_attrs(attrs: tvm.ir.Attrs) -> Dict[str, object]:
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
