"""The model-zoo networks the ``onnx`` wheel ships, for the benchmark and the tests.

``onnx.backend.test.case.model.collect_testcases()`` lists nine real CNNs (kind ``"real"``: the
light versions in ``onnx/backend/test/data/light/light_<name>.onnx``), whose weights are
``ConstantOfShape`` subgraphs of one value each: Relax's ``from_onnx`` imports every weight as
``broadcast_to(<one-element constant>, shape)``, which folds into 4.7-548 MiB of float32. The
wheel also ships small PyTorch-exported models (``data/pytorch-converted/test_*/model.onnx``).
Nothing here downloads anything: every file is inside the installed ``onnx`` package.
"""

from __future__ import annotations

import os
from typing import Dict, List

import onnx

__all__ = [
    "LARGE_ZOO_MODELS",
    "SMALL_ZOO_MODELS",
    "ZOO_MODELS",
    "load_zoo_model",
    "pytorch_converted_models",
    "zoo_model_paths",
]

#: The nine real models, smallest folded result first (MiB of float32 once folded, measured:
#: ``bench/bench_model_zoo.py``).
ZOO_MODELS = (
    "squeezenet",
    "shufflenet",
    "inception_v1",
    "densenet121",
    "inception_v2",
    "resnet50",
    "bvlc_alexnet",
    "zfnet512",
    "vgg19",
)
#: The three whose folded weights are hundreds of MiB (the tests' ``model_zoo_large`` marker).
LARGE_ZOO_MODELS = ("bvlc_alexnet", "zfnet512", "vgg19")
SMALL_ZOO_MODELS = tuple(name for name in ZOO_MODELS if name not in LARGE_ZOO_MODELS)

_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def zoo_model_paths() -> Dict[str, str]:
    """Model name -> its file, from ONNX's own list of test cases (kind ``"real"``)."""
    from onnx.backend.test.case import model

    root = os.path.dirname(os.path.dirname(onnx.__file__))
    return {
        case.model_name: os.path.join(root, case.url)
        for case in model.collect_testcases()
        if case.kind == "real"
    }


def load_zoo_model(name: str) -> onnx.ModelProto:
    """One of :data:`ZOO_MODELS`, loaded from the ``onnx`` wheel."""
    return onnx.load(zoo_model_paths()[name])


def pytorch_converted_models() -> List[str]:
    """The files of the wheel's PyTorch-exported models, by name (``test_Conv2d``, ...)."""
    base = os.path.join(_DATA, "pytorch-converted")
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    return [
        os.path.join(base, name, "model.onnx")
        for name in names
        if os.path.isfile(os.path.join(base, name, "model.onnx"))
    ]
