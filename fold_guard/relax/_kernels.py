"""One batched evaluation: legalize every foldable call once per op signature, compile once, run.

Stock ``FoldConstant`` legalizes, builds and runs each call on its own, so its cost grows with the
number of calls and LLVM work dominates. Here calls are grouped by *op signature*: the operator,
its attributes, its static arguments, and for each tensor argument its dtype and, per dim, whether
it is 0, 1 or larger (size-1 dims broadcast, so they must not hide behind a symbolic dim). A group
whose members all share one shape gets a static kernel; a group of a shape-generic op
(``SHAPE_GENERIC_OPS``: elementwise ops, Q/DQ, broadcasts and transposes) whose members differ in
shape gets one kernel over symbolic shapes, which serves every member whose result shape it
reproduces; everything else gets one static kernel per distinct shape. All kernels go into one
``IRModule`` built once with ``tvm.tirx.build(..., target="llvm")``; the calls then run in
topological order, passing tensors directly (destination-passing style, as ``call_tir`` does).
Calls that only move data (``_host``) are legalized like the others but copied by NumPy, so
their kernels are never compiled.

Tensor arguments are always passed as buffers (never inlined as immediates), so a kernel does not
depend on the values of scalar constants such as per-tensor scales. Whether the stock pass would
fold a call is still decided on the call as the stock pass sees it: scalar constants are given to
the legalizer as constants, because some legalizers (``astype``) then return a constant instead of
a TIR call, and the stock pass does not fold those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .._core.errors import PlanInvariantError
from . import _compat, _legalized
from ._host import HostFunction, host_function
from ._kernel_cache import CacheSetting, KernelCache, resolve_cache
from ._lower import CallSite, SiteKind, StaticShapeVar
from ._opt_level import OPTIMIZED_TARGET, ValueGuard, build_target
from ._stock import legalized_call_tir, needs_scalar_decision

__all__ = ["SHAPE_GENERIC_OPS", "Kernel", "KernelLibrary", "KernelSet", "prepare_kernels"]

logger = logging.getLogger("fold_guard")

_ELEMENTWISE = (
    "abs acos acosh asin asinh astype atan atanh bitwise_not ceil clip cos cosh erf exp floor "
    "isfinite isinf isnan log logical_not negative nn.relu nn.silu nn.gelu nn.gelu_tanh round "
    "rsqrt sigmoid sign sin sinh sqrt square tan tanh trunc "
    "add atan2 bitwise_and bitwise_or bitwise_xor divide equal floor_divide floor_mod greater "
    "greater_equal left_shift less less_equal log_add_exp logical_and logical_or logical_xor "
    "maximum minimum mod multiply not_equal power right_shift subtract where"
)
#: Ops whose kernel computes the same values whatever the static sizes of its dims (apart from
#: the 0/1 dim classes that are part of the signature), so one kernel over symbolic dims may
#: serve calls of different shapes. Others get one static kernel per distinct shape, as the stock
#: pass builds them: some TOPI computes decide their loop structure, and so their float
#: summation order, from static sizes (``adaptive_avg_pool2d`` does when a window divides evenly).
SHAPE_GENERIC_OPS = frozenset(
    [f"relax.{name}" for name in _ELEMENTWISE.split()]
    + [
        "relax.quantize",
        "relax.dequantize",
        "relax.broadcast_to",
        "relax.permute_dims",
        "relax.expand_dims",
    ]
)
#: Ops of SHAPE_GENERIC_OPS whose result C and LLVM leave undefined for some integer operands
#: (division by zero, ``INT_MIN / -1``, a shift by at least the bit width). What such a kernel
#: returns there depends on the generated code, which differs between a symbolic kernel and the
#: static one stock compiles, so on integers they get static kernels. (``quantize`` clips before
#: it converts, so its conversion is always in range.)
_UNDEFINED_ON_INTEGERS = frozenset(
    f"relax.{name}"
    for name in ("divide", "floor_divide", "floor_mod", "mod", "left_shift", "right_shift")
)
_ASTYPE_OP = "relax.astype"


@dataclass(eq=False)
class Kernel:
    """How to run one call: the PrimFunc, and for each of its input buffers a leaf index or a constant.

    A kernel read from a legalization record (``_legalized``) knows its PrimFunc only by digest:
    its compiled code is in the kernel cache, and the PrimFunc is legalized again (``relegalize``)
    only if something needs it (code no longer cached, or an ``-O3`` build its guard asks for).
    """

    loaded: Optional[tvm.tirx.PrimFunc]
    arg_map: Tuple[object, ...]  # int: index into CallSite.leaves; otherwise a runtime Tensor
    out_ty: object = None  # the result type the kernel was legalized for (symbolic or static)
    target: str = OPTIMIZED_TARGET  # what it is built for (see ``_opt_level``)
    #: checked on a call's operand values before running a ``-O0`` kernel (see ``_opt_level``)
    guard: Optional[ValueGuard] = None
    #: the PrimFunc's ``KernelCache.digest``, once computed or read from a record
    known_digest: Optional[str] = None
    relegalize: Optional[Callable[[], tvm.tirx.PrimFunc]] = None

    @property
    def prim_func(self) -> tvm.tirx.PrimFunc:
        if self.loaded is None:
            assert self.relegalize is not None, "a kernel has a PrimFunc or a way to get it"
            self.loaded = self.relegalize()
        return self.loaded

    def digest(self) -> str:
        """The PrimFunc's digest, which names its compiled code in the kernel cache."""
        if self.known_digest is None:
            self.known_digest = KernelCache.digest(self.prim_func)
        return self.known_digest


