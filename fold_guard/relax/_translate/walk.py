"""Translation, first half: a Relax IRModule read into call sites, then into FoldGraph nodes.

The adapter models the stock ``relax.transform.FoldConstant`` (``src/relax/transform/
fold_constant.cc``) closely, because under the ``default`` policy our output must be structurally
equal to its output (its rules are stated in :mod:`fold_guard.relax._stock`). An input is
constant when it is a literal constant, or a variable bound to one (also through aliases), or the
output of a call that folds; variables bound to tuples, tuple items or match casts are not
constant, as in the stock pass.

Translation is two steps, because some facts of a node are only known once its call is
legalized (whether it has a kernel, whether stock folds what the legalizer returns, which
zero-size operands the kernel reads): :func:`walk_relax` describes every call binding, :mod:`.legalize`
legalizes the calls :meth:`Walk.candidates` names, and :meth:`Walk.translate` then builds every
:class:`FoldNode` once, with those :class:`~fold_guard.relax._sites.PlanningFacts`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import AbstractSet, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple

import tvm
from tvm import relax

from ..._core.errors import PreconditionError
from ..._core.graph import (
    Annotation,
    FoldNode,
    NodeInput,
    TensorInfo,
    reachable_from_constants,
)
from ..._core.reasons import Reason
from .. import _compat
from .._ops import FOLD_ALLOW_OP, FOLD_BARRIER_OP
from .._sites import CallSite, PlanningFacts, SiteKind, Translation
from .._stock import (
    CALL_TIR_OP,
    TENSOR_TO_SHAPE_OP,
    default_decision,
    lift_rule,
    not_legalized_rule,
    weight_dims,
    weight_parameter_start,
)
from .leaves import OPAQUE, WEIGHT, Bound, Env, Leaves, Scope, add_leaf, bound_item
from .read import (
    KERNEL_CALL_OPS,
    attrs_of,
    callee_of,
    check_annotation,
    check_call_tir,
    check_normalized,
    output_infos,
)

__all__ = ["Walk", "walk_relax"]


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
    lift_rule: str
    callee: str = ""
    op_pattern: Optional[int] = None


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

    def candidates(
        self, unread: Mapping[int, AbstractSet[int]] = MappingProxyType({})
    ) -> FrozenSet[int]:
        """The calls that could fold if everything upstream did: the ones worth legalizing.

        Reachability from constants as the planner sees it
        (:func:`~fold_guard._core.graph.reachable_from_constants`: a barrier's output is not
        constant), where a zero-size run-time tensor counts as constant (it has one possible
        value), so does a leaf in ``unread`` (per node, the leaves :mod:`.reads` found its kernel
        does not read), and the output of a call fold_guard cannot evaluate at all does not.
        """
        opaque = {site.node_id for site in self.sites if site.kind is SiteKind.OTHER}
        nodes = [
            (
                tuple(
                    dataclasses.replace(inp, reads_value=False)
                    if i in site.zero_size_leaves or i in unread.get(site.node_id, ())
                    else inp
                    for i, inp in enumerate(facts.inputs)
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
    if unfoldable is None and node_id in legalized.unwritten:
        unfoldable, detail = Reason.UNWRITTEN_MEMORY, legalized.unwritten[node_id]
    inputs = facts.inputs
    unread = legalized.unread.get(node_id, ())
    if unread:  # the kernel reads only their static types (the planner keeps a barrier's)
        inputs = tuple(
            dataclasses.replace(inp, reads_value=False) if i in unread else inp
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
        lift_rule=facts.lift_rule,
        lowered=bool(facts.callee) or site.kind is SiteKind.CALL_TIR,
        callee=facts.callee,
        op_pattern=facts.op_pattern,
    )


def walk_relax(mod: tvm.IRModule) -> Walk:
    """Walk every Relax function of ``mod`` and describe each call binding.

    ``mod`` is an IRModule the pass has already checked (:func:`.read.check_relax_module`).
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
    params = func.params[:]
    start = weight_parameter_start(name, func.attrs)
    env: Scope = {
        _compat.handle(param): WEIGHT if start is not None and index >= start else OPAQUE
        for index, param in enumerate(params)
    }
    dims = weight_dims(func, start) if start is not None else frozenset()
    _walk_seq(mod, name, name, func.body, env, out, dims)


