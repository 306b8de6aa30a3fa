"""The fast engine computes the reference engine's bits, and a fault never changes a fold silently.

    fold(m, reference_engine=True)  ==  fold(m)  ==  fold(m) with any one mechanism switched off

The reference engine legalizes, builds and runs each folded call on its own, as the stock pass
does (``fold_guard/relax/_engine/reference.py``); it is the oracle for the fast engine's speed
mechanisms (shared kernels, ``-O0`` builds with guards, NumPy copies, row blocks, threads, the
kernel cache), compared here by ``tvm_ffi.structural_equal``, which compares constants' bytes
(NaN payloads included). Then a fault is injected into each fast mechanism in turn: the output
must still equal stock's, with the fallback counted in the report (RFC.md, guarantee 2).

White-box on purpose: it tests the engines' mechanisms, each switched off or given a fault
(``_engine``, ``_config``), a private mechanism.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import calls_module
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import PlanInvariantError, Reason
from fold_guard.relax import EngineOptions
from fold_guard.relax._config import resolve_options
from fold_guard.relax._engine import cache, fast, host, library, row_blocks, strategy
from fold_guard.relax._engine.reference import STOCK_SYMBOL

try:
    from tests.relax.corpus import BUILDERS
except ImportError:  # tests/ is not a package: pytest puts tests/relax on sys.path
    from corpus import BUILDERS

#: Every switch of the fast engine, each turned off on its own below.
MECHANISMS = {
    "host_copies": False,
    "quick_builds": False,
    "fills": False,
    "row_blocks": False,
    "striped_transposes": False,
    "pool_warm_up": False,
    "threads": 1,
    "cache_dir": None,
}


def _fast(tmp_path: Path, **changes: object) -> EngineOptions:
    return dataclasses.replace(EngineOptions(threads=2, cache_dir=tmp_path / "cache"), **changes)


def _same_fold(got: fgr.FoldResult, want: fgr.FoldResult) -> None:
    assert tvm_ffi.structural_equal(got.mod, want.mod), got.mod.script()
    assert [(d.label, d.reason) for d in got.plan.decisions] == [
        (d.label, d.reason) for d in want.plan.decisions
    ]
    assert got.report.fallbacks == ()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_fast_equals_reference_on_the_corpus(name) -> None:
    # Through the suite's kernel cache (conftest.py), which the corpus's other folds share: each
    # kernel is compiled once in the run, here or in test_equivalence.py, and loaded by the other.
    suite_cache = resolve_options().cache_dir
    assert suite_cache is not None, "conftest.py turns the kernel cache on"
    reference = fgr.fold(BUILDERS[name](), reference_engine=True)
    assert reference.report.kernels_cached == 0
    fast = EngineOptions(threads=2, cache_dir=suite_cache)
    _same_fold(fgr.fold(BUILDERS[name](), engine_options=fast), reference)


def _nan_makers(shape):
    zeros, minus_one = np.zeros(shape, "float32"), -np.ones(shape, "float32")
    return [
        relax.op.divide(relax.const(zeros), relax.const(zeros)),
        relax.op.log(relax.const(minus_one)),
        relax.op.sqrt(relax.const(minus_one)),
    ]


def test_nan_from_a_kernel_shared_between_shapes_has_the_reference_bits(tmp_path) -> None:
    """divide(0, 0), log(-1), sqrt(-1) at shapes (3,), (64,) and (5, 4): the 1-D calls of each
    op share one symbolic kernel (a rank is part of the signature, so the 2-D ones have theirs).

    x86 makes the NaN 0xFFC00000 at run time; LLVM's constant folding would give 0x7FC00000.
    """
    mod = calls_module(lambda: [c for s in ((3,), (5, 4), (64,)) for c in _nan_makers(s)])
    reference = fgr.fold(mod, reference_engine=True)
    folded = fgr.fold(mod, engine_options=_fast(tmp_path))
    assert folded.report.kernels_compiled == 6  # 3 ops x 2 ranks
    _same_fold(folded, reference)
    stock = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(folded.mod, stock)
    (tuple_binding,) = [b for b in stock["main"].body.blocks[0].bindings]
    payloads = {
        int(v)
        for field in tuple_binding.value.fields[1:]
        for v in field.value.numpy().reshape(-1).view("uint32")
    }
    assert payloads == {0xFFC00000}


def _mechanism_calls(weight_shape, seed: int):
    """Calls that use every mechanism: a transpose NumPy copies (in stripes when the weight is
    1024 x 2048), Q/DQ at -O0 with a guard, a 16 MiB dequantize in row blocks on the pool (a
    smaller one of the same signature makes its kernel symbolic, so it can split), exp, and
    fills: a 16 MiB ``broadcast_to`` of a one-element constant written in parts on the pool, read
    by a transpose (a fill too) and by exp (a kernel), and one only a transpose reads (never
    written); a ``concat`` of non-uniform parts is a data-movement kernel at -O0."""
    rng = np.random.default_rng(seed)

    def calls():
        weight = rng.standard_normal(weight_shape).astype("float32")
        table = rng.integers(-128, 128, (32768, 128), dtype="int8")
        scale, zero = relax.const(np.float32(0.02)), relax.const(np.int8(0))
        q = relax.op.quantize(relax.const(weight), scale, zero, axis=0)
        table_scale, table_zero = relax.const(np.float32(0.03)), relax.const(np.int8(1))
        seed_value = relax.const(np.array([0.25], "float32"))
        filled = relax.op.broadcast_to(seed_value, relax.ShapeExpr([2048, 2048]))
        lazy = relax.op.broadcast_to(seed_value, relax.ShapeExpr([64, 32]))
        return [
            relax.op.permute_dims(relax.const(weight)),
            relax.op.permute_dims(filled),
            relax.op.exp(filled),
            relax.op.permute_dims(lazy),
            relax.op.concat([relax.const(weight), relax.const(weight)], axis=0),
            relax.op.dequantize(q, scale, zero, axis=0),
            relax.op.dequantize(relax.const(table), table_scale, table_zero, axis=1),
            relax.op.dequantize(relax.const(table[:4096]), table_scale, table_zero, axis=1),
            relax.op.exp(relax.const(weight)),
        ]

    return calls


@pytest.fixture(scope="module")
def every_mechanism():
    """A module that uses every mechanism, and its reference fold."""
    mod = calls_module(_mechanism_calls((1024, 2048), 5))
    return mod, fgr.fold(mod, reference_engine=True)


@pytest.mark.slow
@pytest.mark.parametrize("switch", [None, *sorted(MECHANISMS)])
def test_each_mechanism_off_gives_the_same_bits(switch, every_mechanism, tmp_path) -> None:
    mod, reference = every_mechanism
    changes = {} if switch is None else {switch: MECHANISMS[switch]}
    _same_fold(fgr.fold(mod, engine_options=_fast(tmp_path, **changes)), reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_tiny"])
def test_fast_equals_reference_on_real_model_shapes(name, tmp_path) -> None:
    """bench/real_models.py at 1/8 width: the layer structure and kernel signatures of the
    real architectures (the benchmark checks the full-size ones against stock every run)."""
    import sys

    from _common.onnx_models import import_relax

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import real_models

    mod = import_relax(real_models.build_quantized(name, "float_weights", scale=8))
    reference = fgr.fold(mod, reference_engine=True)
    _same_fold(fgr.fold(mod, engine_options=_fast(tmp_path)), reference)


# --------------------------------------------------------------------------- fault injection


def _boom(*args: object, **kwargs: object) -> object:
    raise RuntimeError("injected fault")


#: Per fast mechanism: the (module, name) to replace with a function that raises.
FAULTS = {
    "host copy": (fast, "run_host"),
    "fill": (fast, "fill_parts"),
    "kernel build": (library.tvm.tirx, "build"),
    "row blocks": (row_blocks.RowBlocks, "arguments"),
    "guard": (strategy.Strategy, "target_for"),
    "kernel cache build": (cache.KernelCache, "build"),
    "cache lookup": (cache.KernelCache, "lookup"),
}


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted(FAULTS))
def test_a_fault_in_a_fast_mechanism_is_counted_and_changes_no_bit(
    where, tmp_path, monkeypatch, caplog
):
    mod = calls_module(_mechanism_calls((64, 32), 9))
    stock = relax.transform.FoldConstant()(mod)
    if where == "kernel build":
        real = tvm.tirx.build

        def build_only_for_the_reference(module, target=None, **kwargs):
            # the reference engine builds as stock does, under stock's symbol
            if STOCK_SYMBOL not in [gv.name_hint for gv in module.functions]:
                raise RuntimeError("injected fault")
            return real(module, target=target, **kwargs)

        monkeypatch.setattr(library.tvm.tirx, "build", build_only_for_the_reference)
    else:
        owner, name = FAULTS[where]
        monkeypatch.setattr(owner, name, _boom)
    with caplog.at_level(logging.INFO, logger="fold_guard"):
        result = fgr.fold(mod, engine_options=_fast(tmp_path))
    assert tvm_ffi.structural_equal(result.mod, stock), where
    assert all(d.reason is Reason.FOLDED for d in result.plan.decisions if d.label != "gv")
    assert result.report.fallbacks, "a fault is never silent"
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("reference engine" in m or "kernel cache" in m for m in logged), logged
    assert "fallback" in result.report.explain(verbose=False)


@pytest.mark.parametrize("strict", [False, True])
def test_a_folded_call_without_a_strategy_is_an_internal_error(tmp_path, monkeypatch, strict):
    """A broken invariant of the fast engine is raised, not rerun on the reference engine."""
    mod = calls_module(lambda: [relax.op.exp(relax.const(np.ones((2, 3), "float32")))])
    before = mod.script()
    monkeypatch.setattr(fast, "choose_strategies", lambda *a: {})
    with pytest.raises(PlanInvariantError, match="no strategy for folded call"):
        fgr.fold(mod, strict=strict, engine_options=_fast(tmp_path))
    assert mod.script() == before


def test_a_kernel_that_fails_for_stock_too_is_an_evaluation_failure(tmp_path) -> None:
    """take in fast mode past the table: undefined in the kernel, kept and reported, no rerun."""
    table = np.arange(8, dtype="float32").reshape(2, 4)
    mod = calls_module(
        lambda: [relax.op.take(relax.const(table), relax.const(np.array([5], "int64")), 0)]
    )
    result = fgr.fold(mod, engine_options=_fast(tmp_path))
    (failed,) = [d for d in result.plan.decisions if d.reason is Reason.EVAL_FAILED]
    assert "undefined" in failed.detail and result.report.fallbacks == ()
    assert isinstance(host.UndefinedResultError("x"), IndexError)
