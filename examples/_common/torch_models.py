"""Small PyTorch models quantized with PT2E (``torchao``), exported for ``from_exported_program``.

PT2E is PyTorch's standard post-training quantization flow: ``torch.export`` the float model,
``prepare_pt2e`` with a quantizer (observers go in), run calibration inputs, ``convert_pt2e``
(observers become ``quantized_decomposed`` quantize / dequantize calls around the float ops).
Since torch 2.6 it lives in ``torchao``; the XNNPACK quantizer (symmetric int8 weights in
[-127, 127], per output channel here; asymmetric int8 activations) ships in ``torchao``'s testing
package, the maintained copy being ExecuTorch's. ``convert_pt2e(fold_quantize=True)``, the
default, stores each weight as an int8 constant behind ``dequantize_per_channel``;
``fold_quantize=False`` leaves ``quantize_per_channel(<float32 weight>)`` in the graph.

Models (:data:`MODELS`), all on a (1, 3, 8, 8) or (1, 32) input:

- ``conv``: conv 3x3 -> relu;
- ``linear``: linear -> relu -> linear;
- ``depthwise``: conv 1x1 -> depthwise conv 3x3 -> relu;
- ``residual``: conv -> relu -> conv, plus the input -> relu -> flatten -> linear.

Examples
--------
>>> MODELS
('conv', 'linear', 'depthwise', 'residual')

``quantize_model("conv")`` gives the exported program TVM imports: its calls are ``conv2d``,
``relu`` and PT2E's ``quantize_per_tensor`` / ``dequantize_per_tensor`` / ``dequantize_per_channel``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import numpy as np

__all__ = ["MODELS", "QuantizedTorchModel", "quantize_model"]

#: Calibration batches run through the prepared model.
CALIBRATION_BATCHES = 8


@dataclass(frozen=True)
class QuantizedTorchModel:
    """One quantized model: the converted module, its export, and the example input."""

    name: str
    converted: Any  # torch.fx.GraphModule: runs the quantized model in PyTorch
    exported: Any  # torch.export.ExportedProgram of ``converted``: what TVM imports
    example: np.ndarray

    def run_torch(self, x: np.ndarray) -> np.ndarray:
        """The converted model's output on ``x`` (PyTorch's reference kernels)."""
        import torch

        with torch.no_grad():
            return self.converted(torch.from_numpy(x)).numpy()


def _models() -> Dict[str, Tuple[Callable[[], Any], Tuple[int, ...]]]:
    import torch
    from torch import nn

    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x))

    class Linear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(32, 16), nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x)))

    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pointwise = nn.Conv2d(3, 8, 1)
            self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.depthwise(self.pointwise(x)))

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 3, 3, padding=1)
            self.conv2 = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(3 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv2(torch.relu(self.conv1(x)))
            return self.fc(torch.relu(y + x).flatten(1))

    image, vector = (1, 3, 8, 8), (1, 32)
    return {
        "conv": (Conv, image),
        "linear": (Linear, vector),
        "depthwise": (Depthwise, image),
        "residual": (Residual, image),
    }


#: The model names :func:`quantize_model` knows.
MODELS = ("conv", "linear", "depthwise", "residual")


def quantize_model(name: str, *, seed: int = 0, fold_quantize: bool = True) -> QuantizedTorchModel:
    """Build model ``name`` with seeded weights, quantize it with PT2E, and export the result.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`.
    seed : int, optional
        Seeds the weights (``torch.manual_seed``) and the calibration and example inputs.
    fold_quantize : bool, optional
        ``convert_pt2e``'s option: True stores weights as int8 constants, False keeps
        ``quantize_per_channel(<float32 weight>)`` in the graph.
    """
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.testing.pt2e._xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    build, shape = _models()[name]
    torch.manual_seed(seed)
    model = build().eval()
    rng = np.random.default_rng(seed)
    example = rng.standard_normal(shape).astype(np.float32)
    with warnings.catch_warnings():
        # torchao 0.18 marks its copy deprecated in favour of ExecuTorch's; it is the same quantizer.
        warnings.filterwarnings("ignore", "XNNPACKQuantizer is deprecated", UserWarning)
        quantizer = XNNPACKQuantizer()
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(
        torch.export.export(model, (torch.from_numpy(example),)).module(), quantizer
    )
    with torch.no_grad():
        for _ in range(CALIBRATION_BATCHES):
            prepared(torch.from_numpy(rng.standard_normal(shape).astype(np.float32)))
    converted = convert_pt2e(prepared, fold_quantize=fold_quantize)
    exported = torch.export.export(converted, (torch.from_numpy(example),))
    return QuantizedTorchModel(name, converted, exported, example)