@dataclass
class KernelSet:
    kernels: Dict[int, Kernel] = field(default_factory=dict)
    #: nodes that cannot be evaluated at all: node id -> why
    unsupported: Dict[int, str] = field(default_factory=dict)
    #: nodes fold_guard can evaluate but the stock pass would not fold: node id -> why
    not_stock_foldable: Dict[int, str] = field(default_factory=dict)
    #: nodes whose result NumPy copies exactly (see ``_host``): their kernels are never compiled
    host: Dict[int, HostFunction] = field(default_factory=dict)
    #: node id -> its zero-size run-time inputs that its kernel does not read (so, as in stock,
    #: they do not stop it folding)
    unread_zero_size: Dict[int, Tuple[int, ...]] = field(default_factory=dict)


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
    name: str, members: List[CallSite], *, symbolic: bool, scalars_as_constants: bool
) -> Tuple[relax.Function, _Request]:
    site = members[0]
    params: List[Optional[relax.Var]] = []
    leaf_exprs: List[relax.Expr] = []
    dims, dim_values = _dims_for(members, symbolic)
    for i, leaf_dims in enumerate(dims):
        dtype = _compat.dtype_of(_leaf_type(site, i))
        if scalars_as_constants and not leaf_dims:
            constant = site.leaf_constants[i]
            leaf_exprs.append(
                constant if constant is not None else relax.const(np.zeros((), dtype), dtype)
            )
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


def _single_call_tir(mod: tvm.IRModule, request: _Request) -> Tuple[Optional[Kernel], str]:
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
    target, guard = build_target(request.members)
    return Kernel(prim_func, tuple(arg_map), value.ty_args[0], target, guard), ""


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


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _is_shape_generic(site: CallSite) -> bool:
    """Whether one symbolic kernel computes, for every shape, the bits stock's static kernel does.

    Only where the result is defined for every input value: a float-to-integer ``astype`` of an
    out-of-range value or NaN is undefined behaviour, and a symbolic kernel gave ``44`` where
    stock's static one gives ``127`` for ``astype(300.0, "int8")``. The dtypes are part of the
    op signature, so the first member answers for the whole group.
    """
    op = site.call.op.name
    if op not in SHAPE_GENERIC_OPS:
        return False
    in_dtypes = [_compat.dtype_of(_leaf_type(site, i)) for i in range(len(site.leaves))]
    if op in _UNDEFINED_ON_INTEGERS:
        return not any(_is_integer(dtype) for dtype in in_dtypes)
    if op == _ASTYPE_OP:
        out_dtype = _compat.dtype_of(_compat.type_of(site.call))
        return not (
            _is_integer(out_dtype) and any(not _is_integer(d) and d != "bool" for d in in_dtypes)
        )
    return True


def _group_requests(name: str, members: List[CallSite]) -> List[Tuple[relax.Function, _Request]]:
    """The kernel request of one op-signature group, plus its decision request if it has scalars."""
    distinct_shapes = len({_shapes(site) for site in members})
    if distinct_shapes == 1:
        requests = [_make_request(name, members, symbolic=False, scalars_as_constants=False)]
    elif _is_shape_generic(members[0]):
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


