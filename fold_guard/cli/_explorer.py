"""Where each call of an imported model sits in Model Explorer's graph of the model file.

The ids themselves are :mod:`._node_data`'s (TVM-free); this module connects them to the Relax
module an import produced, the way :mod:`fold_guard.relax.frontends._layers` names layers: by
the identity of what the importer built for each node.

- ONNX: the conversions ``record_onnx_conversions`` (:mod:`fold_guard.relax.frontends._layers`)
  noted; an initializer is the very constant (or, with weights as parameters, the variable) the
  importer made for it and handed to its readers' converters.
- TFLite: :func:`tflite_converter` is fold_guard's TFLite ``op_converter`` noting, per operator
  index, the expression its converter returned (normalized as TVM's own loop does next, which
  leaves that object as the binding's value) and the constants made from the operator's
  constant input tensors (``ExprTable.new_const`` with the tensor's name). The module it imports
  is the plain import's (a test compares them).

Calls then read constants by identity in ``main``'s bindings. Nothing here changes a module or
decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._node_data import ExplorerGraph, match_conversions, onnx_explorer_ids, tflite_explorer_ids

if TYPE_CHECKING:
    from ..relax.frontends._layers import Conversions

__all__ = [
    "TFLiteRecording",
    "onnx_explorer_graph",
    "tflite_converter",
    "tflite_explorer_graph",
    "tflite_layers",
]


def onnx_explorer_graph(model: Any, mod: Any, recorded: Conversions) -> ExplorerGraph:
    """Model Explorer's graph id, the node of each of ``main``'s calls and the initializers each reads."""
    from ..relax.frontends._layers import attribute_bindings

    names = [node.name for node in model.graph.node]
    graph_id, ids = onnx_explorer_ids(model.graph.name, names)
    matched = match_conversions(
        [name for name, _ in recorded], names, [node.op_type for node in model.graph.node]
    )
    renamed = [(ids[j], expr) for (_, expr), j in zip(recorded, matched) if j is not None]
    _, calls = attribute_bindings(mod, renamed)
    initializers = {init.name for init in model.graph.initializer}
    made: Dict[Any, List[str]] = {}
    for given, j in zip(recorded.inputs, matched):
        if j is None:
            continue
        for name, expr in zip(model.graph.node[j].input, given):
            if name in initializers and expr is not None:
                _add(made, expr, f"[value] {name}")
    return ExplorerGraph(graph_id, calls, _constant_reads(mod, made))


def _add(made: Dict[Any, List[str]], expr: Any, node_id: str) -> None:
    ids = made.setdefault(expr, [])
    if node_id not in ids:
        ids.append(node_id)


@dataclass
class TFLiteRecording:
    """What :func:`tflite_converter` noted while importing subgraph 0."""

    #: ``(operator index, normalized converted expression)``
    results: List[Tuple[int, Any]] = field(default_factory=list)
    #: ``(operator index, tensor name, constant)`` for each constant made from a tensor
    constants: List[Tuple[int, str, Any]] = field(default_factory=list)


def tflite_converter(recording: TFLiteRecording) -> type:
    """fold_guard's TFLite ``op_converter`` (:class:`~fold_guard.relax.frontends.TFLiteOperatorConverter`)
    noting each operator's conversion into ``recording``."""
    from ..relax.frontends import TFLiteOperatorConverter

    class RecordingConverter(TFLiteOperatorConverter):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            subgraph = self.subgraph
            index_of = {
                subgraph.Operators(i)._tab.Pos: i for i in range(subgraph.OperatorsLength())
            }
            current: List[Optional[int]] = [None]
            new_const = self.exp_tab.new_const

            def noting_new_const(*a: Any, source_name: Any = None, **k: Any) -> Any:
                const = new_const(*a, source_name=source_name, **k)
                if source_name is not None and current[0] is not None:
                    name = source_name.decode() if isinstance(source_name, bytes) else source_name
                    recording.constants.append((current[0], str(name), const))
                return const

            def noting(convert: Any) -> Any:
                def run(op: Any) -> Any:
                    current[0] = index_of.get(op._tab.Pos)
                    try:
                        result = convert(op=op)
                    finally:
                        index = current[0]
                        current[0] = None
                    if result is None or index is None:
                        return result
                    # TVM's loop normalizes the result next; normalizing an already normalized
                    # expression returns it as it is, so this object becomes the binding's value
                    result = self.bb.normalize(result)
                    recording.results.append((index, result))
                    return result

                return run

            # TVM's converter sets convert_map in __init__ (mypy sees no type for it: TVM is untyped)
            converters: Dict[str, Any] = self.convert_map  # type: ignore[has-type]
            self.exp_tab.new_const = noting_new_const
            self.convert_map = {name: noting(fn) for name, fn in converters.items()}

    return RecordingConverter


