"""Describe the op calls of Relay functions as a :class:`FoldGraph`, the way stock folding sees them.

Stock ``relay.transform.FoldConstant`` (``src/relay/transforms/fold_constant.cc``) is a
post-order mutator. A call of an ``Op`` folds when every argument is, after folding its own
operands, a constant or a tuple of constants; except that

* calls without arguments are kept (``ones(shape)`` would only grow the module),
* stateful ops, ``device_copy`` and non-computational ops are kept, and QNN ops (non-computational
  with a QNN canonicalization) are kept unless ``fold_qnn=True``,
* ``shape_of`` / ``vm.shape_of`` / ``ndarray_size`` fold whenever their operand's *type* has a
  static shape, whatever the operand's value,
* nothing inside a ``Primitive`` function folds, and calls of functions are never evaluated.

It also rewrites independently of folding: a let-bound constant is inlined, ``(a, b).0`` becomes
``a``, and an ``If`` on a constant condition becomes the chosen branch. It looks through one
``on_device`` annotation (PlanDevices' device hint, identity at run time) wherever it asks
whether a value is a constant or a tuple: ``on_device(<const>)`` is a constant, and the
annotation stays in place (a let-bound one is inlined with it, ``on_device((a, b)).0`` becomes
``on_device(a)``). Here such an ``on_device`` is no node at all: its value is its operand's.
The walk (:func:`walk_relay`) mirrors all of that as data (:class:`Source` per value, one
:class:`FoldNode` per op call, in a :class:`Translation`) so the planner decides and ``_rewrite``
applies; it reads the IR and never changes the module (it lowers nothing in TVM's sense).

The walk is iterative: Relay graphs of a few hundred blocks are deeper than Python's recursion
limit.
"""

from __future__ import annotations

