"""Write small TFLite models in code, without TensorFlow, from tensors and operators.

TensorFlow would be a 274 MB wheel only to write a few small files. The ``tflite`` package the
TVM frontends read models with also ships the generated FlatBuffers *builder* functions of the
TFLite schema (``ModelStart``, ``TensorAddQuantization``, ...: module-level functions of the
``tflite.<Table>`` modules, which the package's reader classes of the same name shadow as
attributes). :class:`TFLiteWriter` lays a model out as TFLite's converter does: buffer 0 is the
empty buffer every activation refers to, each constant tensor has a buffer of its own, and every
operator code fills both the deprecated int8 field and the int32 one.

Examples
--------
>>> import numpy as np
>>> writer = TFLiteWriter()
>>> x = writer.tensor("x", (1, 4), "float32")
>>> w = writer.tensor("w", (2, 4), "float32", np.ones((2, 4), np.float32))
>>> y = writer.tensor("y", (1, 2), "float32")
>>> writer.operator("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
>>> model = writer.finish(inputs=[x], outputs=[y])
>>> model[4:8]
b'TFL3'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Quant", "TFLiteWriter"]


@dataclass(frozen=True)
class Quant:
    """Affine quantization of one tensor: per tensor, or per channel along ``axis``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0

    @staticmethod
    def of(scale: Sequence[float], zero_point: Sequence[int], axis: int = 0) -> Quant:
        return Quant(np.asarray(scale, np.float32), np.asarray(zero_point, np.int64), axis)


def _schema(table: str) -> Any:
    """The generated module ``tflite.<table>`` (builder functions), not the reader class."""
    return importlib.import_module(f"tflite.{table}")


@dataclass
class _TensorSpec:
    name: str
    shape: Tuple[int, ...]
    dtype: str
    buffer: int
    quant: Optional[Quant]


@dataclass
class _OperatorSpec:
    code: str
    inputs: Tuple[int, ...]
    outputs: Tuple[int, ...]
    options_table: Optional[str]
    options: Mapping[str, int]


