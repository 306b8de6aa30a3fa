"""The persistent kernel cache: a second fold compiles nothing, and the cache is safe to share.

    fold #1 (empty cache):  compile N kernels -> one library in the cache -> run
    fold #2 (same kernels): load the library          -> run     (compiled 0, cached N)

Every fold here is also checked structurally equal to the stock pass, so the constants computed
by cached kernels are the stock pass's bits.

White-box on purpose: it tests the kernel cache (``_engine.cache``, ``_config``), a private
mechanism.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import fold_guard.relax as fgr
from fold_guard import PreconditionError
from fold_guard.relax._config import CACHE_DIR_ENV, CACHE_MAX_BYTES_ENV, resolve_options
from fold_guard.relax._engine import cache as kernel_cache
from fold_guard.relax._engine.cache import KernelCache
from fold_guard.relax._engine.opt_level import QUICK_TARGET

REPO = Path(__file__).resolve().parents[2]


def _module(
    rows: int = 8, cols: int = 16, seed: int = 0, *, scalar_take: bool = False
) -> tvm.IRModule:
    """x + dequantize(quantize(W)) + exp(B): three kernels, all on constants.

    ``scalar_take`` adds ``exp(B)`` taken at a constant scalar index instead (a fourth kernel,
    and a call whose stock fold is decided with the scalar as a constant).
    """
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((rows, cols)).astype("float32"))
            q = bb.emit(
                relax.op.quantize(w, relax.const(0.05, "float32"), relax.const(0, "int8"), axis=0)
            )
            dq = bb.emit(
                relax.op.dequantize(q, relax.const(0.05, "float32"), relax.const(0, "int8"), axis=0)
            )
            e = bb.emit(
                relax.op.exp(relax.const(rng.standard_normal((rows, cols)).astype("float32")))
            )
            if scalar_take:
                e = bb.emit(relax.op.take(e, relax.const(1, "int64"), axis=0))
            y = bb.emit(relax.op.add(x, dq))
            z = bb.emit_output(relax.op.add(y, e))
        bb.emit_func_output(z)
    return bb.get()


def _fold_checked(mod: tvm.IRModule, cache) -> fgr.FoldResult:
    result = fgr.fold(mod, kernel_cache=cache)
    tvm.ir.assert_structural_equal(result.mod, relax.transform.FoldConstant()(mod))
    return result


def _libraries(root: Path):
    return sorted(root.glob("v3/*/libs/*.so"))


def test_second_fold_compiles_nothing(tmp_path):
    mod = _module()
    first = _fold_checked(mod, tmp_path)
    libraries = _libraries(tmp_path)
    second = _fold_checked(mod, tmp_path)
    assert (first.report.kernels_compiled, first.report.kernels_cached) == (3, 0)
    assert (second.report.kernels_compiled, second.report.kernels_cached) == (0, 3)
    assert "3 loaded from the kernel cache" in second.report.explain(verbose=False)
    # kernels built together share one library, whatever their optimization levels
    assert len(libraries) == 1
    assert _libraries(tmp_path) == libraries


def test_a_similar_model_reuses_the_kernels_it_shares(tmp_path):
    """Other weights of the same shapes: the same kernels (values are buffers, not immediates)."""
    _fold_checked(_module(seed=0), tmp_path)
    other = _fold_checked(_module(seed=1), tmp_path)
    assert (other.report.kernels_compiled, other.report.kernels_cached) == (0, 3)


@pytest.mark.slow
def test_a_fresh_process_finds_the_kernels(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_kernel_cache import _fold_checked, _module
        report = _fold_checked(_module(), sys.argv[1]).report
        print(report.kernels_compiled, report.kernels_cached)
        """
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        )
        for _ in range(2)
    ]
    assert [run.stdout.split() for run in runs] == [["3", "0"], ["0", "3"]]


@pytest.mark.slow
def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    for _ in range(2):
        result = _fold_checked(_module(), False)
        assert (result.report.kernels_compiled, result.report.kernels_cached) == (3, 0)
    assert not (tmp_path / "env").exists()
    for off in ("off", "0", ""):
        monkeypatch.setenv(CACHE_DIR_ENV, off)
        assert resolve_options().cache_dir is None


def test_environment_relocates_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    _fold_checked(_module(), None)
    assert len(_libraries(tmp_path / "elsewhere")) == 1
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_options().cache_dir == tmp_path / "xdg" / "fold_guard"


