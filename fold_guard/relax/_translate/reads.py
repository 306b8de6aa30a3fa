"""Which operands a call's kernel reads: the probe for calls on values not known before run time.

The stock pass decides constness *after* legalization: it legalizes every call in a dataflow
block, whatever its operands, and folds when the ``call_tir`` that comes out has only constant
arguments. A legalizer that needs only an operand's static type leaves the operand out of the
kernel's arguments (``full_like``, ``ones_like``, ``zeros_like``, ``eye_like`` bake its shape
in; ``collapse_sum_like`` reads its second operand's shape only), so stock folds such a call on
a run-time tensor, and then drops what only it read (``zeros_like(exp(x))``: ``exp`` goes too).

Legalizing every call of a model as stock does would cost fold_guard most of its speed: a
model's run-time calls are most of its calls. So the calls not reachable from constants are
*probed*: one ``LegalizeOps`` over one request per op signature (:mod:`.legalize`'s grouping: the op,
its attributes, its static arguments, per leaf the dtype and per dim 0, 1 or larger), each
request with every dim larger than 1 symbolic, so a signature's calls of every shape share one
legalization. Where the symbolic legalization does not give one ``call_tir``, each distinct
shape is legalized statically instead. A leaf missing from the kernel's arguments is *unread*:
it counts as constant when the walk picks the calls to legalize (``Walk.candidates``). Whether
a call folds is then decided on its own static legalization, as for every candidate
(:mod:`.legalize`, ``PlanningFacts.unread``): the probe only chooses which calls are worth it.

    x: R.Tensor((4, 4))        run-time
    lv = R.exp(x)              probed: its kernel reads x        -> not constant
    z = R.zeros_like(lv)       probed: its kernel reads nothing  -> a candidate, folds
    y = R.add(x, z)            probed: its kernel reads x        -> not constant
"""

from __future__ import annotations

from typing import AbstractSet, Dict, FrozenSet, List, Sequence, Tuple

from tvm import relax

from ..._core.graph import Annotation
from .. import _compat
from .._sites import CallSite, SiteKind
from .._stock import legalized_call_tir
from .legalize import _signature, _split_by_shape, unread_leaves
from .requests import Request, leaf_shapes, legalize_requests, make_request
from .walk import Walk

__all__ = ["probe_sites", "probe_unread"]


def probe_sites(walk: Walk, candidates: AbstractSet[int]) -> List[CallSite]:
    """The operator calls of ``walk`` worth probing: not ``candidates`` already, static results
    and no reason never to fold, every leaf of static shape, and no operand a barrier's output
    (nothing folds across one, whatever its kernel reads)."""
    barriers = {
        site.node_id
        for site, facts in zip(walk.sites, walk.facts)
        if facts.annotation is Annotation.BARRIER
    }
    return [
        site
        for site, facts in zip(walk.sites, walk.facts)
        if site.kind is SiteKind.OP
        and site.node_id not in candidates
        and facts.stock.unfoldable is None
        and all(info.is_static for info in facts.outputs)
        and all(shape is not None and None not in shape for shape in leaf_shapes(site))
        and not any(inp.node in barriers for inp in facts.inputs if inp.node is not None)
    ]


def probe_unread(sites: Sequence[CallSite]) -> Dict[int, FrozenSet[int]]:
    """Per call of ``sites`` whose kernel leaves some of its leaves unread: those leaves."""
    groups: Dict[Tuple, List[CallSite]] = {}
    for site in sites:
        groups.setdefault(_signature(site), []).append(site)
    requests: List[Tuple[relax.Function, Request]] = []
    for index, members in enumerate(groups.values()):
        try:
            requests.append(
                make_request(
                    f"r{index}", members, symbolic=True, scalars_as_constants=False, every_dim=True
                )
            )
        except Exception:  # noqa: BLE001 - type inference rejected the symbolic dims
            requests += _static(f"r{index}", members)
    found, retry = _read(requests)
    if retry:
        found.update(_read([r for i, m in enumerate(retry) for r in _static(f"s{i}", m)])[0])
    return found


def _static(name: str, members: Sequence[CallSite]) -> List[Tuple[relax.Function, Request]]:
    return [
        make_request(f"{name}_{k}", part, symbolic=False, scalars_as_constants=False)
        for k, part in enumerate(_split_by_shape(members))
    ]


def _read(
    requests: List[Tuple[relax.Function, Request]],
) -> Tuple[Dict[int, FrozenSet[int]], List[List[CallSite]]]:
    """The unread leaves of each request's members; the symbolic requests to retry statically."""
    legalized, _ = legalize_requests({request.name: func for func, request in requests})
    found: Dict[int, FrozenSet[int]] = {}
    retry: List[List[CallSite]] = []
    for _, request in requests:
        value = None
        if request.name in legalized:
            value, _why = legalized_call_tir(legalized[request.name][request.name])
        if value is None:
            # stock folds only a single call_tir; a static legalization that is not one folds
            # nothing, a symbolic one may differ from the static one: ask again per shape
            if request.symbolic:
                retry.append(request.members)
            continue
        index_of = {_compat.handle(p): i for i, p in enumerate(request.params) if p is not None}
        arg_map = [
            index_of.get(_compat.handle(arg), -1) if isinstance(arg, relax.Var) else None
            for arg in value.args[1].fields
        ]
        for site in request.members:
            unread = unread_leaves(site, arg_map)
            if unread:
                found[site.node_id] = frozenset(unread)
    return found, retry
