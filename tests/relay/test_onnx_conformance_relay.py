"""An operator corpus nobody here wrote: ONNX's node tests, stock FoldConstant against ours (Relay).

The Relay side of tests/relax/test_onnx_conformance.py, with the node tests of the onnx release
hhb's importer takes (onnx 1.16.2): each case imported with
``relay.frontend.from_onnx(model, freeze_params=True)`` three ways (its inputs bound as
initializers; as ONNX ships it, graph inputs left run-time parameters; only the first input
run-time), folded by stock ``relay.transform.FoldConstant()`` and by ``fold_guard.relay.fold``.
Each case that imports must be structurally equal to stock's output, or a listed intended
difference (RFC.md, guarantee 7), with the input module unchanged. Relay's stock pass decides
constness on the graph (every argument a constant), so a kernel that reads only a run-time
input's shape (``zeros_like(x)``) does not fold there, and neither does it in ours. A sample in
the full lane; the whole corpus is its own lane::

    .venv310/bin/python -m pytest -m conformance tests/relay/test_onnx_conformance_relay.py -s
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pytest
import tvm
from support import onnx_conformance as corpus
from tvm import relay

import fold_guard.relay as fgr


def _import(model: object) -> tvm.IRModule:
    mod, _ = relay.frontend.from_onnx(model, freeze_params=True)
    return relay.transform.InferType()(mod)


def _constant_outputs(mod: tvm.IRModule) -> Optional[List[np.ndarray]]:
    """``main``'s outputs when the fold made all of them constants, else None."""
    body = mod["main"].body
    fields = body.fields if isinstance(body, relay.Tuple) else [body]
    if not all(isinstance(f, relay.Constant) for f in fields):
        return None
    return [f.data.numpy() for f in fields]


RELAY = corpus.Side(
    name="Relay",
    import_model=_import,
    stock=relay.transform.FoldConstant(),
    fold=fgr.fold,
    equal=lambda a, b: bool(tvm.ir.structural_equal(a, b)),
    constant_outputs=_constant_outputs,
    save=tvm.ir.save_json,
)


@pytest.mark.slow
def test_a_sample_of_onnx_node_tests_folds_as_stock_or_as_intended():
    tally = corpus.run(corpus.sample(corpus.node_cases()), RELAY)
    assert not tally.failures, "\n\n".join(tally.failures)
    assert corpus.EQUAL in tally.outcomes.values(), tally.figure()
    # the recursive let (ONNX Scan / Loop) that once crashed the walk
    assert tally.outcomes.get("test_scan_sum") == corpus.EQUAL, tally.figure()


@pytest.mark.slow
@pytest.mark.parametrize("binding", [corpus.AS_SHIPPED, corpus.FIRST_RUNTIME])
def test_a_sample_with_run_time_inputs_folds_as_stock_or_as_intended(binding):
    tally = corpus.run(corpus.sample(corpus.node_cases()), RELAY, binding)
    assert not tally.failures, "\n\n".join(tally.failures)
    # the cases whose Relax kernels read only an input's shape: equal here too
    for name in ("test_eyelike_without_dtype", "test_shrink_hard"):
        assert tally.outcomes[name] == corpus.EQUAL, (name, tally.figure())


@pytest.mark.conformance
@pytest.mark.parametrize("binding", corpus.BINDINGS)
def test_every_onnx_node_test_folds_as_stock_or_as_intended(binding):
    tally = corpus.run(corpus.node_cases(), RELAY, binding)
    assert not tally.failures, "\n\n".join(tally.failures)
