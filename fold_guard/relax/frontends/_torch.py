"""PT2E's quantize / dequantize ops as Relax ``quantize`` / ``dequantize``, for ``from_exported_program``.

PyTorch's standard quantization flow (PT2E: ``prepare_pt2e`` / ``convert_pt2e``, in ``torchao``
since torch 2.6) writes ``quantized_decomposed.{quantize,dequantize}_per_{tensor,channel}`` calls
around float ops, which TVM 0.27's ``from_exported_program`` does not know. Each maps to one
Relax op with the same arithmetic (``clip(round(x / scale) + zero_point)``;
``(q - zero_point) * scale``), so a PT2E model imports in the QDQ form the fold policies read:
weights as ``dequantize(<int8 constant>)``, or ``quantize(<float32 constant>)`` where
``convert_pt2e(..., fold_quantize=False)`` left it.

What the ops carry beyond Relax's attributes is honoured exactly:

- ``quant_min`` / ``quant_max`` narrower than the dtype (XNNPACK's symmetric weights use
  [-127, 127], not int8's [-128, 127]) add a ``clip`` after the ``quantize``;
- float16 / bfloat16 input is quantized in float32, as PyTorch computes it;
- per-channel zero points (int64 in PyTorch; Relax takes int32) get an ``astype``, a missing one
  is 0, and ``out_dtype`` other than float32 casts the float32 dequantized result.

The only difference left is the division: PyTorch multiplies by ``1 / scale``, Relax divides by
``scale``, so a value on a rounding boundary may land one integer step apart.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from tvm import relax

from ..._core.errors import UnsupportedIRError

__all__ = ["TORCH_QUANTIZED_OPS", "torch_quantized_convert_map"]

#: A ``custom_convert_map`` entry: ``(fx.Node, importer) -> relax.Var``.
Converter = Callable[[Any, Any], relax.Var]

#: Integer dtypes ``relax.quantize`` produces, and their value ranges.
_QUANTIZED_RANGE: Dict[str, Tuple[int, int]] = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
}
#: ``relax.dequantize`` also reads int32 (biases quantized at the accumulator's scale).
_DEQUANTIZABLE = frozenset(_QUANTIZED_RANGE) | {"int32"}
_HALF_FLOATS = frozenset({"float16", "bfloat16"})


def _quantize_per_tensor(node: Any, importer: Any) -> relax.Var:
    return _Call(node, importer).quantize(per_channel=False)


def _quantize_per_channel(node: Any, importer: Any) -> relax.Var:
    return _Call(node, importer).quantize(per_channel=True)


def _dequantize_per_tensor(node: Any, importer: Any) -> relax.Var:
    return _Call(node, importer).dequantize(per_channel=False)


def _dequantize_per_channel(node: Any, importer: Any) -> relax.Var:
    return _Call(node, importer).dequantize(per_channel=True)


#: ``fx.Node.target.__name__`` of each PT2E op the map converts (the keys of the map).
TORCH_QUANTIZED_OPS: Dict[str, Converter] = {
    "quantize_per_tensor.default": _quantize_per_tensor,
    "quantize_per_tensor.tensor": _quantize_per_tensor,
    "dequantize_per_tensor.default": _dequantize_per_tensor,
    "dequantize_per_tensor.tensor": _dequantize_per_tensor,
    "quantize_per_channel.default": _quantize_per_channel,
    "dequantize_per_channel.default": _dequantize_per_channel,
}


def torch_quantized_convert_map() -> Dict[str, Converter]:
    """A ``custom_convert_map`` that imports PT2E's quantize / dequantize ops as Relax Q/DQ.

    Maps ``quantized_decomposed.{quantize,dequantize}_per_tensor`` (``.default`` and ``.tensor``
    overloads) and ``{quantize,dequantize}_per_channel`` to ``relax.quantize`` /
    ``relax.dequantize`` with the op's scale, zero point, axis and dtype; a ``quant_min`` /
    ``quant_max`` narrower than the dtype adds a ``clip`` (see the module docstring). A new dict
    each call, so it can be merged with other converters.

    Returns
    -------
    dict of str to callable
        For ``tvm.relax.frontend.torch.from_exported_program(..., custom_convert_map=...)``.

    Raises
    ------
    fold_guard.UnsupportedIRError
        During the import, for a quantized dtype Relax has no op for (``quantize`` to int32, say),
        or a ``quant_min`` / ``quant_max`` outside the dtype, naming the node.

    Notes
    -----
    Import with ``keep_params_as_input=False`` (the default) so weights and quantization
    parameters become constants the fold policies see. Then ``keep-qdq-weights`` or
    ``qdq-accelerator`` keeps each weight as ``dequantize(<int8 constant>)``.

    Examples
    --------
    >>> from fold_guard.relax.frontends import torch_quantized_convert_map
    >>> sorted(torch_quantized_convert_map())[:2]
    ['dequantize_per_channel.default', 'dequantize_per_tensor.default']

    With a model converted by ``torchao``'s ``convert_pt2e``::

        from tvm.relax.frontend.torch import from_exported_program
        exported = torch.export.export(converted, (example,))
        mod = from_exported_program(exported, custom_convert_map=torch_quantized_convert_map())
        mod = fold_guard.relax.FoldConstant("keep-qdq-weights")(mod)
    """
    return dict(TORCH_QUANTIZED_OPS)


class _Call:
    """One PT2E quantize / dequantize node: its arguments as Relax values, and the ops to emit."""

    def __init__(self, node: Any, importer: Any) -> None:
        self.node = node
        self.importer = importer
        self.bb = importer.block_builder

    # Arguments -------------------------------------------------------------------------------

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """Argument ``index`` (or keyword ``name``), an fx.Node read as its Relax value."""
        if index < len(self.node.args):
            value = self.node.args[index]
        else:
            value = self.node.kwargs.get(name, default)
        if hasattr(value, "op") and hasattr(value, "target") and value in self.importer.env:
            return self.importer.env[value]
        return value

    def where(self) -> str:
        return f"{self.node.name} = {_op_name(self.node)}"

    def torch_dtype(self, index: int, name: str) -> str:
        value = self.arg(index, name)
        text = str(value)
        if not text.startswith("torch."):
            raise UnsupportedIRError(
                f"{self.where()}: argument {name} is {value!r}, not a torch dtype"
            )
        return text[len("torch.") :]

    # Emitting -----------------------------------------------------------------------------------

    def quantize(self, *, per_channel: bool) -> relax.Var:
        x, scale, zero_point = self.arg(0, "input"), self.arg(1, "scale"), self.arg(2, "zero_point")
        axis = int(self.arg(3, "axis")) if per_channel else -1
        first = 4 if per_channel else 3
        quant_min, quant_max = (
            int(self.arg(first, "quant_min")),
            int(self.arg(first + 1, "quant_max")),
        )
        dtype = self.torch_dtype(first + 2, "dtype")
        if dtype not in _QUANTIZED_RANGE:
            raise UnsupportedIRError(
                f"{self.where()}: quantizing to {dtype} has no Relax op (relax.quantize makes "
                f"{', '.join(_QUANTIZED_RANGE)}); hint: quantize that tensor to int8 or int16 in "
                "the PyTorch quantizer's config"
            )
        low, high = _QUANTIZED_RANGE[dtype]
        if not low <= quant_min <= quant_max <= high:
            raise UnsupportedIRError(
                f"{self.where()}: quant_min={quant_min}, quant_max={quant_max} is not a range "
                f"inside {dtype} [{low}, {high}]"
            )
        # PyTorch quantizes float16 / bfloat16 input in float32.
        if _dtype(x) in _HALF_FLOATS:
            x = self.bb.emit(relax.op.astype(x, dtype="float32"))
        quantized = self.bb.emit(
            relax.op.quantize(
                x, self.scale(scale), self.zero_point(zero_point), axis=axis, out_dtype=dtype
            )
        )
        if (quant_min, quant_max) == (low, high):
            return quantized
        # relax.quantize clips to the dtype; a narrower range (XNNPACK's [-127, 127]) clips again.
        return self.bb.emit(relax.op.clip(quantized, quant_min, quant_max))

    def dequantize(self, *, per_channel: bool) -> relax.Var:
        x, scale, zero_point = self.arg(0, "input"), self.arg(1, "scale"), self.arg(2, "zero_point")
        axis = int(self.arg(3, "axis")) if per_channel else -1
        dtype = self.torch_dtype(6 if per_channel else 5, "dtype")
        if dtype not in _DEQUANTIZABLE or _dtype(x) != dtype:
            raise UnsupportedIRError(
                f"{self.where()}: dequantizing a {_dtype(x)} tensor declared {dtype}; relax."
                f"dequantize reads {', '.join(sorted(_DEQUANTIZABLE))} (the declared dtype must be "
                "the tensor's)"
            )
        out_dtype = self.node.kwargs.get("out_dtype")  # keyword-only in every overload
        dequantized = self.bb.emit(
            relax.op.dequantize(
                x, self.scale(scale), self.zero_point(zero_point), axis=axis, out_dtype="float32"
            )
        )
        target = "float32" if out_dtype is None else str(out_dtype).replace("torch.", "")
        if target == "float32":
            return dequantized
        # PyTorch computes in float32 and then casts (Relax's float16 dequantize would clip).
        return self.bb.emit(relax.op.astype(dequantized, dtype=target))

    def scale(self, value: Any) -> relax.Expr:
        if isinstance(value, (int, float)):
            return relax.const(float(value), "float32")
        return (
            value
            if _dtype(value) == "float32"
            else self.bb.emit(relax.op.astype(value, dtype="float32"))
        )

    def zero_point(self, value: Optional[Any]) -> relax.Expr:
        if value is None:  # dequantize_per_channel's zero_points may be absent: zero
            return relax.const(0, "int32")
        if isinstance(value, int):
            return relax.const(value, "int32")
        return (
            value
            if _dtype(value) == "int32"
            else self.bb.emit(relax.op.astype(value, dtype="int32"))
        )


def _dtype(expr: Any) -> str:
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


def _op_name(node: Any) -> str:
    return f"quantized_decomposed.{getattr(node.target, '__name__', node.target)}"