@dataclass
class TFLiteWriter:
    """Collect tensors and operators, then serialize them as one single-subgraph model."""

    _buffers: List[bytes] = field(default_factory=lambda: [b""])
    _tensors: List[_TensorSpec] = field(default_factory=list)
    _operators: List[_OperatorSpec] = field(default_factory=list)

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        data: Optional[np.ndarray] = None,
        quant: Optional[Quant] = None,
    ) -> int:
        """Add a tensor (a constant when ``data`` is given); return its index.

        ``dtype`` is a ``tflite.TensorType`` name in lower case (``"int8"``, ``"float16"``).
        """
        buffer = 0
        if data is not None:
            if tuple(data.shape) != tuple(shape) or str(data.dtype) != dtype:
                raise ValueError(
                    f"tensor {name}: data is {data.dtype}{data.shape}, declared {dtype}{tuple(shape)}"
                )
            self._buffers.append(np.ascontiguousarray(data).tobytes())
            buffer = len(self._buffers) - 1
        self._tensors.append(_TensorSpec(name, tuple(int(d) for d in shape), dtype, buffer, quant))
        return len(self._tensors) - 1

    def operator(
        self,
        code: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options_table: Optional[str] = None,
        **options: int,
    ) -> None:
        """Add an operator of ``tflite.BuiltinOperator.<code>``; ``-1`` is an absent input.

        ``options_table`` names its options table (``"Conv2DOptions"``) and ``options`` its
        scalar fields (``Padding=tflite.Padding.SAME``); unset fields keep the schema defaults.
        """
        self._operators.append(
            _OperatorSpec(code, tuple(inputs), tuple(outputs), options_table, dict(options))
        )

    def finish(
        self, *, inputs: Sequence[int], outputs: Sequence[int], description: str = "fold_guard test"
    ) -> bytes:
        """The ``.tflite`` file content."""
        import flatbuffers
        import tflite

        builder = flatbuffers.Builder(4096)

        def vector(start: Any, values: Sequence[Any], prepend: Any) -> int:
            start(builder, len(values))
            for value in reversed(values):
                prepend(value)
            return int(builder.EndVector())

        def int_vector(start: Any, values: Sequence[int]) -> int:
            return vector(start, [int(v) for v in values], builder.PrependInt32)

        def offsets(start: Any, values: Sequence[int]) -> int:
            return vector(start, list(values), builder.PrependUOffsetTRelative)

        buffer_t, tensor_t, quant_t = (
            _schema(n) for n in ("Buffer", "Tensor", "QuantizationParameters")
        )
        buffers = []
        for data in self._buffers:
            data_offset = builder.CreateByteVector(data) if data else None
            buffer_t.BufferStart(builder)
            if data_offset is not None:
                buffer_t.BufferAddData(builder, data_offset)
            buffers.append(buffer_t.BufferEnd(builder))

        def quantization(q: Quant) -> int:
            scale = vector(
                quant_t.QuantizationParametersStartScaleVector,
                [float(s) for s in q.scale],
                builder.PrependFloat32,
            )
            zero = vector(
                quant_t.QuantizationParametersStartZeroPointVector,
                [int(z) for z in q.zero_point],
                builder.PrependInt64,
            )
            quant_t.QuantizationParametersStart(builder)
            quant_t.QuantizationParametersAddScale(builder, scale)
            quant_t.QuantizationParametersAddZeroPoint(builder, zero)
            quant_t.QuantizationParametersAddQuantizedDimension(builder, q.axis)
            return int(quant_t.QuantizationParametersEnd(builder))

        tensors = []
        for spec in self._tensors:
            name_offset = builder.CreateString(spec.name)
            shape_offset = int_vector(tensor_t.TensorStartShapeVector, spec.shape)
            q_offset = quantization(spec.quant) if spec.quant is not None else None
            tensor_t.TensorStart(builder)
            tensor_t.TensorAddShape(builder, shape_offset)
            tensor_t.TensorAddType(builder, getattr(tflite.TensorType, spec.dtype.upper()))
            tensor_t.TensorAddBuffer(builder, spec.buffer)
            tensor_t.TensorAddName(builder, name_offset)
            if q_offset is not None:
                tensor_t.TensorAddQuantization(builder, q_offset)
            tensors.append(tensor_t.TensorEnd(builder))

        opcode_t = _schema("OperatorCode")
        codes: Dict[str, int] = {}
        opcodes = []
        for spec in self._operators:
            if spec.code in codes:
                continue
            code = getattr(tflite.BuiltinOperator, spec.code)
            codes[spec.code] = len(opcodes)
            opcode_t.OperatorCodeStart(builder)
            # Old readers look at the int8 field, new ones at the int32 one: fill both (as TFLite does).
            opcode_t.OperatorCodeAddDeprecatedBuiltinCode(builder, min(code, 127))
            opcode_t.OperatorCodeAddBuiltinCode(builder, code)
            opcode_t.OperatorCodeAddVersion(builder, 1)
            opcodes.append(opcode_t.OperatorCodeEnd(builder))

        operator_t = _schema("Operator")
        operators = []
        for spec in self._operators:
            options_offset = None
            if spec.options_table is not None:
                table = _schema(spec.options_table)
                getattr(table, f"{spec.options_table}Start")(builder)
                for name, value in spec.options.items():
                    getattr(table, f"{spec.options_table}Add{name}")(builder, value)
                options_offset = getattr(table, f"{spec.options_table}End")(builder)
            inputs_offset = int_vector(operator_t.OperatorStartInputsVector, spec.inputs)
            outputs_offset = int_vector(operator_t.OperatorStartOutputsVector, spec.outputs)
            operator_t.OperatorStart(builder)
            operator_t.OperatorAddOpcodeIndex(builder, codes[spec.code])
            operator_t.OperatorAddInputs(builder, inputs_offset)
            operator_t.OperatorAddOutputs(builder, outputs_offset)
            if options_offset is not None:
                options_type = getattr(tflite.BuiltinOptions, spec.options_table or "")
                operator_t.OperatorAddBuiltinOptionsType(builder, options_type)
                operator_t.OperatorAddBuiltinOptions(builder, options_offset)
            operators.append(operator_t.OperatorEnd(builder))

        subgraph_t, model_t = _schema("SubGraph"), _schema("Model")
        tensors_offset = offsets(subgraph_t.SubGraphStartTensorsVector, tensors)
        inputs_offset = int_vector(subgraph_t.SubGraphStartInputsVector, inputs)
        outputs_offset = int_vector(subgraph_t.SubGraphStartOutputsVector, outputs)
        operators_offset = offsets(subgraph_t.SubGraphStartOperatorsVector, operators)
        name_offset = builder.CreateString("main")
        subgraph_t.SubGraphStart(builder)
        subgraph_t.SubGraphAddTensors(builder, tensors_offset)
        subgraph_t.SubGraphAddInputs(builder, inputs_offset)
        subgraph_t.SubGraphAddOutputs(builder, outputs_offset)
        subgraph_t.SubGraphAddOperators(builder, operators_offset)
        subgraph_t.SubGraphAddName(builder, name_offset)
        subgraph = subgraph_t.SubGraphEnd(builder)

        opcodes_offset = offsets(model_t.ModelStartOperatorCodesVector, opcodes)
        subgraphs_offset = offsets(model_t.ModelStartSubgraphsVector, [subgraph])
        buffers_offset = offsets(model_t.ModelStartBuffersVector, buffers)
        description_offset = builder.CreateString(description)
        model_t.ModelStart(builder)
        model_t.ModelAddVersion(builder, 3)
        model_t.ModelAddOperatorCodes(builder, opcodes_offset)
        model_t.ModelAddSubgraphs(builder, subgraphs_offset)
        model_t.ModelAddDescription(builder, description_offset)
        model_t.ModelAddBuffers(builder, buffers_offset)
        builder.Finish(model_t.ModelEnd(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())