class _Records:
    """The legalization records (``_legalized``) one fold reads from and adds to its kernel cache."""

    def __init__(self, cache: Optional[KernelCache]):
        self._cache = cache
        self._new: Dict[str, _legalized.Outcome] = {}

    def keys(self, requests: List[Tuple[relax.Function, _Request]]) -> Dict[str, str]:
        """request name -> record key, for the requests whose op's legalizer is known."""
        if self._cache is None:
            return {}
        keys: Dict[str, str] = {}
        for func, request in requests:
            op_name = request.members[0].call.op.name
            identity = _legalized.legalizer_identity(op_name)
            if identity is not None:
                keys[request.name] = _legalized.request_key(identity, func, op_name)
        return keys

    def read(self, keys: Dict[str, str]) -> Dict[str, Any]:
        """request name -> its stored outcome, for those stored."""
        if self._cache is None or not keys:
            return {}
        stored = self._cache.read_legalized(sorted(set(keys.values())))
        return {name: stored[key] for name, key in keys.items() if key in stored}

    def add(self, key: str, kernel: Optional[Kernel], why: str, *, decision: bool) -> None:
        """Keep what legalizing one request gave; a decision request keeps only whether stock folds."""
        if decision:
            outcome: Optional[_legalized.Outcome] = _legalized.encode_decision(
                None if kernel is not None else why
            )
        else:
            outcome = _legalized.encode_outcome(
                kernel.digest() if kernel is not None else None,
                kernel.arg_map if kernel is not None else (),
                kernel.out_ty if kernel is not None else None,
                why,
            )
        if outcome is not None:
            self._new[key] = outcome

    def write(self) -> None:
        if self._cache is not None and self._new:
            try:
                self._cache.write_legalized(self._new)
            except OSError as err:  # an unwritable cache costs the next fold time, nothing else
                logger.debug("fold_guard kernel cache: cannot store legalizations (%s)", err)
            self._new = {}


def _recorded_kernel(
    stored: Any, func: relax.Function, request: _Request
) -> Optional[Tuple[Optional[Kernel], str]]:
    """The kernel (or why there is none) a stored outcome gives ``request``; None if malformed."""
    decoded = _legalized.decode_outcome(stored, list(request.dim_values))
    if decoded is None:
        return None
    digest, arg_map, out_ty, why = decoded
    if digest is None:
        return None, why
    if not all(0 <= a < len(request.params) and request.params[a] is not None for a in arg_map):
        return None  # operands the request does not have: not a record of this request

    def relegalize() -> tvm.tirx.PrimFunc:
        modules, errors = _legalize({request.name: func})
        kernel, why = (
            _single_call_tir(modules[request.name], request)
            if request.name in modules
            else (None, errors.get(request.name, ""))
        )
        if kernel is None or kernel.digest() != digest:
            raise PlanInvariantError(
                f"the kernel cache's record of legalizing {request.members[0].call.op.name} "
                f"does not match what LegalizeOps gives now ({why or 'another PrimFunc'}); "
                "hint: delete the kernel cache directory (FOLD_GUARD_CACHE_DIR, else "
                "~/.cache/fold_guard) and please report it"
            )
        return kernel.prim_func

    target, guard = build_target(request.members)
    return Kernel(None, arg_map, out_ty, target, guard, digest, relegalize), ""


def _read_back(
    requests: List[Tuple[relax.Function, _Request]], result: KernelSet, records: _Records
) -> List[Tuple[relax.Function, _Request]]:
    """Legalize ``requests`` together (those not on record) and record their kernels; return the static retries."""
    keys = records.keys(requests)
    stored_outcomes = records.read(keys)
    #: request name -> its kernel, or None and why there is none
    outcomes: Dict[str, Tuple[Optional[Kernel], str]] = {}
    #: decision request name -> None if stock folds its calls, else why it does not
    decisions: Dict[str, Optional[str]] = {}
    for func, request in requests:
        stored = stored_outcomes.get(request.name)
        if stored is None:
            continue
        if request.for_decision:
            decided = _legalized.decode_decision(stored)
            if decided is not None:
                decisions[request.name] = decided[0]
        else:
            recorded = _recorded_kernel(stored, func, request)
            if recorded is not None:
                outcomes[request.name] = recorded
    fresh = [
        (func, request)
        for func, request in requests
        if request.name not in outcomes and request.name not in decisions
    ]
    legalized, errors = (
        _legalize({request.name: func for func, request in fresh}) if fresh else ({}, {})
    )
    for _, request in fresh:
        kernel, why = None, errors.get(request.name, "LegalizeOps failed")
        if request.name in legalized:
            kernel, why = _single_call_tir(legalized[request.name], request)
            if request.name in keys:
                records.add(keys[request.name], kernel, why, decision=request.for_decision)
        if request.for_decision:
            decisions[request.name] = None if kernel is not None else why
        else:
            outcomes[request.name] = kernel, why
    retries: List[Tuple[relax.Function, _Request]] = []
    for _, request in requests:
        if request.for_decision:
            why_not = decisions[request.name]
            if why_not is not None:
                result.not_stock_foldable.update(
                    {site.node_id: why_not for site in request.members}
                )
            continue
        kernel, why = outcomes[request.name]
        if kernel is not None:
            good, bad = (
                _split_by_output_shape(request, kernel.out_ty)
                if request.symbolic
                else (request.members, [])
            )
            result.kernels.update({site.node_id: kernel for site in good})
            retries += _static_requests(f"{request.name}_o", bad)
        elif request.symbolic:
            retries += _static_requests(request.name, request.members)
        else:
            result.unsupported.update({site.node_id: why for site in request.members})
    return retries


