"""ONNX into Relax with the name of the layer each call comes from, as the command names them.

TVM's ``from_onnx`` names every binding ``lv<N>`` and records no spans; ``fold-guard`` recovers
each call's ONNX node while it imports (:mod:`._layers`) and reports by layer. This
is that import for Python: the same module ``from_onnx`` gives, and the names, so that
``result.report.summary(layers=layers)`` reads as ``fold-guard inspect`` prints.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import tvm

__all__ = ["from_onnx_with_layers"]


def from_onnx_with_layers(
    model: Any, **from_onnx_options: Any
) -> Tuple[tvm.IRModule, Dict[Tuple[str, str], str]]:
    """``tvm.relax.frontend.onnx.from_onnx(model, **from_onnx_options)``, and per call the
    layer (ONNX node) it comes from, keyed ``(function, binding name)``.

    The names are the command line's (``fold-guard inspect``): the node whose converter made the
    call, or for a weight's dequantize, transpose or reshape the layer that reads it. Pass them
    to a report: ``fold(mod).report.summary(layers=layers)``, ``.to_dict(layers=layers)``.

    Examples
    --------
    >>> import sys
    >>> sys.path.insert(0, "examples")
    >>> from _common.onnx_models import make_qdq_cnn
    >>> import fold_guard.relax as fgr
    >>> from fold_guard.relax.frontends import from_onnx_with_layers
    >>> mod, layers = from_onnx_with_layers(make_qdq_cnn(), keep_params_in_input=False)
    >>> report = fgr.fold(mod, policy="keep-qdq-weights").report
    >>> [line for line in report.summary(layers=layers).splitlines() if "keep-dequantize" in line]
    ['  keep-dequantize-of-integer-constant: kept 10 (+5 kept because an input was): conv0, conv1, conv2, conv3, fc']
    """
    from tvm.relax.frontend.onnx import from_onnx

    from ._layers import attribute_bindings, record_onnx_conversions

    with record_onnx_conversions() as recorded:
        mod = from_onnx(model, **from_onnx_options)
    layers, _ = attribute_bindings(mod, recorded)
    return mod, dict(layers)
