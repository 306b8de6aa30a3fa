"""An operator corpus nobody here wrote: ONNX's node tests, stock FoldConstant against ours (Relax).

Every case of ``onnx.backend.test.case.node`` (tests/support/onnx_conformance.py), its inputs
bound as initializers and imported with ``from_onnx(model, keep_params_in_input=False)``, is
folded by stock ``relax.transform.FoldConstant()`` and by ``fold_guard.relax.fold``. Each case
that imports must come out as one of (RFC.md, guarantees 1, 2, 4 and 7):

* structurally equal to stock's output, constants' bytes included; where stock's folded outputs
  equal the case's reference outputs, ours do (they are the same bytes);
* stock raises on it: ours folds the rest and keeps the call stock cannot evaluate, with a reason;
* a call's kernel would compute from memory nobody wrote: ours keeps it
  (``Reason.UNWRITTEN_MEMORY``), and nothing else differs;

and the input module is not changed. The full lane runs a sample (every 25th case and the ones
that once diverged); the whole corpus (1,884 cases, 1,124 of which import; about two minutes)
is its own lane::

    .venv/bin/python -m pytest -m conformance tests/relax/test_onnx_conformance.py -s
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pytest
import tvm
import tvm_ffi
from support import onnx_conformance as corpus
from tvm import relax

import fold_guard.relax as fgr
from fold_guard.relax import _compat


def _import(model: object) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(model, keep_params_in_input=False)


def _constant_outputs(mod: tvm.IRModule) -> Optional[List[np.ndarray]]:
    """``main``'s outputs when the fold made all of them constants, else None."""
    body = mod["main"].body
    result = body.body if isinstance(body, relax.SeqExpr) else body
    fields = result.fields if isinstance(result, relax.Tuple) else [result]
    if not all(_compat.is_constant(f) for f in fields):
        return None
    return [_compat.constant_array(f).numpy() for f in fields]


RELAX = corpus.Side(
    name="Relax",
    import_model=_import,
    stock=relax.transform.FoldConstant(),
    fold=fgr.fold,
    equal=lambda a, b: bool(tvm_ffi.structural_equal(a, b)),
    constant_outputs=_constant_outputs,
    save=tvm.ir.save_json,
)


@pytest.mark.slow
def test_a_sample_of_onnx_node_tests_folds_as_stock_or_as_intended():
    tally = corpus.run(corpus.sample(corpus.node_cases()), RELAX)
    assert not tally.failures, "\n\n".join(tally.failures)
    seen = set(tally.outcomes.values())
    # every kind the corpus has is in the sample, so each stays covered in CI
    assert {corpus.EQUAL, corpus.STOCK_RAISES, corpus.UNWRITTEN} <= seen, tally.figure()


@pytest.mark.conformance
def test_every_onnx_node_test_folds_as_stock_or_as_intended():
    tally = corpus.run(corpus.node_cases(), RELAX)
    assert not tally.failures, "\n\n".join(tally.failures)