def prepare_kernels(
    mod: tvm.IRModule,
    sites: Sequence[CallSite],
    candidates: AbstractSet[int],
    cache_setting: CacheSetting = False,
) -> KernelSet:
    """Find a kernel for every site in ``candidates`` (those that could fold), legalizing once per op signature.

    With a kernel cache (``cache_setting``, as :func:`~fold_guard.relax._kernel_cache.resolve_cache`
    reads it), requests legalized before are read from its legalization records instead.
    """
    result = KernelSet()
    records = _Records(resolve_cache(cache_setting, OPTIMIZED_TARGET))
    groups: Dict[Tuple, List[CallSite]] = {}
    for site in sites:
        if site.node_id not in candidates:
            continue
        if site.kind is SiteKind.CALL_TIR:
            prim_func = mod[site.call.args[0]]
            result.kernels[site.node_id] = Kernel(prim_func, tuple(range(len(site.leaves))))
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
    retries = _read_back(requests, result, records)
    if retries:
        _read_back(retries, result, records)
    records.write()
    for site in sites:
        kernel = result.kernels.get(site.node_id)
        if kernel is not None and site.kind is SiteKind.OP:
            host = host_function(site)
            if host is not None:
                result.host[site.node_id] = host
        if site.zero_size_leaves and kernel is not None:
            read = {a for a in kernel.arg_map if isinstance(a, int)}
            unread = tuple(i for i in site.zero_size_leaves if i not in read)
            if unread:
                result.unread_zero_size[site.node_id] = unread
    return result


