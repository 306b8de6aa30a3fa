"""Which ONNX node each call of a Relax import comes from, and which layer it belongs to.

Relax's ONNX importer names every binding ``lv<N>`` and records no spans, so the node is recovered
while importing: :func:`record_onnx_conversions` notes the expression each node's converter
returns (and the expressions it was given), and :func:`attribute_bindings` reads ``main``
afterwards.

- **Source** (the ``source`` of a report's decision): the node whose converter built the call. A
  converter's returned expression is the node's result; the calls it emits on the way (a Conv's
  ``conv2d`` and bias ``reshape``, a Gemm's weight ``permute_dims``) are the node's too. A result
  is often bound only where a later node reads it (a weight's ``dequantize`` inside the Conv's
  conversion), so nothing here trusts binding order: a result is found by identity, and every
  other binding belongs to the node whose bindings use it.
- **Layer** (what the report, the verbose lines and the picture show): the source, except for a
  call computed from constants only (a weight or bias and its Q/DQ, reshape or transpose), whose
  layer is the one layer all its users belong to: the Conv that owns the weight. A constant
  shared by several layers keeps its source.

Invariant: nothing here changes the module or decides anything; unknown bindings stay unnamed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple

__all__ = ["Conversions", "LayerNames", "attribute_bindings", "record_onnx_conversions"]

#: ``(function, binding label) -> name``
LayerNames = Mapping[Tuple[str, str], str]


class Conversions(List[Tuple[str, Any]]):
    """``(node name, converted expression)`` per converted node; ``inputs[i]`` are the input
    expressions conversion ``i`` was given (an initializer's constant, in file order)."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: List[Tuple[Any, ...]] = []


@contextlib.contextmanager
def record_onnx_conversions() -> Iterator[Conversions]:
    """Record ``(ONNX node name, converted expression)`` for every node Relax's importer converts.

    The importer's per-node conversion method is wrapped for the duration of one import and
    restored afterwards. Where that method does not exist (another TVM release), nothing is
    recorded and the report names bindings only.
    """
    recorded = Conversions()
    try:
        from tvm.relax.frontend.onnx import onnx_frontend

        importer = onnx_frontend.ONNXGraphImporter
        original = importer._convert_operator
    except (ImportError, AttributeError):
        yield recorded
        return

    def convert(self: Any, op_name: str, inputs: Any, attrs: Dict[str, Any], opset: int) -> Any:
        given = tuple(inputs)  # before the converter, which may rewrite its list
        result = original(self, op_name, inputs, attrs, opset)
        name = attrs.get("tvm_custom", {}).get("name") or op_name
        recorded.append((name, result))
        recorded.inputs.append(given)
        return result

    importer._convert_operator = convert
    try:
        yield recorded
    finally:
        importer._convert_operator = original


def attribute_bindings(
    mod: Any, recorded: List[Tuple[str, Any]]
) -> Tuple[Dict[Tuple[str, str], str], Dict[Tuple[str, str], str]]:
    """``(layers, sources)`` of ``main``'s bindings, each keyed by ``("main", label)``."""
    from tvm import relax

    from .. import _compat

    if "main" not in [gvar.name_hint for gvar in mod.functions] or not recorded:
        return {}, {}
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return {}, {}
    results: Dict[Any, str] = {}
    for name, expr in recorded:
        for part in _parts(expr, relax):
            results.setdefault(part, name)
    bindings = [binding for block in func.body.blocks for binding in block.bindings]
    labels = [_compat.var_name(binding.var) for binding in bindings]
    index_of = {binding.var: i for i, binding in enumerate(bindings)}
    reads: List[List[int]] = [
        [index_of[var] for var in _vars_read(binding.value, relax) if var in index_of]
        for binding in bindings
    ]
    users: List[List[int]] = [[] for _ in bindings]
    for i, inputs in enumerate(reads):
        for j in inputs:
            users[j].append(i)

    # Step 1: each node's results, by identity.
    source: List[Optional[str]] = [
        _lookup(results, binding.var) or _lookup(results, binding.value) for binding in bindings
    ]
    # Step 2: the other bindings belong to the node whose bindings read them; users come later
    # in the function, so one backward sweep settles chains of helpers.
    for i in reversed(range(len(bindings))):
        if source[i] is None:
            source[i] = next((source[u] for u in users[i] if source[u] is not None), None)
    # Step 3: layers. A binding is constant-only when it reads no run-time parameter and no
    # binding that does (weights passed as parameters, from num_input on, count as constants);
    # such a binding takes the layer its users agree on.
    num_input = (
        func.attrs["num_input"] if func.attrs is not None and "num_input" in func.attrs else None
    )
    params: Set[Any] = set(func.params[: int(num_input)] if num_input is not None else func.params)
    constant_only = [False] * len(bindings)
    for i, binding in enumerate(bindings):
        read = _vars_read(binding.value, relax)
        constant_only[i] = not any(var in params for var in read) and all(
            constant_only[j] for j in reads[i]
        )
    layer: List[Optional[str]] = list(source)
    for i in reversed(range(len(bindings))):
        if constant_only[i] and users[i]:
            owners = {layer[u] for u in users[i]}
            if len(owners) == 1 and None not in owners:
                layer[i] = owners.pop()
    layers = {("main", labels[i]): name for i, name in enumerate(layer) if name}
    sources = {("main", labels[i]): name for i, name in enumerate(source) if name}
    return layers, sources


def _parts(expr: Any, relax: Any) -> List[Any]:
    """A converter's result, and each field of a tuple it returned (each node output)."""
    if isinstance(expr, relax.Tuple):
        return [expr, *expr.fields]
    return [expr]


def _vars_read(value: Any, relax: Any) -> List[Any]:
    """The variables a normalized binding's value reads (its arguments are leaves or tuples)."""
    found: List[Any] = []
    stack = [value]
    while stack:
        expr = stack.pop()
        if isinstance(expr, relax.Var):
            found.append(expr)
        elif isinstance(expr, relax.Call):
            stack.extend(expr.args)
        elif isinstance(expr, relax.Tuple):
            stack.extend(expr.fields)
        elif isinstance(expr, relax.TupleGetItem):
            stack.append(expr.tuple_value)
    return found


def _lookup(names: Mapping[Any, str], expr: Any) -> Optional[str]:
    # TVM objects hash and compare by identity of the underlying node, which is what is wanted:
    # the very expression the converter returned.
    try:
        return names.get(expr)
    except TypeError:
        return None
