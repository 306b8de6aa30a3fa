"""Test helpers for fold_guard: reproducible models and reference runners.

The submodules here are used by the test suite and the examples. They may depend on
packages from the ``test`` extra (``onnx``, ``onnxruntime``), which they import lazily.
"""

__all__ = []