class KernelLibrary:
    """The distinct PrimFuncs of a set of kernels, compiled together once for the CPU.

    Each kernel is built for its own ``target`` (its LLVM optimization level, see
    ``_opt_level``). With a kernel cache (``cache_setting``, as
    :func:`~fold_guard.relax._kernel_cache.resolve_cache` reads it), kernels built before (by
    this or another process) are loaded from disk and the others are compiled into one library,
    whatever their targets, that the cache keeps; without one, they are built in memory, one
    batch per target, and run by the JIT.
    """

    def __init__(self, kernels: Sequence[Kernel], cache_setting: CacheSetting = False):
        #: (Kernel id, target) -> symbol
        self._symbols: Dict[Tuple[int, str], str] = {}
        #: symbol -> (a kernel it serves, the target it is built for)
        self._funcs: Dict[str, Tuple[Kernel, str]] = {}
        #: (structural hash, target) -> the PrimFuncs registered under it, with their symbols
        self._by_hash: Dict[Tuple[int, str], List[Tuple[tvm.tirx.PrimFunc, str]]] = {}
        #: (digest, target) -> symbol, for kernels known by digest (not legalized this fold)
        self._by_digest: Dict[Tuple[str, str], str] = {}
        self._cache_setting = cache_setting
        self._kernels = list(kernels)  # their ids key _symbols: keep them alive
        for kernel in self._kernels:
            self._register(kernel, kernel.target)
        #: symbol -> (the runtime module that holds it, its name there)
        self._compiled: Dict[str, Tuple[Any, str]] = {}
        self.failures: Dict[str, str] = {}
        #: kernels compiled by this library, and kernels loaded from the persistent cache
        self.compiled = 0
        self.cached = 0

    def _register(self, kernel: Kernel, target: str) -> Tuple[str, bool]:
        """The symbol ``kernel`` is built under for ``target``, and whether it is new.

        Structurally equal PrimFuncs for one target share a symbol, so they are built once; so do
        kernels read from legalization records with one digest (their PrimFuncs are not at hand).
        """
        key = (id(kernel), target)
        if key in self._symbols:
            return self._symbols[key], False
        symbol: Optional[str]
        if kernel.loaded is None:
            symbol = self._by_digest.get((kernel.digest(), target))
        else:
            bucket = self._by_hash.setdefault((tvm_ffi.structural_hash(kernel.loaded), target), [])
            symbol = next(
                (s for f, s in bucket if tvm_ffi.structural_equal(f, kernel.loaded)), None
            )
        new = symbol is None
        if symbol is None:
            symbol = f"fold_guard_kernel_{len(self._funcs)}"
            self._funcs[symbol] = (kernel, target)
            if kernel.loaded is None:
                self._by_digest[(kernel.digest(), target)] = symbol
            else:
                bucket.append((kernel.loaded, symbol))
        self._symbols[key] = symbol
        return symbol, new

    def build(self) -> None:
        """Load cached kernels, compile the rest in one batch per target; on failure one by one."""
        funcs = dict(self._funcs)
        cache = resolve_cache(self._cache_setting, OPTIMIZED_TARGET) if funcs else None
        if cache is not None:
            funcs = self._build_through_cache(cache, funcs)
        by_target: Dict[str, Dict[str, tvm.tirx.PrimFunc]] = {}
        for symbol, (kernel, target) in funcs.items():
            by_target.setdefault(target, {})[symbol] = kernel.prim_func
        for target, named in by_target.items():
            self._build_in_memory(target, named)

    def _build_in_memory(self, target: str, funcs: Dict[str, tvm.tirx.PrimFunc]) -> None:
        funcs = {symbol: func.with_attr("global_symbol", symbol) for symbol, func in funcs.items()}
        try:
            batch = tvm.tirx.build(tvm.IRModule(funcs), target=target)
            self._compiled.update({symbol: (batch, symbol) for symbol in funcs})
            self.compiled += len(funcs)
            return
        except Exception as err:  # noqa: BLE001 - fall back to per-kernel builds to find the culprit
            logger.debug("batched kernel build failed (%s); building kernels one by one", err)
        for symbol, func in funcs.items():
            try:
                self._compiled[symbol] = (
                    tvm.tirx.build(tvm.IRModule({symbol: func}), target=target),
                    symbol,
                )
                self.compiled += 1
            except Exception as err:  # noqa: BLE001 - recorded as EVAL_FAILED for the calls using it
                self.failures[symbol] = f"kernel build failed: {err}".splitlines()[0]

    def _build_through_cache(
        self, cache: KernelCache, funcs: Dict[str, Tuple[Kernel, str]]
    ) -> Dict[str, Tuple[Kernel, str]]:
        """Load or build ``funcs`` through ``cache``; return those left to build without it."""
        keys = {
            symbol: cache.key(kernel.digest(), target) for symbol, (kernel, target) in funcs.items()
        }
        found = cache.lookup(sorted(set(keys.values())))
        missing = {
            key: (funcs[symbol][0].prim_func, funcs[symbol][1])
            for symbol, key in keys.items()
            if key not in found
        }
        if missing:
            try:
                found.update(cache.build(missing))
            except Exception as err:  # noqa: BLE001 - no compiler, unwritable cache, a bad kernel...
                logger.debug(
                    "fold_guard kernel cache: building through the cache failed (%s); "
                    "building in memory",
                    err,
                )
        left: Dict[str, Tuple[Kernel, str]] = {}
        for symbol, key in keys.items():
            if key in found:
                self._compiled[symbol] = found[key]
            else:
                left[symbol] = funcs[symbol]
        self.compiled += len({key for key in missing if key in found})
        self.cached += len(
            {key for symbol, key in keys.items() if key in found and key not in missing}
        )
        return left

    def function_for(
        self, kernel: Kernel, site: CallSite, leaves: Sequence[tvm.runtime.Tensor]
    ) -> Any:
        """The compiled function to run ``site`` with: its kernel's, unless the guard turns it away."""
        if kernel.guard is not None and not kernel.guard(
            site, [np.from_dlpack(leaf) for leaf in leaves]
        ):
            return self.optimized_function(kernel)
        return self.function(kernel)

    def optimized_function(self, kernel: Kernel) -> Any:
        """``kernel`` built at stock's ``-O3`` in memory (once), for a call its guard turned away."""
        symbol, new = self._register(kernel, OPTIMIZED_TARGET)
        if new:
            self._build_in_memory(OPTIMIZED_TARGET, {symbol: kernel.prim_func})
        return self._compiled_function(symbol)

    def function(self, kernel: Kernel) -> Any:
        """The compiled function for ``kernel``; RuntimeError if its build failed."""
        return self._compiled_function(self._symbols[(id(kernel), kernel.target)])

    def _compiled_function(self, symbol: str) -> Any:
        if symbol in self.failures:
            raise RuntimeError(self.failures[symbol])
        module, name = self._compiled[symbol]
        return module[name]
