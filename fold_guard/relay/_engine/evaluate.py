"""Evaluate the folded calls of a plan, level by level, through as few kernel builds as possible.

Stock ``FoldConstant`` evaluates one call at a time with ``relay.backend.interpreter``'s
``EvalFunction`` (SimplifyInference, QNN Legalize/Canonicalize, FuseOps at level 0, LowerTE,
one build), so every call pays for a whole compilation. Here, per dependency level:

* elementwise calls of one signature (op, attributes, dtypes, scalar operands; see
  :mod:`fold_guard.relay._engine.kernels`) are evaluated as one call on their flattened, concatenated
  operands, whatever their shapes, so each such signature compiles its kernels once;
* other calls of one exact signature (repeated layers) are evaluated by one function prepared
  once through stock's pipeline and applied to each call's constants;
* every other call goes into one tuple and one ``EvalFunction`` (chunks of
  MAX_SIGNATURES_PER_RUN signatures): the pipeline runs once, identical kernels are lowered once
  (the TE compiler caches them within a run), and each call is exactly the expression stock
  evaluates (an op applied to constants).

Either way each result is computed through the pipeline stock uses, at fusion level 0, by the
same per-element arithmetic on the same data. A call the prepared path cannot evaluate is
evaluated on the batched path, which isolates and reports failures as stock's evaluation does.

Invariant: a call is evaluated only after all its node operands have values, so a level is the
length of the longest chain of folded calls below it.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np
import tvm
from tvm import relay

from ..._core.driver import pending_levels
from ..._core.errors import PlanInvariantError
from ..._core.graph import FoldGraph
from ..._core.planner import FoldPlan, evaluation_error
from .._sites import CallSite, ConstSource, NodeSource, SiteKind, Source, TupleSource
from .._stock import NDARRAY_SIZE_OP, evaluation_target
from .kernels import (
    FlatForm,
    PreparedKernel,
    flat_calls,
    flat_form,
    prepared_key,
    same_attrs,
    scalar_key,
    unflatten,
)

__all__ = ["Values", "evaluate_plan", "materialize"]

#: node id -> the folded value: a ``relay.Constant``, or a ``relay.Tuple`` of them for tuple results.
Values = Dict[int, relay.Expr]


def materialize(source: Source, values: Mapping[int, relay.Expr]) -> relay.Expr:
    """The constant expression ``source`` stands for, once its nodes have values."""
    if isinstance(source, ConstSource):
        return source.constant
    if isinstance(source, TupleSource):
        return relay.Tuple([materialize(field, values) for field in source.fields])
    if isinstance(source, NodeSource):
        value = values[source.node]
        if source.index is None:
            return value
        if not isinstance(value, relay.Tuple):
            raise PlanInvariantError(
                f"node %{source.node} was read as a tuple but folded to a tensor"
            )
        return value.fields[source.index]
    raise PlanInvariantError(f"a folded call reads {source.label}, which is only known at run time")


def _to_expr(value: object) -> relay.Expr:
    if isinstance(value, tvm.nd.NDArray):
        return relay.Constant(value)
    # A tuple result is an ADT up to TVM 0.16 and an Array in later releases: accept any sequence.
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return relay.Tuple([_to_expr(value[i]) for i in range(len(value))])  # type: ignore[index, arg-type]
    raise PlanInvariantError(
        f"the interpreter returned a {type(value).__name__}, not a tensor or tuple"
    )


def _run(exprs: Sequence[relay.Expr]) -> List[relay.Expr]:
    # A fresh PassContext, as stock's ConstEvaluate: the caller's opt_level or config must not
    # change how constants are computed.
    with tvm.transform.PassContext():
        executor = relay.create_executor(
            "debug", mod=tvm.IRModule(), device=tvm.cpu(0), target=evaluation_target()
        )
        result = executor.evaluate(relay.Tuple(list(exprs)))
    return [_to_expr(field) for field in result]


def _expression(site: CallSite, values: Mapping[int, relay.Expr]) -> relay.Expr:
    if site.kind == SiteKind.SHAPE:
        assert site.static_value is not None
        is_size = site.call.op.name == NDARRAY_SIZE_OP
        data = np.array(site.static_value[0] if is_size else site.static_value, dtype="int32")
        return relay.cast(relay.const(data, "int32"), str(site.call.attrs.dtype))
    call = site.call
    args = [materialize(arg, values) for arg in site.args]
    # A copy of the attributes: QNN canonicalization writes resolved defaults (requantize's
    # rounding and compute dtype) into the attributes object it is given, which would otherwise
    # change the caller's module. (Stock FoldConstant(fold_qnn=True) does change it.)
    attrs = None if call.attrs is None else tvm.ir.load_json(tvm.ir.save_json(call.attrs))
    return relay.Call(call.op, args, attrs, call.type_args, call.span)


#: Distinct kernel signatures evaluated in one interpreter run. All kernels of a run live in one
#: LLVM module until the run ends, at about 5 MiB each: 200 differently shaped calls in one run
#: peaked near 1.2 GiB (stock: 330 MiB); in runs of 16 signatures, 394 MiB. Calls that share a
#: signature (and so a kernel) always go into the same run, so repeated layers still compile each
#: kernel once.
MAX_SIGNATURES_PER_RUN = 16


def _signature(expr: relay.Expr) -> Tuple[object, ...]:
    """What decides which kernels a call compiles to: op, attributes, argument dtypes and shapes."""

    def describe(arg: relay.Expr) -> object:
        if isinstance(arg, relay.Constant):
            if not arg.data.shape:
                return scalar_key(arg)
            return (str(arg.data.dtype), tuple(int(d) for d in arg.data.shape))
        if isinstance(arg, relay.Tuple):
            return tuple(describe(field) for field in arg.fields)
        return type(arg).__name__

    attrs = 0 if expr.attrs is None else tvm.ir.structural_hash(expr.attrs)
    return (expr.op.name, attrs, tuple(describe(arg) for arg in expr.args))


def _chunks(exprs: Sequence[relay.Expr]) -> List[List[int]]:
    """Positions of ``exprs`` split into runs of at most MAX_SIGNATURES_PER_RUN signatures."""
    by_signature: Dict[Tuple[object, ...], List[int]] = {}
    for position, expr in enumerate(exprs):
        by_signature.setdefault(_signature(expr), []).append(position)
    groups = list(by_signature.values())
    return [
        [position for group in groups[start : start + MAX_SIGNATURES_PER_RUN] for position in group]
        for start in range(0, len(groups), MAX_SIGNATURES_PER_RUN)
    ]


def evaluate_plan(
    plan: FoldPlan,
    sites: Sequence[CallSite],
    values: Values,
    *,
    strict: bool = False,
) -> Tuple[Dict[int, str], int]:
    """Fill ``values`` for every folded node not yet in it.

    Returns the nodes whose evaluation failed (with the error text; the caller re-plans with
    them) and the number of interpreter runs (batched runs plus functions prepared). With
    ``strict`` the first failure raises FoldNotPossibleError chained to the original error.
    """
    failures: Dict[int, str] = {}
    runs = 0
    graph = plan.graph
    kernels: Kernels = {}
    for level in pending_levels(plan, values):  # a node whose operand failed is left out
        pending: List[int] = []
        for node in level:
            node_id = node.id
            if sites[node_id].kind == SiteKind.ALLOW:
                values[node_id] = materialize(sites[node_id].args[0], values)
            else:
                pending.append(node_id)
        exprs = [_expression(sites[node_id], values) for node_id in pending]
        batched, shared_runs = _evaluate_shared(pending, exprs, values, kernels)
        runs += shared_runs
        batched_exprs = [exprs[position] for position in batched]
        for chunk in _chunks(batched_exprs):
            chunk_ids = [pending[batched[position]] for position in chunk]
            runs += _run_chunk(
                chunk_ids,
                [batched_exprs[position] for position in chunk],
                graph,
                values,
                failures,
                strict,
            )
    return failures, runs


#: Prepared functions kept alive at once (least recently used dropped first). Each holds its
#: kernels, so this bounds memory as MAX_SIGNATURES_PER_RUN does for a batched run; a signature
#: that recurs on a later level is not prepared again while it stays among them.
MAX_PREPARED_KERNELS = 16

Kernels = Dict[Tuple[object, ...], PreparedKernel]


def _evaluate_shared(
    node_ids: Sequence[int], exprs: Sequence[relay.Expr], values: Values, kernels: Kernels
) -> Tuple[List[int], int]:
    """Evaluate the calls of ``exprs`` that can share kernels into ``values``.

    Returns the positions left for the batched path (calls with nothing to share, and any call
    the shared paths failed on: the batched path evaluates it as stock does and reports why) and
    the number of functions prepared (interpreter runs).
    """
    rest, flattened = _evaluate_flattened(node_ids, exprs, values, kernels)
    left, prepared = _evaluate_prepared(node_ids, exprs, rest, values, kernels)
    return left, flattened + prepared


def _kernel_for(template: relay.Call, kernels: Kernels) -> Tuple[PreparedKernel, int]:
    """The prepared function of ``template``'s signature (from ``kernels``, or new: 1 run)."""
    key = prepared_key(template)
    assert key is not None  # an op applied to constants
    kernel = kernels.pop(key, None)
    made = 0
    if kernel is None:
        kernel, made = PreparedKernel(template), 1
    kernels[key] = kernel  # (re)inserted last: the most recently used
    while len(kernels) > MAX_PREPARED_KERNELS:
        del kernels[next(iter(kernels))]
    return kernel, made


