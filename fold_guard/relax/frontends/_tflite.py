"""The smallest fix TVM 0.27's Relax TFLite importer needs for int8 weights behind DEQUANTIZE.

TFLite writes a weight-only quantized model's weights as int8 constant tensors that a DEQUANTIZE
operator turns into float32 inside the graph. ``OperatorConverter.convert_dequantize``
(``python/tvm/relax/frontend/tflite/tflite_frontend.py``) handles a float16 constant, but for any
other input it calls ``self.get_expr(input_tensor.tensor_idx)``, which only finds tensors that
are graph inputs or outputs of earlier operators: a constant tensor has no expression yet, and the
import fails with ``KeyError: '<tensor name>'``. ``get_tensor_expr``, which every other converter
uses, makes the constant first. :class:`TFLiteOperatorConverter` does just that for a constant
quantized input and leaves everything else to TVM's converter; once TVM makes that call, the
override changes nothing and can go.
"""

from __future__ import annotations

from typing import Any

from tvm import relax
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

__all__ = ["TFLiteOperatorConverter"]


class TFLiteOperatorConverter(OperatorConverter):
    """TVM's TFLite ``OperatorConverter`` with DEQUANTIZE of a quantized constant fixed.

    Pass it as ``op_converter`` to ``tvm.relax.frontend.tflite.from_tflite``: an int8 (or uint8,
    int16) constant behind a DEQUANTIZE then imports as ``relax.dequantize(<int8 constant>)``
    with the tensor's scale, zero point and axis, the QDQ weight form the fold policies keep.
    Every other operator, and DEQUANTIZE of a float16 constant or of an activation, is converted
    by TVM's own code.

    Examples
    --------
    >>> from tvm.relax.frontend.tflite import from_tflite
    >>> from fold_guard.relax.frontends import TFLiteOperatorConverter
    >>> TFLiteOperatorConverter.__mro__[1].__module__
    'tvm.relax.frontend.tflite.tflite_frontend'

    With a ``tflite.Model``::

        mod = from_tflite(model, shape_dict, dtype_dict, op_converter=TFLiteOperatorConverter)
    """

    def convert_dequantize(self, op: Any) -> relax.Expr:
        from tflite.TensorType import TensorType

        tensors = self.get_input_tensors(op)
        tensor = tensors[0]
        is_quantized_constant = (
            len(tensors) == 1
            and tensor.tensor.Type() != TensorType.FLOAT16
            and tensor.qnn_params
            and not self.has_expr(tensor.tensor_idx)
        )
        if not is_quantized_constant:
            return super().convert_dequantize(op)
        return self.dequantize(self.get_tensor_expr(tensor), tensor)
