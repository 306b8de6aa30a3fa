"""Translation, second half: legalize every call that could fold, once per op signature.

Stock ``FoldConstant`` legalizes, builds and runs each call on its own. Here calls are grouped by
*op signature*: the operator, its attributes, its static arguments, and for each tensor argument
its dtype and, per dim, whether it is 0, 1 or larger (size-1 dims broadcast, so they must not
hide behind a symbolic dim). A group whose members all share one shape gets a static kernel; a
group of a shape-generic op (``_shape_generic``: elementwise ops, Q/DQ, broadcasts and
transposes) whose members differ in shape gets one kernel over symbolic shapes, which serves
every member whose result shape it reproduces; everything else gets one static kernel per
distinct shape. All requests go through one ``LegalizeOps``.

What comes out is :class:`Legalization`: a :class:`~fold_guard.relax._sites.KernelSpec` per call
that has a kernel, and the :class:`~fold_guard.relax._sites.PlanningFacts` the planner needs.
Both are made here on every run, from the module and TVM's legalizers alone: no cache takes
part, so nothing on disk can change a plan. How a kernel is then built and run is the engine's
business (``_engine``).

Tensor arguments are always passed as buffers (never inlined as immediates), so a kernel does not
depend on the values of scalar constants such as per-tensor scales. Whether the stock pass would
fold a call is still decided on the call as the stock pass sees it: scalar constants are given to
the legalizer as constants, because some legalizers (``astype``) then return a constant instead of
a TIR call, and the stock pass does not fold those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from . import _compat
from ._shape_generic import SHAPE_GENERIC_OPS, is_shape_generic
from ._sites import CallSite, KernelSpec, PlanningFacts, SiteKind, StaticShapeVar
from ._stock import legalized_call_tir, needs_scalar_decision, not_legalized_rule

__all__ = [
    "SHAPE_GENERIC_OPS",
    "Legalization",
    "legalize_candidates",
    "legalize_each",
    "stock_legalization_error",
]


@dataclass(frozen=True)
class Legalization:
    """What legalizing a module's candidate calls gave: kernels, and the facts the planner needs.

    ``pending_scalars``: per call whose stock decision reads a 0-d operand folded earlier in the
    same pass, the indices of those leaves. Their values are not known when legalizing, so the
    decision is checked again on them once they are (:func:`stock_legalization_error`).
    """

    kernels: Dict[int, KernelSpec]
    facts: PlanningFacts
    pending_scalars: Dict[int, Tuple[int, ...]] = field(default_factory=dict)


def _leaf_type(site: CallSite, index: int) -> relax.TensorType:
    return _compat.type_of(site.leaves[index])


def _dim_class(dim: Optional[int]) -> str:
    # Size-1 (broadcast) and size-0 dims change what a kernel computes, so they are part of the
    # signature: a symbolic dim never stands for them.
    return "1" if dim == 1 else "0" if dim == 0 else "n"


def _signature(site: CallSite) -> Tuple:
    leaves = tuple(
        (
            _compat.dtype_of(_leaf_type(site, i)),
            tuple(_dim_class(dim) for dim in _compat.static_shape(_leaf_type(site, i)) or ()),
        )
        for i in range(len(site.leaves))
    )
    static_args = tuple(_static_key(arg) for arg in site.template_args)
    attrs = tvm_ffi.structural_hash(site.call.attrs) if site.call.attrs is not None else 0
    return (site.call.op.name, attrs, leaves, static_args)


def _static_key(arg: object) -> object:
    if isinstance(arg, int):
        return ("leaf",)
    if isinstance(arg, StaticShapeVar):
        return ("shape_var", arg.values)
    if isinstance(arg, tuple):
        return tuple(_static_key(a) for a in arg)
    return ("static", tvm_ffi.structural_hash(arg))


def _shapes(site: CallSite) -> Tuple:
    return tuple(_compat.static_shape(_leaf_type(site, i)) for i in range(len(site.leaves)))


@dataclass
class _Request:
    """One function to legalize: a representative call over placeholder parameters."""

    name: str
    members: List[CallSite]
    params: List[Optional[relax.Var]]
    symbolic: bool
    for_decision: bool = False
    #: each symbolic dim var, with its value for every member (in member order)
    dim_values: Dict[tvm.tirx.Var, Tuple[int, ...]] = field(default_factory=dict)


def _dims_for(
    members: List[CallSite], symbolic: bool
) -> Tuple[List[List[object]], Dict[tvm.tirx.Var, Tuple[int, ...]]]:
    """Per leaf, its dims: an int where every member agrees, else a shared symbolic var.

    Two positions whose values agree across all members get the same var, so constraints such
    as "scale has as many elements as the quantized axis" still type-check.
    """
    per_member = [_shapes(site) for site in members]
    first = per_member[0]
    shared: Dict[Tuple, tvm.tirx.Var] = {}
    dims: List[List[object]] = []
    for i, shape in enumerate(first):
        leaf_dims: List[object] = []
        for k in range(len(shape or ())):
            column = tuple(shapes[i][k] for shapes in per_member)
            if not symbolic or len(set(column)) == 1:
                leaf_dims.append(column[0])
            else:
                if column not in shared:
                    shared[column] = tvm.tirx.Var(f"n{len(shared)}", "int64")
                leaf_dims.append(shared[column])
        dims.append(leaf_dims)
    return dims, {var: column for column, var in shared.items()}


def _make_request(
    name: str,
    members: List[CallSite],
    *,
    symbolic: bool,
    scalars_as_constants: bool,
    scalars: Optional[Mapping[int, np.ndarray]] = None,
) -> Tuple[relax.Function, _Request]:
    site = members[0]
    params: List[Optional[relax.Var]] = []
    leaf_exprs: List[relax.Expr] = []
    dims, dim_values = _dims_for(members, symbolic)
    for i, leaf_dims in enumerate(dims):
        dtype = _compat.dtype_of(_leaf_type(site, i))
        if scalars_as_constants and not leaf_dims:
            leaf_exprs.append(_scalar_constant(site, i, dtype, scalars or {}))
            params.append(None)
            continue
        var = relax.Var(f"p{i}", relax.TensorType(leaf_dims, dtype))
        params.append(var)
        leaf_exprs.append(var)

    # Shape variables known from their type become parameters too, but not operands: a kernel
    # that reads one at run time cannot be used (it is rejected when read back).
    shape_params: List[relax.Var] = []

    def rebuild(arg: object) -> relax.Expr:
        if isinstance(arg, int):
            return leaf_exprs[arg]
        if isinstance(arg, tuple):
            return relax.Tuple([rebuild(a) for a in arg])
        if isinstance(arg, StaticShapeVar):
            shape_params.append(relax.Var(f"s{len(shape_params)}", _compat.type_of(arg.var)))
            return shape_params[-1]
        return arg  # type: ignore[return-value]

    call = relax.Call(
        site.call.op, [rebuild(a) for a in site.template_args], site.call.attrs, site.call.ty_args
    )
    bb = relax.BlockBuilder()
    with bb.function(name, [p for p in params if p is not None] + shape_params, private=True):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    request = _Request(name, members, params, symbolic, scalars_as_constants, dim_values)
    return bb.get()[name], request


def _scalar_constant(
    site: CallSite, index: int, dtype: str, scalars: Mapping[int, np.ndarray]
) -> relax.Expr:
    """The constant a 0-d leaf is shown to the legalizer as, the way the stock pass shows it.

    A literal constant is itself; a value folded earlier in this pass (``scalars``) is that
    value. A scalar still pending (folded in this pass, not yet evaluated) stands in as one:
    legalizers look at the value only to reject it (a division's simplifier raises "Divide by
    zero" on a zero divisor), and one is a value none rejects. Such a call's decision is made
    again on its real value once that is known (:func:`pending_scalars`,
    :func:`stock_legalization_error`).
    """
    if index in scalars:
        return relax.const(scalars[index], dtype)
    constant = site.leaf_constants[index]
    if constant is not None:
        return constant
    return relax.const(np.ones((), dtype), dtype)


def _legalize(
    functions: Dict[str, relax.Function],
) -> Tuple[Dict[str, tvm.IRModule], Dict[str, str]]:
    """LegalizeOps over all request functions at once; on failure, one by one to isolate it.

    Returns, per request name, the legalized module that holds it (the batch, or the request's
    own module), and per failed request why. The modules of the one-by-one fallback stay apart:
    each names its PrimFuncs on its own (two may both define ``tir_exp``), and its ``call_tir``
    refers to its own ``GlobalVar`` objects, which a merged module would not define.
    """
    errors: Dict[str, str] = {}
    try:
        batch = relax.transform.LegalizeOps()(tvm.IRModule(functions))
        return dict.fromkeys(functions, batch), errors
    except Exception:  # noqa: BLE001 - a legalizer raising anything: isolate it below
        pass
    modules: Dict[str, tvm.IRModule] = {}
    for name, func in functions.items():
        try:
            modules[name] = relax.transform.LegalizeOps()(tvm.IRModule({name: func}))
        except Exception as err:  # noqa: BLE001 - recorded per request as "cannot evaluate"
            errors[name] = f"LegalizeOps failed: {err}".splitlines()[0]
    return modules, errors


def _split_by_output_shape(
    request: _Request, out_ty: object
) -> Tuple[List[CallSite], List[CallSite]]:
    """Members whose static result shape the symbolic kernel reproduces, and the others.

    A guard on top of the signature: if an op's result shape depends on its input dims in a way
    the symbolic legalization did not capture, that member gets a static kernel instead.
    """
    good: List[CallSite] = []
    bad: List[CallSite] = []
    kernel_types = _compat.flatten_types(out_ty)
    plain = _plain_dims(kernel_types)
    columns = {_compat.handle(var): column for var, column in request.dim_values.items()}
    for index, site in enumerate(request.members):
        expected = [
            _compat.static_shape(t) for t in _compat.flatten_types(_compat.type_of(site.call))
        ]
        if plain is not None and all(
            isinstance(d, int) or d[1] in columns for dims in plain for d in dims
        ):
            produced: List[Optional[Tuple[Optional[int], ...]]] = [
                tuple(d if isinstance(d, int) else columns[d[1]][index] for d in dims)
                for dims in plain
            ]
        else:
            values = {var: column[index] for var, column in request.dim_values.items()}
            produced = [_compat.static_shape_under(t, values) for t in kernel_types]
        (good if produced == expected else bad).append(site)
    return good, bad


def _plain_dims(types: Sequence[object]) -> Optional[List[Tuple[Any, ...]]]:
    """Per type, its dims: a size, or ``("var", handle)`` for a dim var; None for an expression.

    The common case of a symbolic kernel (its result has its operands' dims), read without
    binding an arithmetic analyzer per member.
    """
    result: List[Tuple[Any, ...]] = []
    for ty in types:
        values = getattr(getattr(ty, "shape", None), "values", None)
        if not isinstance(ty, _compat.TensorType) or values is None:
            return None
        dims: List[Any] = []
        for dim in values[:]:
            if isinstance(dim, tvm.tirx.IntImm):
                dims.append(int(dim.value))
            elif isinstance(dim, tvm.tirx.Var):
                dims.append(("var", _compat.handle(dim)))
            else:
                return None
        result.append(tuple(dims))
    return result


def _single_call_tir(mod: tvm.IRModule, request: _Request) -> Tuple[Optional[KernelSpec], str]:
    value, why = legalized_call_tir(mod[request.name])
    if value is None:
        return None, why
    prim_func = mod[value.args[0]]
    index_of = {param: i for i, param in enumerate(request.params) if param is not None}
    arg_map: List[object] = []
    for arg in value.args[1].fields:
        if isinstance(arg, relax.Var) and arg in index_of:
            arg_map.append(index_of[arg])
        elif _compat.is_constant(arg):
            arg_map.append(_compat.constant_array(arg))
        else:
            return (
                None,
                f"legalized call_tir takes {arg}, which is neither an operand nor a constant",
            )
    members = tuple(site.node_id for site in request.members)
    return KernelSpec(prim_func, tuple(arg_map), value.ty_args[0], members), ""


def _split_by_shape(members: Sequence[CallSite]) -> List[List[CallSite]]:
    by_shape: Dict[Tuple, List[CallSite]] = {}
    for site in members:
        by_shape.setdefault(_shapes(site), []).append(site)
    return list(by_shape.values())


def _static_requests(
    name: str, members: Sequence[CallSite]
) -> List[Tuple[relax.Function, _Request]]:
    return [
        _make_request(f"{name}_s{k}", part, symbolic=False, scalars_as_constants=False)
        for k, part in enumerate(_split_by_shape(members))
    ]


def _group_requests(name: str, members: List[CallSite]) -> List[Tuple[relax.Function, _Request]]:
    """The kernel request of one op-signature group, plus its decision request if it has scalars."""
    distinct_shapes = len({_shapes(site) for site in members})
    if distinct_shapes == 1:
        requests = [_make_request(name, members, symbolic=False, scalars_as_constants=False)]
    elif is_shape_generic(members[0]):
        try:
            requests = [_make_request(name, members, symbolic=True, scalars_as_constants=False)]
        except Exception:  # noqa: BLE001 - type inference rejected the symbolic dims
            requests = _static_requests(name, members)
    else:
        requests = _static_requests(name, members)
    if needs_scalar_decision(_shapes(members[0])):
        # One decision (on the first member's static shapes) serves the whole group.
        requests.append(
            _make_request(f"{name}_decision", members, symbolic=False, scalars_as_constants=True)
        )
    return requests


def _collect(
    requests: List[Tuple[relax.Function, _Request]],
    kernels: Dict[int, KernelSpec],
    facts: _MutableFacts,
) -> List[Tuple[relax.Function, _Request]]:
    """Legalize ``requests`` together and record their kernels; return the static retries."""
    legalized, errors = _legalize({request.name: func for func, request in requests})
    retries: List[Tuple[relax.Function, _Request]] = []
    for _, request in requests:
        kernel, why = None, errors.get(request.name, "LegalizeOps failed")
        if request.name in legalized:
            kernel, why = _single_call_tir(legalized[request.name], request)
        if request.for_decision:
            if kernel is None:
                facts.not_stock_foldable.update({site.node_id: why for site in request.members})
        elif kernel is not None:
            good, bad = (
                _split_by_output_shape(request, kernel.result_type)
                if request.symbolic
                else (request.members, [])
            )
            if bad:
                kernel = KernelSpec(
                    kernel.prim_func,
                    kernel.arg_map,
                    kernel.result_type,
                    tuple(site.node_id for site in good),
                )
            kernels.update({site.node_id: kernel for site in good})
            retries += _static_requests(f"{request.name}_o", bad)
        elif request.symbolic:
            retries += _static_requests(request.name, request.members)
        else:
            facts.unsupported.update({site.node_id: why for site in request.members})
    return retries


@dataclass
class _MutableFacts:
    unsupported: Dict[int, str] = field(default_factory=dict)
    not_stock_foldable: Dict[int, str] = field(default_factory=dict)


def legalize_candidates(
    mod: tvm.IRModule, sites: Sequence[CallSite], candidates: AbstractSet[int]
) -> Legalization:
    """A kernel for every site in ``candidates`` (those that could fold), legalizing once per op
    signature, and the planning facts legalization found."""
    kernels: Dict[int, KernelSpec] = {}
    facts = _MutableFacts()
    groups: Dict[Tuple, List[CallSite]] = {}
    for site in sites:
        if site.node_id not in candidates:
            continue
        if site.kind is SiteKind.CALL_TIR:
            kernels[site.node_id] = _module_kernel(mod, site)
        elif site.kind is SiteKind.OP:
            groups.setdefault(_signature(site), []).append(site)
    # Step 1. One request per group, symbolic where the members' shapes differ.
    requests = [
        req
        for index, members in enumerate(groups.values())
        for req in _group_requests(f"g{index}", members)
    ]
    # Step 2. One LegalizeOps over all of them; a symbolic request that does not give a single
    # TIR call is retried once per distinct shape (static requests are never retried).
    retries = _collect(requests, kernels, facts)
    if retries:
        _collect(retries, kernels, facts)
    # Step 3. Zero-size run-time leaves the kernel never reads do not stop a fold.
    unread_zero_size: Dict[int, Tuple[int, ...]] = {}
    for site in sites:
        kernel = kernels.get(site.node_id)
        if site.zero_size_leaves and kernel is not None:
            read = {a for a in kernel.arg_map if isinstance(a, int)}
            unread = tuple(i for i in site.zero_size_leaves if i not in read)
            if unread:
                unread_zero_size[site.node_id] = unread
    # Step 4. Calls whose decision read a stand-in for a scalar not yet evaluated.
    pending_scalars: Dict[int, Tuple[int, ...]] = {}
    for site in sites:
        if site.node_id in kernels and site.kind is SiteKind.OP:
            pending = _pending_scalar_leaves(site)
            if pending:
                pending_scalars[site.node_id] = pending
    return Legalization(
        kernels,
        PlanningFacts(facts.unsupported, facts.not_stock_foldable, unread_zero_size),
        pending_scalars,
    )


def _pending_scalar_leaves(site: CallSite) -> Tuple[int, ...]:
    return tuple(
        i
        for i, constant in enumerate(site.leaf_constants)
        if constant is None and _compat.static_shape(_leaf_type(site, i)) == ()
    )


def stock_legalization_error(site: CallSite, scalars: Mapping[int, np.ndarray]) -> Optional[str]:
    """Why the stock pass would not fold ``site`` with these 0-d operand values, or None.

    The stock pass legalizes a call with its scalar operands as constants, values included; this
    does the same with ``scalars`` (leaf index -> value, for the leaves that were still pending
    when the call was first legalized). Stock raises where ``LegalizeOps`` raises: the call is
    then kept with that error, as every call stock cannot evaluate.
    """
    func, request = _make_request(
        "check", [site], symbolic=False, scalars_as_constants=True, scalars=scalars
    )
    legalized, errors = _legalize({request.name: func})
    if request.name in errors:
        return f"{errors[request.name]}; stock raises"
    _, why = legalized_call_tir(legalized[request.name][request.name])
    return not_legalized_rule(site.op_name, why) if why else None


def legalize_each(mod: tvm.IRModule, sites: Sequence[CallSite]) -> Dict[int, KernelSpec]:
    """A static kernel of its own for every site (``call_tir`` sites: the module's PrimFunc).

    The reference engine's legalization: no grouping, no symbolic dims, one request per call.
    A site without a kernel is left out.
    """
    kernels: Dict[int, KernelSpec] = {}
    requests = []
    for index, site in enumerate(sites):
        if site.kind is SiteKind.CALL_TIR:
            kernels[site.node_id] = _module_kernel(mod, site)
        elif site.kind is SiteKind.OP:
            requests.append(
                _make_request(f"c{index}", [site], symbolic=False, scalars_as_constants=False)
            )
    _collect(requests, kernels, _MutableFacts())
    return kernels


def _module_kernel(mod: tvm.IRModule, site: CallSite) -> KernelSpec:
    prim_func = mod[site.call.args[0]]
    return KernelSpec(prim_func, tuple(range(len(site.leaves))), None, (site.node_id,))
