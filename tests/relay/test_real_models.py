"""Whole models from ``tvm.relay.testing`` (random weights bound as constants, no download).

    frontend-style module (params bound, SimplifyInference)
        ==> stock FoldConstant()                       == fold_guard FoldConstant()   (structure)
        ==> built and run: folded output == unfolded output (to float rounding)

The corpus covers the rules one by one; these are the shapes real imports have: hundreds of
calls, batch-norms turned into constant arithmetic on the weights, recurrent cells, and
transposed convolutions, all folded in a few evaluation runs.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm.relay import testing

import fold_guard.relay as fgr

TARGET = "llvm -mtriple=x86_64-linux-gnu"

WORKLOADS: Dict[str, Callable[[], Tuple[tvm.IRModule, dict]]] = {
    "resnet18": lambda: testing.resnet.get_workload(
        num_layers=18, batch_size=1, image_shape=(3, 32, 32)
    ),
    "mobilenet": lambda: testing.mobilenet.get_workload(batch_size=1, image_shape=(3, 32, 32)),
    "dcgan": lambda: testing.dcgan.get_workload(batch_size=1, ngf=16),
    "lstm": lambda: testing.lstm.get_workload(iterations=3, num_hidden=8),
}


def _frontend_style(name: str) -> tvm.IRModule:
    mod, params = WORKLOADS[name]()
    func = relay.build_module.bind_params_by_name(mod["main"], params)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    return relay.transform.SimplifyInference()(mod)


def _run(mod: tvm.IRModule, seed: int = 0) -> list:
    with tvm.transform.PassContext(opt_level=1):
        lib = relay.build(mod, target=TARGET)
    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    rng = np.random.default_rng(seed)
    for param in mod["main"].params:
        shape = [int(d) for d in param.checked_type.shape]
        module.set_input(
            param.name_hint, rng.standard_normal(shape).astype(param.checked_type.dtype)
        )
    module.run()
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_real_model_folds_exactly_like_stock(name: str) -> None:
    mod = _frontend_style(name)
    stock = relay.transform.FoldConstant()(mod)
    result = fgr.fold(mod)
    tvm.ir.assert_structural_equal(result.mod, stock, map_free_vars=True)
    changed = not tvm.ir.structural_equal(stock, mod, map_free_vars=True)
    assert result.modified == changed
    assert bool(result.plan.folded) == changed
    if changed:
        # a few levels, not one run per call: the point of batching
        assert 0 < result.report.evaluation_runs < len(result.plan.folded)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dcgan", "resnet18"])
def test_real_model_runs_to_the_same_output_after_folding(name: str) -> None:
    mod = _frontend_style(name)
    folded = fgr.FoldConstant()(mod)
    for before, after in zip(_run(mod), _run(folded)):
        # Folding moves float arithmetic from fused run-time kernels into per-op constant
        # evaluation (as stock does), so results agree to rounding, not bit for bit.
        np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-5)
