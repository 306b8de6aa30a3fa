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

Each binding is checked where the walk meets it (a well-formed annotation, a normalized body);
what a call reads and is (operands, result types, callee, attributes) is read by :mod:`.leaves`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import AbstractSet, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Set, Tuple

import tvm
from tvm import relax

from ..._core.errors import PreconditionError, UnsupportedIRError
from ..._core.graph import Annotation, FoldNode, NodeInput, TensorInfo, reachable_from_constants
from ..._core.reasons import Reason
from .. import _compat
from .._ops import FOLD_ALLOW_OP, FOLD_BARRIER_OP, non_tensor_operand_error
from .._sites import CallSite, PlanningFacts, SiteKind, Translation
from .._stock import (
    StockDecision,
    lift_rule,
    not_legalized_rule,
    stock_rules,
    weight_dims,
    weight_parameter_start,
)
from .leaves import (
    KERNEL_CALL_OPS,
    OPAQUE,
    WEIGHT,
    Bound,
    Env,
    Leaves,
    Scope,
    add_leaf,
    attrs_of,
    bound_item,
    callee_name,
    callee_of,
    output_infos,
)

__all__ = ["Walk", "walk_relax"]

#: The annotation ops, and how a site of each is evaluated (fold_guard's, not stock's).
_ANNOTATIONS = {FOLD_BARRIER_OP: Annotation.BARRIER, FOLD_ALLOW_OP: Annotation.ALLOW}
_ANNOTATION_KINDS = {Annotation.BARRIER: SiteKind.BARRIER, Annotation.ALLOW: SiteKind.ALLOW}


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
    stock: StockDecision
    lift_rule: str
    callee: str = ""
    op_pattern: Optional[int] = None


@dataclass
class Walk:
    """Every call binding of a module, described (:func:`walk_relax`); nodes come from :meth:`translate`."""

    sites: List[CallSite]
    facts: List[_Facts]
    functions: Dict[str, Tuple[tvm.ir.GlobalVar, relax.Function]]
    #: see Translation.escaping
    escaping: Set[int] = field(default_factory=set)
    #: per (op name, attribute), read once per walk (an attribute read is an FFI call that can
    #: return a function)
    _op_attrs: Dict[Tuple[str, str], object] = field(default_factory=dict, repr=False)

    def op_attr(self, op: tvm.ir.Op, key: str) -> object:
        """``op.get_attr(key)``, read once per walk."""
        name = (op.name, key)
        if name not in self._op_attrs:
            self._op_attrs[name] = op.get_attr(key)
        return self._op_attrs[name]

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
    unfoldable, detail = facts.stock.unfoldable, facts.stock.detail
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
    default_fold, default_rule = facts.stock.default_fold, facts.stock.default_rule
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

    ``mod`` is an IRModule the pass has already checked (``check_relax_module``).
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
    _walk_seq(_Place(mod, name, name, dims), func.body, env, out)


class _Place(NamedTuple):
    """Where a sequence of bindings is: ``function`` is the module-level function the rewrite
    changes, ``scope`` names a nested function in messages (``main/inner``), ``dims`` are the
    symbolic variables the weight parameters define (``_stock.weight_dims``)."""

    mod: tvm.IRModule
    function: str
    scope: str
    dims: FrozenSet[int] = frozenset()