def _walk_seq(
    mod: tvm.IRModule,
    name: str,
    scope: str,
    seq: relax.SeqExpr,
    env: Scope,
    out: Walk,
    dims: FrozenSet[int] = frozenset(),
) -> None:
    """Describe the bindings of ``seq``, recursing into If branches and nested functions.

    The stock pass visits those too; their bindings see the enclosing variables (``env`` is
    copied, so a branch's bindings do not leak out of it). ``name`` is the module-level function
    the rewrite changes; ``scope`` names the nested function in messages (``main/inner``).
    ``dims`` are the symbolic variables the weight parameters define (``_stock.weight_dims``).
    """
    for block in seq.blocks[:]:
        in_dataflow = isinstance(block, relax.DataflowBlock)
        for binding in block.bindings[:]:
            var = binding.var
            key = _compat.handle(var)
            label = _compat.var_name(var)
            if isinstance(binding, relax.MatchCast):
                _mark_escaping(binding.value, env, out)
                env[key] = OPAQUE
                continue
            value = binding.value
            # the arguments, read once (each read of a tvm_ffi Array element is an FFI call)
            args = value.args[:] if isinstance(value, relax.Call) else []
            check_annotation(scope, label, value, args)
            check_normalized(scope, label, value, args)
            if _compat.is_constant(value):
                env[key] = Env(Bound.CONSTANT, value=value)
            elif isinstance(value, relax.Var):
                env[key] = env.get(_compat.handle(value), OPAQUE)
            elif isinstance(value, relax.ShapeExpr):
                env[key] = Env(Bound.SHAPE, value=value)
            elif isinstance(value, relax.Call):
                node_id = len(out.sites)
                site = _walk_call(
                    mod, name, scope, var, value, args, in_dataflow, env, node_id, out, dims
                )
                out.sites.append(site)
                env[key] = Env(Bound.NODE, node=node_id)
            else:
                _mark_escaping(value, env, out)
                env[key] = bound_item(value, env)
                if isinstance(value, relax.If):
                    for branch in (value.true_branch, value.false_branch):
                        if isinstance(branch, relax.SeqExpr):
                            _walk_seq(mod, name, scope, branch, dict(env), out, dims)
                elif isinstance(value, relax.Function) and isinstance(value.body, relax.SeqExpr):
                    inner = dict(env)
                    inner.update({_compat.handle(p): OPAQUE for p in value.params[:]})
                    _walk_seq(mod, name, f"{scope}/{label}", value.body, inner, out)
    if not _compat.has_type(seq.body):
        # a function built without a BlockBuilder (relax.Function(params, call)): TVM's
        # normalizer would write the types it infers into the caller's nodes
        result_args = seq.body.args[:] if isinstance(seq.body, relax.Call) else []
        check_normalized(scope, "its result", seq.body, result_args)
    _mark_escaping(seq.body, env, out)


def _mark_escaping(expr: relax.Expr, env: Scope, out: Walk) -> None:
    """Record the nodes whose variables ``expr`` uses (see ``Translation.escaping``)."""
    for var in [expr] if isinstance(expr, relax.Var) else relax.analysis.free_vars(expr):
        bound = env.get(_compat.handle(var))
        if bound is not None and bound.node is not None:
            out.escaping.add(bound.node)


def _walk_call(
    mod: tvm.IRModule,
    function: str,
    scope: str,
    var: relax.Var,
    call: relax.Call,
    args: List[relax.Expr],
    in_dataflow: bool,
    env: Scope,
    node_id: int,
    out: Walk,
    dims: FrozenSet[int] = frozenset(),
) -> CallSite:
    label = _compat.var_name(var)
    op = call.op
    op_name = op.name if isinstance(op, tvm.ir.Op) else ""
    kind = SiteKind.OTHER
    leaves = Leaves()
    template_args: List[object] = []
    unfoldable: Optional[Reason] = None
    detail = ""
    annotation = Annotation.NONE
    callee, op_pattern = callee_of(mod, call) if op_name in KERNEL_CALL_OPS else ("", None)

    if not op_name:
        unfoldable, detail = (
            Reason.UNSUPPORTED,
            f"call to {op} is not an operator; only operators and call_tir fold",
        )
        display = _callee_name(op)
        if isinstance(op, relax.Var):
            _mark_escaping(op, env, out)  # a closure computed by a call
        for arg in args:
            add_leaf(arg, env, leaves)
    elif op_name == CALL_TIR_OP:
        display = op_name
        kind = SiteKind.CALL_TIR
        unfoldable, detail = check_call_tir(mod, call)
        fields = args[1].fields[:] if isinstance(args[1], relax.Tuple) else [args[1]]
        template_args = [add_leaf(arg, env, leaves) for arg in fields]
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
        template_args = [add_leaf(arg, env, leaves) for arg in args]

    outputs = output_infos(_compat.type_of(call))
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
            attrs_of(call),
            annotation,
            unfoldable,
            detail,
            default_fold,
            default_rule,
            lift_rule(
                op_name=op_name, in_dataflow=in_dataflow, ty=_compat.type_of(var), weight_dims=dims
            ),
            callee,
            op_pattern,
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


def _callee_name(callee: relax.Expr) -> str:
    if isinstance(callee, tvm.ir.GlobalVar):
        return callee.name_hint
    if isinstance(callee, relax.Var):
        return _compat.var_name(callee)
    return type(callee).__name__