def tflite_explorer_graph(model: Any, mod: Any, recording: TFLiteRecording) -> ExplorerGraph:
    """Model Explorer's graph (subgraph 0: the one Relax imports as ``main``) of a ``tflite.Model``."""
    subgraph = model.Subgraphs(0)
    count = subgraph.OperatorsLength()
    ops = [subgraph.Operators(i) for i in range(count)]
    inputs = [list(op.InputsAsNumpy()) if op.InputsLength() else [] for op in ops]
    outputs = [list(op.OutputsAsNumpy()) if op.OutputsLength() else [] for op in ops]
    graph_inputs = list(subgraph.InputsAsNumpy()) if subgraph.InputsLength() else []
    graph_outputs = list(subgraph.OutputsAsNumpy()) if subgraph.OutputsLength() else []
    const_ids = tflite_explorer_ids(count, inputs, outputs, graph_inputs, graph_outputs)
    from ..relax.frontends._layers import attribute_bindings

    _, calls = attribute_bindings(mod, [(str(index), expr) for index, expr in recording.results])
    made: Dict[Any, List[str]] = {}
    for index, name, const in recording.constants:
        for tensor in inputs[index]:
            if tensor in const_ids and _tensor_name(subgraph, tensor) == name:
                _add(made, const, const_ids[tensor])
    return ExplorerGraph(_tflite_graph_id(model, subgraph), calls, _constant_reads(mod, made))


def tflite_layers(model: Any, mod: Any, recording: TFLiteRecording) -> Tuple[Any, Any]:
    """``(layers, sources)`` of ``main``'s calls, each operator named by its first output tensor."""
    from ..relax.frontends._layers import attribute_bindings

    subgraph = model.Subgraphs(0)
    named = []
    for index, expr in recording.results:
        op = subgraph.Operators(index)
        if op.OutputsLength():
            named.append((_tensor_name(subgraph, int(op.Outputs(0))), expr))
    return attribute_bindings(mod, named)


def _tensor_name(subgraph: Any, tensor: int) -> str:
    name = subgraph.Tensors(tensor).Name()
    return name.decode() if isinstance(name, bytes) else str(name or "")


def _tflite_graph_id(model: Any, subgraph: Any) -> str:
    """The subgraph's name, else its signature key, else ``main`` (the adapter's rule)."""
    name = subgraph.Name()
    if name:
        return name.decode() if isinstance(name, bytes) else str(name)
    for i in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(i)
        if signature.SubgraphIndex() == 0:
            key = signature.SignatureKey()
            if key:
                return key.decode() if isinstance(key, bytes) else str(key)
            break
    return "main"


def _constant_reads(
    mod: Any, made: Mapping[Any, Sequence[str]]
) -> Dict[Tuple[str, str], Tuple[str, ...]]:
    """``(function, label) -> constant nodes`` for each of ``main``'s calls reading a made constant."""
    from tvm import relax

    from ..relax import _compat

    if not made or "main" not in [gvar.name_hint for gvar in mod.functions]:
        return {}
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return {}
    reads: Dict[Tuple[str, str], Tuple[str, ...]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding.value, relax.Call):
                continue
            found: List[str] = []
            stack = list(binding.value.args)
            while stack:
                arg = stack.pop()
                if isinstance(arg, relax.Tuple):
                    stack.extend(arg.fields)
                    continue
                for node_id in _lookup(made, arg):
                    if node_id not in found:
                        found.append(node_id)
            if found:
                reads[("main", _compat.var_name(binding.var))] = tuple(found)
    return reads


def _lookup(made: Mapping[Any, Sequence[str]], expr: Any) -> Sequence[str]:
    # TVM objects hash and compare by the identity of the node: the very object the importer made
    try:
        return made.get(expr, ())
    except TypeError:
        return ()