def test_the_pass_takes_the_cache_too(tmp_path):
    mod = _module()
    folded = fgr.FoldConstant(kernel_cache=tmp_path)(mod)
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(mod))
    assert len(_libraries(tmp_path)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_damaged_library_is_detected_and_rebuilt(tmp_path, damage):
    mod = _module()
    _fold_checked(mod, tmp_path)
    (library,) = _libraries(tmp_path)
    # Replaced, not written in place: this process has the library mapped, and writing into a
    # mapped file would crash it (the cache itself only ever renames complete files into place).
    damaged = library.with_suffix(".damaged")
    if damage == "truncate":
        damaged.write_bytes(library.read_bytes()[:100])
    elif damage == "garbage":
        damaged.write_bytes(b"\x7fELF" + os.urandom(2000))
    if damage == "delete":
        library.unlink()
    else:
        os.replace(damaged, library)
    rebuilt = _fold_checked(mod, tmp_path)
    assert (rebuilt.report.kernels_compiled, rebuilt.report.kernels_cached) == (3, 0)
    assert _fold_checked(mod, tmp_path).report.kernels_cached == 3


@pytest.mark.slow
def test_damaged_index_entry_is_rebuilt(tmp_path):
    mod = _module()
    _fold_checked(mod, tmp_path)
    entries = sorted(tmp_path.glob("v3/*/index/*.json"))
    entries[0].write_text("{not json")
    json.loads(entries[1].read_text())  # the others are intact
    result = _fold_checked(mod, tmp_path)
    assert (result.report.kernels_compiled, result.report.kernels_cached) == (1, 2)


@pytest.mark.slow
def test_size_bound_evicts_least_recently_used(tmp_path, monkeypatch):
    first, second = _module(8, 16), _module(5, 7)  # other shapes: other kernels
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, "1")
    _fold_checked(first, tmp_path)
    _fold_checked(second, tmp_path)
    assert len(_libraries(tmp_path)) == 1, "the bound keeps only the newest library"
    again = _fold_checked(first, tmp_path)
    assert (again.report.kernels_compiled, again.report.kernels_cached) == (3, 0)


def test_the_size_bound_counts_other_builds_and_older_layouts(tmp_path, monkeypatch):
    """Libraries an older fold_guard or TVM left (another build, the v1 layout) count toward the
    bound and, unused, go first: the directory stays bounded across upgrades."""
    stale = [tmp_path / "v1" / "old" / "libs" / "a.so", tmp_path / "v2" / "other" / "libs" / "b.so"]
    for path in stale:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\0" * (1 << 20))
        os.utime(path, (1, 1))  # used long ago
    unrelated = tmp_path / "notes" / "libs" / "c.so"
    unrelated.parent.mkdir(parents=True)
    unrelated.write_bytes(b"\0")
    _fold_checked(_module(), tmp_path)

    def ours():
        return [path for path in _libraries(tmp_path) if path not in stale]

    (first,) = ours()
    # room for our two libraries and one stale one (ours are far smaller than 1 MiB)
    bound = 2 * first.stat().st_size + (1 << 20) + 4096
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(bound))
    _fold_checked(_module(5, 7), tmp_path)  # other shapes: a second library of our build
    assert [path.exists() for path in stale] == [False, True], "the oldest goes first"
    assert len(ours()) == 2, "ours, recently used, stay"
    assert unrelated.exists(), "only the cache's libraries are counted and removed"


@pytest.mark.slow
def test_concurrent_processes_share_one_cache(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_kernel_cache import _fold_checked, _module
        _fold_checked(_module(), sys.argv[1])
        print("ok")
        """
    )
    argv = [sys.executable, "-c", script, str(tmp_path)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, [err for _, err in outputs]
    assert not list(tmp_path.glob("v3/*/*/.tmp-*")), "no temporary file is left behind"
    result = _fold_checked(_module(), tmp_path)
    assert (result.report.kernels_compiled, result.report.kernels_cached) == (0, 3)


def _any_prim_func() -> tvm.tirx.PrimFunc:
    legalized = relax.transform.LegalizeOps()(_module())
    return next(f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def test_key_covers_what_determines_the_code(tmp_path, monkeypatch):
    base = KernelCache(tmp_path, "llvm", max_bytes=1 << 30).dir
    func = _any_prim_func()
    digest = KernelCache.digest(func)
    assert KernelCache.key(digest, "llvm") != KernelCache.key(digest, QUICK_TARGET)
    assert KernelCache.digest(func.with_attr("global_symbol", "ours")) == digest
    assert KernelCache.digest(func.with_attr("tir.noalias", False)) != digest
    assert KernelCache(tmp_path, "llvm -opt-level=0", max_bytes=1).dir != base
    monkeypatch.setattr(tvm, "__version__", "0.27.0.other")
    assert KernelCache(tmp_path, "llvm", max_bytes=1).dir != base
    monkeypatch.undo()
    monkeypatch.setattr(kernel_cache, "FOLD_GUARD_VERSION", "0.0.0")
    assert KernelCache(tmp_path, "llvm", max_bytes=1).dir != base


def test_a_size_bound_that_is_not_a_number_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, "1G")
    with pytest.raises(PreconditionError, match="FOLD_GUARD_CACHE_MAX_BYTES='1G'"):
        resolve_options()


def test_a_cache_cannot_change_a_plan(tmp_path):
    """A legalizer registered over TVM's (a higher level) is what stock folds with, and so do we,
    with a cache that holds the kernels of TVM's own: the cache keeps code, never decisions.

    exp(B) with TVM's legalizer ==> cached;  exp registered as negate ==> folds as stock: -B
    """
    from tvm import topi

    mod = _module()
    _fold_checked(mod, tmp_path)
    op = tvm.ir.Op.get("relax.exp")
    original = op.get_attr("FLegalize")

    def negate_instead(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        return bb.call_te(topi.negative, call.args[0])

    tvm.ir.register_op_attr("relax.exp", "FLegalize", negate_instead, level=11)
    try:
        replaced = _fold_checked(mod, tmp_path)  # equal to stock, which negates
        assert (replaced.report.kernels_compiled, replaced.report.kernels_cached) == (1, 2)
    finally:
        op.reset_attr("FLegalize")
        tvm.ir.register_op_attr("relax.exp", "FLegalize", original)
    again = _fold_checked(mod, tmp_path)
    assert (again.report.kernels_compiled, again.report.kernels_cached) == (0, 3)
