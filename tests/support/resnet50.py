"""The ResNet-50-shaped QDQ model the command's real-model tests share, built once per process.

``bench/real_models.py`` builds it in code (onnx.helper, then onnxruntime's ``quantize_static``:
int8 weight initializers behind ``DequantizeLinear``, uint8 activations): 53 ``Conv`` + 1
``Gemm``, 25.5 M parameters, 437 Relax calls after ``from_onnx``. Building it takes about 15 s,
so the bytes are kept for the other tests of the same run.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

__all__ = ["write_resnet50"]

_BENCH = Path(__file__).resolve().parents[2] / "bench"


@functools.cache
def _resnet50_bytes() -> bytes:
    if str(_BENCH) not in sys.path:
        sys.path.insert(0, str(_BENCH))
    import real_models

    return real_models.build_quantized("resnet50", "int8").SerializeToString()


def write_resnet50(folder: Path) -> Path:
    """Write the model to ``folder/resnet50.onnx`` and return its path."""
    path = folder / "resnet50.onnx"
    path.write_bytes(_resnet50_bytes())
    return path