def _walk_seq(place: _Place, seq: relax.SeqExpr, env: Scope, out: Walk) -> None:
    """Describe the bindings of ``seq``, recursing into If branches and nested functions.

    The stock pass visits those too; their bindings see the enclosing variables (``env`` is
    copied, so a branch's bindings do not leak out of it).
    """
    scope = place.scope
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
            _check_annotation(scope, label, value, args)
            _check_normalized(scope, label, value, args)
            if _compat.is_constant(value):
                env[key] = Env(Bound.CONSTANT, value=value)
            elif isinstance(value, relax.Var):
                env[key] = env.get(_compat.handle(value), OPAQUE)
            elif isinstance(value, relax.ShapeExpr):
                env[key] = Env(Bound.SHAPE, value=value)
            elif isinstance(value, relax.Call):
                site = _walk_call(place, var, value, args, in_dataflow, env, out)
                out.sites.append(site)
                env[key] = Env(Bound.NODE, node=site.node_id)
            else:
                _mark_escaping(value, env, out)
                env[key] = bound_item(value, env)
                if isinstance(value, relax.If):
                    for branch in (value.true_branch, value.false_branch):
                        if isinstance(branch, relax.SeqExpr):
                            _walk_seq(place, branch, dict(env), out)
                elif isinstance(value, relax.Function) and isinstance(value.body, relax.SeqExpr):
                    inner = dict(env)
                    inner.update({_compat.handle(p): OPAQUE for p in value.params[:]})
                    nested = _Place(place.mod, place.function, f"{scope}/{label}")
                    _walk_seq(nested, value.body, inner, out)
    if not _compat.has_type(seq.body):
        # a function built without a BlockBuilder (relax.Function(params, call)): TVM's
        # normalizer would write the types it infers into the caller's nodes
        result_args = seq.body.args[:] if isinstance(seq.body, relax.Call) else []
        _check_normalized(scope, "its result", seq.body, result_args)
    _mark_escaping(seq.body, env, out)


def _mark_escaping(expr: relax.Expr, env: Scope, out: Walk) -> None:
    """Record the nodes whose variables ``expr`` uses (see ``Translation.escaping``)."""
    for var in [expr] if isinstance(expr, relax.Var) else relax.analysis.free_vars(expr):
        bound = env.get(_compat.handle(var))
        if bound is not None and bound.node is not None:
            out.escaping.add(bound.node)


def _walk_call(
    place: _Place,
    var: relax.Var,
    call: relax.Call,
    args: List[relax.Expr],
    in_dataflow: bool,
    env: Scope,
    out: Walk,
) -> CallSite:
    """Collect what one call binding reads; stock's rules (``_stock.stock_rules``) decide the rest."""
    mod = place.mod
    op = call.op
    op_name = op.name if isinstance(op, tvm.ir.Op) else ""
    outputs = output_infos(_compat.type_of(call))
    annotation = _ANNOTATIONS.get(op_name, Annotation.NONE)
    if annotation is Annotation.NONE:
        stock = stock_rules(
            call, mod=mod, in_dataflow=in_dataflow, outputs=outputs, op_attr=out.op_attr
        )
    else:  # ours, not stock's: the planner decides them first (RFC.md, Decisions, rows 1 and 5)
        stock = StockDecision(_ANNOTATION_KINDS[annotation])
    leaves = Leaves()
    template_args: List[object] = []
    if stock.kind is SiteKind.CALL_TIR:
        fields = args[1].fields[:] if isinstance(args[1], relax.Tuple) else [args[1]]
        template_args = [add_leaf(arg, env, leaves) for arg in fields]
    elif op_name:
        template_args = [add_leaf(arg, env, leaves) for arg in args]
    else:
        if isinstance(op, relax.Var):
            _mark_escaping(op, env, out)  # a closure computed by a call
        for arg in args:
            add_leaf(arg, env, leaves)
    callee, op_pattern = callee_of(mod, call) if op_name in KERNEL_CALL_OPS else ("", None)
    label = _compat.var_name(var)
    out.escaping.update(leaves.escaping)
    out.facts.append(
        _Facts(
            op_name or callee_name(op),
            label,
            place.scope,
            tuple(leaves.inputs),
            outputs,
            attrs_of(call),
            annotation,
            stock,
            lift_rule(
                op_name=op_name,
                in_dataflow=in_dataflow,
                ty=_compat.type_of(var),
                weight_dims=place.dims,
            ),
            callee,
            op_pattern,
        )
    )
    return CallSite(
        len(out.sites),
        place.function,
        call,
        stock.kind,
        var,
        in_dataflow,
        tuple(leaves.leaves),
        tuple(leaves.constants),
        tuple(template_args),
        tuple(leaves.zero_size),
    )


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