def _evaluate_flattened(
    node_ids: Sequence[int], exprs: Sequence[relay.Expr], values: Values, kernels: Kernels
) -> Tuple[List[int], int]:
    """Elementwise calls of one signature as calls on flattened, concatenated operands."""
    rest: List[int] = []
    groups: Dict[Tuple[object, ...], List[Tuple[int, FlatForm]]] = {}
    for position, expr in enumerate(exprs):
        form = flat_form(expr)
        if form is None:
            rest.append(position)
        else:
            groups.setdefault(form.key, []).append((position, form))
    runs = 0
    for members in groups.values():
        template = exprs[members[0][0]]
        rest.extend(p for p, _ in members if not same_attrs(exprs[p], template))
        members = [(p, f) for p, f in members if same_attrs(exprs[p], template)]
        if len(members) < 2:
            rest.extend(p for p, _ in members)  # nothing to share: the batched run serves it
            continue
        calls = [exprs[p] for p, _ in members]
        forms = [f for _, f in members]
        try:
            chunks = flat_calls(calls, forms)
            first = next(chunks)
            kernel, made = _kernel_for(first, kernels)
            runs += made
            results = (_result_array(kernel(call)) for call in itertools.chain([first], chunks))
            parts = unflatten(results, forms)
        except Exception:  # noqa: BLE001 - any failure: evaluate the calls the way stock does
            rest.extend(p for p, _ in members)
            continue
        for (position, _), part in zip(members, parts):
            values[node_ids[position]] = part
    return sorted(rest), runs


