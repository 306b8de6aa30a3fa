"""What TVM's Relax importers need to bring quantized weights in the form the fold policies read.

Two importers of TVM 0.27 fall short on quantized models:

- ``tvm.relax.frontend.torch.from_exported_program`` rejects the quantize / dequantize ops of
  PyTorch's PT2E flow: :func:`torch_quantized_convert_map` maps them to Relax Q/DQ;
- ``tvm.relax.frontend.tflite.from_tflite`` fails on int8 weights behind a DEQUANTIZE operator:
  :class:`TFLiteOperatorConverter` fixes that one converter.

ONNX QDQ models import as they are (``from_onnx(model, keep_params_in_input=False)``);
:func:`from_onnx_with_layers` also gives the layer (ONNX node) of each call, the names
``fold-guard`` prints, for a report to use. After the
import, ``keep-qdq-weights`` or ``qdq-accelerator`` keeps each weight as
``dequantize(<int8 constant>)``, and ``annotate`` writes that into the module for any later
pipeline. Nothing here is imported by ``import fold_guard``.

>>> import fold_guard.relax.frontends as frontends
>>> sorted(frontends.__all__)
['TFLiteOperatorConverter', 'from_onnx_with_layers', 'torch_quantized_convert_map']
"""

from ._onnx import from_onnx_with_layers
from ._tflite import TFLiteOperatorConverter
from ._torch import torch_quantized_convert_map

__all__ = ["TFLiteOperatorConverter", "from_onnx_with_layers", "torch_quantized_convert_map"]