from typing import (
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import tvm
from tvm import relay

from ..._core.errors import UnsupportedIRError
from ..._core.graph import Annotation, FoldNode, InputKind, NodeInput, TensorInfo
from ..._core.reasons import Reason
from .._ops import FOLD_ALLOW_OP, FOLD_BARRIER_OP
from .._read import (
    checked_type,
    children,
    on_device_body,
    postorder,
    short,
    static_shape,
    tensor_infos,
)
from .._sites import (
    CallSite,
    ConstSource,
    NodeSource,
    RuntimeSource,
    SiteKind,
    Source,
    Translation,
    TupleSource,
)
from .._stock import (
    NDARRAY_SIZE_OP,
    SHAPE_OPS,
    is_primitive,
    is_true,
    static_shape_value,
    stock_rules,
)
from .zero_size import reads_memory_nobody_wrote

__all__ = ["walk_relay"]


class _Walker:
    def __init__(self, known_conditions: Mapping[relay.If, bool]) -> None:
        self.known_conditions = known_conditions
        self.conditions: Dict[relay.If, NodeSource] = {}
        self.nodes: List[FoldNode] = []
        self.sites: List[CallSite] = []
        self.sources: Dict[relay.Expr, Source] = {}
        self.let_value: Dict[relay.Var, relay.Expr] = {}
        # In let form a call has a name, which messages use; in graph form it is "%<node id>".
        self.let_name: Dict[relay.Expr, str] = {}
        self.used_labels: set = set()
        self._op_attr_cache: Dict[Tuple[str, str], object] = {}

    def op_attr(self, op: tvm.ir.Op, attr: str) -> object:
        key = (op.name, attr)
        if key not in self._op_attr_cache:
            try:
                self._op_attr_cache[key] = op.get_attr(attr)
            except tvm.TVMError:  # no op ever registered this attribute
                self._op_attr_cache[key] = None
        return self._op_attr_cache[key]

    def walk_function(self, name: str, func: relay.Function) -> None:
        for param in func.params:
            self.sources[param] = RuntimeSource(param.name_hint)
        for expr in postorder(func.body, self._children):
            self.sources[expr] = self._source_of(name, expr)

    def _children(self, expr: relay.Expr) -> Sequence[relay.Expr]:
        if isinstance(expr, relay.Function) and not is_primitive(expr):
            for param in expr.params:
                self.sources[param] = RuntimeSource(param.name_hint)
        if isinstance(expr, relay.Let):
            self.let_value[expr.var] = expr.value
            # ``let %t = on_device(add(...))``: the add is what %t names.
            named = _looked_through(expr.value)
            self.let_name.setdefault(expr.value if named is None else named, expr.var.name_hint)
        return children(expr)

    def _source_of(self, function: str, expr: relay.Expr) -> Source:
        if isinstance(expr, relay.Constant):
            return ConstSource(expr)
        if isinstance(expr, relay.Var):
            bound = self.let_value.get(expr)
            if bound is None:
                return self.sources.get(expr, RuntimeSource(expr.name_hint))
            # The bound value precedes the let body in post-order, so its source is known, except
            # inside the value itself: a recursive function (ONNX Loop / Scan's ``%while_loop``)
            # calls the variable it is bound to. Stock inlines a let-bound value only once it is
            # a single constant: a let-bound tuple stays a variable, and so does anything read
            # through it.
            value = self.sources.get(bound)
            if isinstance(value, ConstSource) or (
                isinstance(value, NodeSource) and self._is_tensor(value)
            ):
                return value
            return RuntimeSource(expr.name_hint)
        if isinstance(expr, relay.Tuple):
            return TupleSource(tuple(self.sources[f] for f in expr.fields))
        if isinstance(expr, relay.TupleGetItem):
            inner = self.sources[expr.tuple_value]
            if isinstance(inner, TupleSource):
                return inner.fields[expr.index]
            if isinstance(inner, NodeSource) and inner.index is None:
                return NodeSource(inner.node, expr.index)
            return RuntimeSource(f"{_label_of(inner)}.{expr.index}")
        if isinstance(expr, relay.Let):
            return self.sources[expr.body]
        if isinstance(expr, relay.If):
            cond = self.sources[expr.cond]
            if isinstance(cond, ConstSource) or expr in self.known_conditions:
                truth = (
                    is_true(cond.constant)
                    if isinstance(cond, ConstSource)
                    else self.known_conditions[expr]
                )
                return self.sources[expr.true_branch if truth else expr.false_branch]
            if isinstance(cond, NodeSource):
                self.conditions[expr] = cond
            return RuntimeSource("if")
        if isinstance(expr, relay.Call):
            body = _looked_through(expr)
            if body is not None:
                return self.sources[body]  # a device hint: its value is its operand's
            if isinstance(expr.op, tvm.ir.Op):
                return self._walk_call(function, expr)
            return RuntimeSource(f"call of {short(expr.op, 40)}")
        if isinstance(expr, relay.Function):
            return RuntimeSource("function")
        return RuntimeSource(type(expr).__name__)

    def _is_tensor(self, source: NodeSource) -> bool:
        if source.index is not None:
            return True
        call = self.sites[source.node].call
        return isinstance(checked_type(call), relay.TensorType)

    def _walk_call(self, function: str, call: relay.Call) -> Source:
        node_id = len(self.nodes)
        op: tvm.ir.Op = call.op
        # Each attribute read of a TVM object is an FFI call: read the op's name once per call.
        op_name = str(op.name)
        args = tuple(self.sources[arg] for arg in call.args)
        inputs: List[NodeInput] = []
        kind = SiteKind.EVALUATE
        static_value: Optional[Tuple[int, ...]] = None
        unfoldable: Optional[Reason] = None
        detail = ""
        default_fold = True
        default_rule = ""
        annotation = {FOLD_BARRIER_OP: Annotation.BARRIER, FOLD_ALLOW_OP: Annotation.ALLOW}.get(
            op_name, Annotation.NONE
        )

        type_source: Optional[int] = None
        shape_value = self._static_shape_value(op_name, call)
        if shape_value is not None:
            # The value comes from the operand's type, not its data: no inputs to wait for. The
            # planner still keeps it when that operand is a barrier's output.
            kind, static_value = SiteKind.SHAPE, shape_value
            type_source = args[0].node if isinstance(args[0], NodeSource) else None
        else:
            for index, arg in enumerate(args):
                inputs.extend(self._inputs_of(arg, _arg_label(op_name, index)))
            if annotation is not Annotation.NONE and not isinstance(
                checked_type(call.args[0]), relay.TensorType
            ):
                # A barrier over a tuple passes type inference (its relation is Identity) but does
                # not build, and the stock pass crashes on an allow over one.
                raise UnsupportedIRError(
                    f"function {function}: {self._label(call, node_id)} = {op.name} annotates tensors only, but "
                    f"its operand is a {type(checked_type(call.args[0])).__name__}; hint: annotate each "
                    "tensor field (relay.Tuple([fold_barrier(a), fold_barrier(b)])) or the tensor that feeds it"
                )
            if annotation is Annotation.ALLOW:
                kind = SiteKind.ALLOW
            elif annotation is Annotation.NONE:
                unfoldable, detail, default_fold, default_rule = stock_rules(op, call, self.op_attr)
                unwritten = "" if unfoldable else reads_memory_nobody_wrote(call)
                if unwritten:
                    unfoldable, detail = Reason.UNWRITTEN_MEMORY, unwritten

        outputs = tensor_infos(checked_type(call))
        node = FoldNode(
            id=node_id,
            op=op_name,
            label=self._label(call, node_id),
            function=function,
            inputs=tuple(inputs),
            outputs=outputs,
            attrs=_attrs_dict(call.attrs),
            annotation=annotation,
            unfoldable=unfoldable,
            unfoldable_detail=detail,
            default_fold=default_fold,
            default_rule=default_rule,
            type_source=type_source,
        )
        self.nodes.append(node)
        self.sites.append(CallSite(node_id, function, call, kind, args, static_value))
        return NodeSource(node_id)

    def _label(self, call: relay.Call, node_id: int) -> str:
        # ToANormalForm names every binding "x": a repeated name would make messages ambiguous.
        name = self.let_name.get(call)
        if name is None or name in self.used_labels:
            return f"%{node_id}"
        self.used_labels.add(name)
        return f"%{name}"

    def _static_shape_value(self, op_name: str, call: relay.Call) -> Optional[Tuple[int, ...]]:
        if op_name not in _SHAPE_VALUE_OPS or len(call.args) != 1:
            return None
        return static_shape_value(op_name, static_shape(checked_type(call.args[0])))

    def _inputs_of(self, source: Source, label: str) -> List[NodeInput]:
        if isinstance(source, TupleSource):
            return [
                inp
                for i, field in enumerate(source.fields)
                for inp in self._inputs_of(field, f"{label}.{i}")
            ]
        if isinstance(source, ConstSource):
            return [NodeInput(InputKind.CONSTANT, label, _constant_info(source.constant))]
        if isinstance(source, NodeSource):
            outputs = self.nodes[source.node].outputs
            index = 0 if source.index is None else source.index
            info = (
                outputs[index]
                if index < len(outputs) and (source.index is not None or len(outputs) == 1)
                else None
            )
            return [NodeInput(InputKind.NODE, self.nodes[source.node].label, info, source.node)]
        return [NodeInput(InputKind.RUNTIME, source.label)]


def _looked_through(expr: relay.Expr) -> Optional[relay.Expr]:
    """The operand of an ``on_device`` that stock folding sees through (one level), else None.

    In ``on_device(on_device(x))`` only the inner one is seen through; the outer one is an
    ordinary call of a non-computational op, which never folds.
    """
    body = on_device_body(expr)
    return body if body is not None and on_device_body(body) is None else None


def _constant_info(constant: relay.Constant) -> TensorInfo:
    data = constant.data
    return TensorInfo.of(str(data.dtype), tuple(int(d) for d in data.shape))


def _label_of(source: Source) -> str:
    if isinstance(source, NodeSource):
        return f"%{source.node}"
    if isinstance(source, RuntimeSource):
        return source.label
    return "tuple"


#: The ops whose value stock folds from their operand's static type (``static_shape_value``).
_SHAPE_VALUE_OPS = frozenset(SHAPE_OPS + (NDARRAY_SIZE_OP,))


def _arg_label(op_name: str, index: int) -> str:
    return f"{op_name} argument {index}"


def _attrs_dict(attrs: Optional[tvm.ir.Attrs]) -> Dict[str, object]:
    if attrs is None or not hasattr(attrs, "keys"):
        return {}
    result: Dict[str, object] = {}
    for key in attrs.keys():
        value = attrs[key]
        if isinstance(value, (tvm.tir.IntImm, tvm.tir.FloatImm)):
            value = value.value
        elif isinstance(value, tvm.runtime.String):
            value = str(value)
        result[str(key)] = value
    return result


def walk_relay(
    mod: tvm.IRModule,
    functions: Sequence[Tuple[str, relay.Function]],
    known_conditions: Optional[Mapping[relay.If, bool]] = None,
) -> Translation:
    """Describe every op call of ``functions`` (already type-checked) as FoldNodes.

    An ``If`` on a condition computed from constants is a run-time value until the condition's
    value is known; ``known_conditions`` gives those values (found by evaluating a first plan),
    and each such ``If`` then stands for its chosen branch, as in stock folding.
    """
    walker = _Walker(known_conditions or {})
    for name, func in functions:
        walker.walk_function(name, func)
    read = {name: (mod.get_global_var(name), func) for name, func in functions}
    return Translation(tuple(walker.nodes), tuple(walker.sites), read, dict(walker.conditions))