def _result_array(value: object) -> np.ndarray:
    if not isinstance(value, tvm.nd.NDArray):
        raise PlanInvariantError(f"a flattened call returned a {type(value).__name__}")
    return value.numpy()


def _evaluate_prepared(
    node_ids: Sequence[int],
    exprs: Sequence[relay.Expr],
    positions: Sequence[int],
    values: Values,
    kernels: Kernels,
) -> Tuple[List[int], int]:
    """Calls of one exact signature through one prepared function (repeated layers' kernels once)."""
    rest: List[int] = []
    groups: Dict[Tuple[object, ...], List[int]] = {}
    for position in positions:
        key = prepared_key(exprs[position])
        if key is None:
            rest.append(position)
        else:
            groups.setdefault(key, []).append(position)
    prepared = 0
    for key, members in groups.items():
        template = exprs[members[0]]
        same = [p for p in members if same_attrs(exprs[p], template)]
        rest.extend(p for p in members if p not in same)
        if key not in kernels and len(same) < 2:
            rest.extend(same)  # nothing to share: one batched run serves it as well
            continue
        try:
            kernel, made = _kernel_for(template, kernels)
        except Exception:  # noqa: BLE001 - any failure: the batched path evaluates as stock
            rest.extend(same)
            prepared += 1
            continue
        prepared += made
        for position in same:
            try:
                values[node_ids[position]] = _to_expr(kernel(exprs[position]))
            except Exception:  # noqa: BLE001 - the batched path evaluates it and reports why
                rest.append(position)
    return sorted(rest), prepared


def _run_chunk(
    node_ids: Sequence[int],
    exprs: Sequence[relay.Expr],
    graph: FoldGraph,
    values: Values,
    failures: Dict[int, str],
    strict: bool,
) -> int:
    """Evaluate ``exprs`` in one run into ``values``; on failure, one by one. Returns the runs made."""
    try:
        results: List[relay.Expr] = _run(exprs)
        runs = 1
    except Exception:  # noqa: BLE001 - any failure (a kernel's Python TypeError too): isolate below
        # Find the culprits one by one; the rest of the run still folds.
        results, runs = [], 1
        for node_id, expr in zip(node_ids, exprs):
            runs += 1
            try:
                results.append(_run([expr])[0])
            except Exception as err:
                failures[node_id] = f"{type(err).__name__}: {_last_line(err)}"
                results.append(None)
                if strict:
                    node = graph.nodes[node_id]
                    raise evaluation_error(node, failures[node_id]) from err
    for node_id, value in zip(node_ids, results):
        if value is not None:
            values[node_id] = value
    return runs


def _last_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
