"""The models and backends the examples, the benchmarks and the tests share; not part of fold_guard.

- :mod:`_common.onnx_models`: the reproducible QDQ ONNX models (``onnx.helper``, quantized by
  ``onnxruntime.quantization``), their Relax and Relay imports, and reference runners;
- :mod:`_common.relax_byoc` and :mod:`_common.relay_byoc`: two fictional BYOC backends (pattern
  tables, partitioning, offload counts) for Relax and Relay;
- :mod:`_common.codegen_input`: a pass instrument that keeps the module VM codegen receives;
- :mod:`_common.tflite_writer`, :mod:`_common.tflite_models`, :mod:`_common.tflite_weights`: small
  TFLite models written without TensorFlow (full int8; int8 or float16 weights behind
  DEQUANTIZE) and their NumPy references;
- :mod:`_common.torch_models`: small PyTorch models quantized with PT2E (``torchao``);
- :mod:`_common.lowbit_llm`: low-bit LLM weights whose dequantize is a kernel (``call_tir``):
  MLC-LLM's q4f16_1 layout in a Llama-style decoder block, and TVM's CUTLASS-style
  encode / decode flow with the weight as a parameter.

They need the ``examples`` extra (``onnx``, ``onnxruntime``, ``tflite``; the PyTorch models need
``torch`` and ``torchao``, which the ``test`` extra installs) and live here, not in the installed
package. An example run as ``python examples/<name>.py`` finds them as ``_common`` (``examples/``
is its ``sys.path[0]``); the benchmarks put ``examples/`` on ``sys.path`` themselves, and pytest
does through ``pythonpath`` in ``pyproject.toml``.
"""
