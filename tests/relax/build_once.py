"""Build several versions of a Relax module's ``main`` in one ``tvm.compile`` and run them all.

A compile costs seconds and is most of a numerical test's time; the versions (unfolded, folded
under each policy, annotated) are independent functions, so one module holds them all.
"""

from __future__ import annotations

from typing import Dict, Mapping

import numpy as np
import tvm
from tvm import relax

__all__ = ["run_mains"]


def run_mains(mods: Mapping[str, tvm.IRModule], *inputs: np.ndarray) -> Dict[str, np.ndarray]:
    """``main`` of every module (by key) on ``inputs``; a one-tensor tuple result is unwrapped.

    Each module must have only ``main``; its key becomes the function's name in the joint build.
    """
    functions = {}
    for key, mod in mods.items():
        assert [gvar.name_hint for gvar in mod.functions] == ["main"], key
        name = "v_" + "".join(ch if ch.isalnum() else "_" for ch in key)
        functions[name] = mod["main"].with_attr("global_symbol", name)
    names = dict(zip(mods, functions))
    vm = relax.VirtualMachine(tvm.compile(tvm.IRModule(functions), target="llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    outputs = {}
    for key, name in names.items():
        out = vm[name](*args)
        if not hasattr(out, "numpy"):  # a tuple (PyTorch imports return one)
            (out,) = out
        outputs[key] = out.numpy()
    return outputs
