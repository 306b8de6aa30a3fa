"""Translation, second half: legalize every call that could fold, once per op signature.

Stock ``FoldConstant`` legalizes, builds and runs each call on its own. Here calls are grouped by
*op signature*: the operator, its attributes, its static arguments, and for each tensor argument
its dtype and, per dim, whether it is 0, 1 or larger (size-1 dims broadcast, so they must not
hide behind a symbolic dim). A group whose members all share one shape gets a static kernel; a
group of a shape-generic op (:mod:`.shape_generic`: elementwise ops, Q/DQ, broadcasts and
transposes) whose members differ in shape gets one kernel over symbolic shapes, which serves
every member whose result shape it reproduces; everything else gets one static kernel per
distinct shape. All requests go through one ``LegalizeOps``.

What comes out is :class:`Legalization`: a :class:`~fold_guard.relax._sites.KernelSpec` per call
that has a kernel, and the :class:`~fold_guard.relax._sites.PlanningFacts` the planner needs.
Both are made here on every run, from the module and TVM's legalizers alone: no cache takes
part, so nothing on disk can change a plan. How a kernel is then built and run is the engine's
business (``_engine``).

Tensor arguments are always passed as buffers (never inlined as immediates), so a kernel does not
depend on the values of scalar constants such as per-tensor scales. Stock's kernel has them as
immediates, which gives the same bits except for the few values TVM or LLVM compile in
(``_stock.value_shapes_kernel``); a call with such a value runs stock's own kernel (the engine's
``STOCK`` way). Whether the stock pass would fold a call is still decided on the call as the stock
pass sees it: scalar constants are given to the legalizer as constants, because some legalizers
(``astype``) then return a constant instead of a TIR call, and the stock pass does not fold those;
a value that can matter (a zero divisor) gets a decision of its own. Which kernels may leave output
unwritten is read here too (``fold_guard._tvm.unwritten``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, Hashable, List, Optional, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import relax

from ..._tvm.unwritten import (
    EMPTY_READ_DETAIL,
    EMPTY_REDUCTION_DETAIL,
    reads_empty_buffer,
    reduces_over_empty_axis,
)
from .. import _compat
from .._sites import CallSite, KernelSpec, PlanningFacts, SiteKind, StaticShapeVar
from .._stock import legalized_call_tir, needs_scalar_decision, scalar_value_key
from .requests import (
    Request,
    leaf_shapes,
    leaf_type,
    legalize_requests,
    make_request,
)
from .shape_generic import SHAPE_GENERIC_OPS, is_shape_generic

__all__ = [
    "SHAPE_GENERIC_OPS",
    "Legalization",
    "legalize_candidates",
    "unread_leaves",
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


def _dim_class(dim: Optional[int]) -> str:
    # Size-1 (broadcast) and size-0 dims change what a kernel computes, so they are part of the
    # signature: a symbolic dim never stands for them.
    return "1" if dim == 1 else "0" if dim == 0 else "n"


def _signature(site: CallSite) -> Tuple:
    leaves = tuple(
        (
            _compat.dtype_of(leaf_type(site, i)),
            tuple(_dim_class(dim) for dim in _compat.static_shape(leaf_type(site, i)) or ()),
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


def _split_by_output_shape(
    request: Request, out_ty: object
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


def _single_call_tir(mod: tvm.IRModule, request: Request) -> Tuple[Optional[KernelSpec], str]:
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
    return KernelSpec(prim_func, tuple(arg_map), _compat.call_tir_output_type(value), members), ""


def _split_by_shape(members: Sequence[CallSite]) -> List[List[CallSite]]:
    by_shape: Dict[Tuple, List[CallSite]] = {}
    for site in members:
        by_shape.setdefault(leaf_shapes(site), []).append(site)
    return list(by_shape.values())


def _static_requests(
    name: str, members: Sequence[CallSite]
) -> List[Tuple[relax.Function, Request]]:
    return [
        make_request(f"{name}_s{k}", part, symbolic=False, scalars_as_constants=False)
        for k, part in enumerate(_split_by_shape(members))
    ]


def _group_requests(name: str, members: List[CallSite]) -> List[Tuple[relax.Function, Request]]:
    """The kernel request of one op-signature group, plus its decision request if it has scalars."""
    distinct_shapes = len({leaf_shapes(site) for site in members})
    if distinct_shapes == 1:
        requests = [make_request(name, members, symbolic=False, scalars_as_constants=False)]
    elif is_shape_generic(members[0]):
        try:
            requests = [make_request(name, members, symbolic=True, scalars_as_constants=False)]
        except Exception:  # noqa: BLE001 - type inference rejected the symbolic dims
            requests = _static_requests(name, members)
    else:
        requests = _static_requests(name, members)
    if needs_scalar_decision(leaf_shapes(members[0])):
        # One decision (on the first member's static shapes) serves the members whose 0-d
        # constants the legalizer treats alike; a value that matters gets a decision of its own.
        by_value: Dict[Tuple[Hashable, ...], List[CallSite]] = {}
        for site in members:
            by_value.setdefault(_scalar_values(site), []).append(site)
        for k, part in enumerate(by_value.values()):
            requests.append(
                make_request(f"{name}_decision{k}", part, symbolic=False, scalars_as_constants=True)
            )
    return requests


def _scalar_values(site: CallSite) -> Tuple[Hashable, ...]:
    """The values of ``site``'s literal 0-d constants that stock's legalization can depend on."""
    values = [
        _compat.constant_array(constant).numpy()
        if constant is not None and _compat.static_shape(leaf_type(site, i)) == ()
        else None
        for i, constant in enumerate(site.leaf_constants)
    ]
    dtypes = [_compat.dtype_of(leaf_type(site, i)) for i in range(len(site.leaves))]
    return scalar_value_key(site.call, values, dtypes)


def _collect(
    requests: List[Tuple[relax.Function, Request]],
    kernels: Dict[int, KernelSpec],
    facts: _MutableFacts,
) -> List[Tuple[relax.Function, Request]]:
    """Legalize ``requests`` together and record their kernels; return the static retries."""
    legalized, errors = legalize_requests({request.name: func for func, request in requests})
    retries: List[Tuple[relax.Function, Request]] = []
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
    # Step 3. What each kernel makes of its call's leaves, their static shapes read once:
    unread: Dict[int, Tuple[int, ...]] = {}
    unwritten: Dict[int, str] = {}
    pending: Dict[int, Tuple[int, ...]] = {}
    for site in sites:
        kernel = kernels.get(site.node_id)
        if kernel is None:
            continue
        shapes = leaf_shapes(site)
        if site.kind is SiteKind.OP:
            # leaves it never reads do not stop a fold (stock folds a legalized call whose
            # arguments are all constants): ``zeros_like(x)`` of a run-time ``x``
            leaves = unread_leaves(site, kernel.arg_map)
            if leaves:
                unread[site.node_id] = leaves
            # its decision read a stand-in for a 0-d operand not yet evaluated (``.pending``)
            leaves = tuple(
                i
                for i, (constant, shape) in enumerate(zip(site.leaf_constants, shapes))
                if constant is None and shape == ()
            )
            if leaves:
                pending[site.node_id] = leaves
        # its result depends on memory nobody wrote (``fold_guard._tvm.unwritten``): only a
        # zero-size operand can make one
        if any(0 in (shape or ()) for shape in shapes):
            why = _unwritten_detail(kernel.prim_func)
            if why:
                unwritten[site.node_id] = why
    return Legalization(
        kernels,
        PlanningFacts(facts.unsupported, facts.not_stock_foldable, unread, unwritten),
        pending,
    )


def _unwritten_detail(prim_func: tvm.tirx.PrimFunc) -> str:
    if reduces_over_empty_axis(prim_func):
        return EMPTY_REDUCTION_DETAIL
    return EMPTY_READ_DETAIL if reads_empty_buffer(prim_func) else ""


def unread_leaves(site: CallSite, arg_map: Sequence[object]) -> Tuple[int, ...]:
    """The leaves of ``site`` that a kernel with ``arg_map`` does not read, literal constants aside.

    A zero-size leaf counts (its stand-in constant is not one of the call's).
    """
    read = {a for a in arg_map if isinstance(a, int)}
    return tuple(
        i
        for i, constant in enumerate(site.leaf_constants)
        if i not in read and (constant is None or i in site.zero_size_leaves)
    )


def _module_kernel(mod: tvm.IRModule, site: CallSite) -> KernelSpec:
    prim_func = mod[site.call.args[0]]
    return KernelSpec(prim_func, tuple(range(len(site.leaves))), None, (site.node_id,))
